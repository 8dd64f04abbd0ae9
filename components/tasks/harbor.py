"""Harbor tasks in and out: the field's task format, run in our sandbox (docs/tasks.md).

A Harbor task (the `harbor` package, successor of the Terminal-Bench format) is a folder:
`task.toml` (timeouts, resources, metadata), `instruction.md`, `environment/Dockerfile`
(and its build context), `tests/test.sh` (writes a reward to /logs/verifier/reward.txt
or reward.json), optional `solution/solve.sh`.

Import (`import_harbor_task`) maps one to a task folder:
  - environment/Dockerfile, read with dockerfile-parse: a Python base image (`python:3.X`,
    any variant), `pip install` / `uv pip install` of pinned packages, `COPY`/`ADD` of the
    build context into WORKDIR and `WORKDIR` itself become the task's repo/ (what the
    image has at WORKDIR) and environment (components/tasks/environments.py: that Python
    and those pins, built offline once, like a mined repository's). tests/Dockerfile's
    pins (Harbor's separate verifier image) join them: verification runs in the same
    environment. Anything the sandbox cannot honour is refused with one line naming it:
    another base image (apt packages, another language), any other RUN, ENV/USER/EXPOSE/
    VOLUME/HEALTHCHECK, a COPY from another image (except the `uv` installer binary) or
    from outside the context, an ADD from a URL, and in task.toml network access asked
    for, GPUs/TPUs, MCP servers (services), a prebuilt docker_image or a Windows OS.
  - tests/ goes to hidden_tests/.harbor-tests/ (hidden from the agent, protected);
  - solution/solve.sh is run once, in the sandbox, on a copy of repo/ at /app: what it
    changes is the task's reference.patch (the oracle's fix and the gate's check).
Verification (`run_verifier`, called by the verifier for a task that has
hidden_tests/.harbor-tests) runs test.sh in the sandbox (bubblewrap) the way Harbor does:
the agent's tree at WORKDIR (/app), the tests read-only at /tests and a fresh, empty
/logs/verifier; the reward file it leaves is the verdict (a pass needs reward 1).

Tampering rules, each with a test (tests/tasks/test_harbor.py):
  - the agent never sees the tests or /logs: they exist only in the verification run
    (a reward file written during the episode lands nowhere the verifier reads);
  - edits to .harbor-tests/ are tampering (protected path) and never taken;
  - test.sh runs under a trusted wrapper that reads the reward file only after test.sh has
    exited; a test.sh killed by a signal is a forged verdict (agent code that writes a
    reward and kills its harness), and so is any process still alive when test.sh exits
    (a process that would rewrite the reward after the harness wrote it): the wrapper
    kills them and the verdict fails, whatever the file says.
What is NOT protected: test.sh's own processes (pytest and the code under test) can write
/logs/verifier while they run, as in Harbor itself: a reward written by code under test
that test.sh does not overwrite counts. Harbor's template test.sh always writes the reward
after pytest returns, so that needs a test.sh that trusts what is there.

Export (`export_harbor_task`) writes one of our tasks as a Harbor task that harbor's own
TaskConfig model loads: the repo as the image's /app, the hidden tests under tests/ with a
test.sh that runs them and writes the reward; the hidden cases (hidden_cases.json) in
tests/ with tests/run_cases.py, which test.sh runs too (import takes them back); the
reference fix as solution/files/ and a solve.sh that copies them (python:X-slim images
have no `patch` or `git`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from components.tasks.generate import unified_diff
from components.tasks.task import (
    Task,
    TaskEnvironment,
    TaskFormatError,
    TaskMetadata,
    load_task,
    task_spec,
    write_task_folder,
)

HARBOR_TESTS = ".harbor-tests"  # hidden_tests/<this>/ holds Harbor's tests/
REWARD_FILES = ("reward.txt", "reward.json", "rewards.json")
WORKDIR = "/app"
# The Harbor format version export writes (task.toml schema_version).
SCHEMA_VERSION = "1.4"
PYTHON_IMAGE = re.compile(
    r"^(?:docker\.io/)?(?:library/)?python:(?P<version>3\.\d+)(?:\.\d+)?(?:-[a-z0-9.-]+)?$"
)
INSTALLER_IMAGES = ("ghcr.io/astral-sh/uv",)  # COPY --from them brings the installer only
IGNORED_INSTRUCTIONS = ("LABEL", "ARG", "CMD", "ENTRYPOINT", "SHELL", "STOPSIGNAL", "ONBUILD")
MARKER = "\nAGENTRL-HARBOR-VERDICT "


class HarborRefusal(ValueError):
    """A Harbor task the sandbox cannot honour; the message is one line saying why."""


@dataclass(frozen=True)
class HarborEnvironment:
    """What environment/Dockerfile asks for, as far as the sandbox can give it."""

    python: str
    requirements: tuple[str, ...]
    workdir: str
    copies: tuple[tuple[str, str], ...]  # (source in the build context, path under WORKDIR)


def is_harbor_task(task: Task) -> bool:
    return (task.hidden_tests_dir / HARBOR_TESTS / "test.sh").is_file()


# ----------------------------------------------------------------------------- reading


def _pins(command: list[str], where: str, context: Path) -> list[str]:
    """The requirements of one `pip install ...` command (pinned, or refused)."""
    pins: list[str] = []
    args = iter(command)
    for arg in args:
        if arg in ("-r", "--requirement"):
            path = context / next(args, "")
            if not path.is_file():
                raise HarborRefusal(f"{where}: requirements file {path.name} not in the context")
            pins += [ln.strip() for ln in path.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]  # fmt: skip
        elif arg.startswith("-"):
            continue  # --system, --no-cache-dir, -q: how to install, not what
        else:
            pins.append(arg)
    for pin in pins:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[^\s;]+", pin):
            raise HarborRefusal(f"{where}: {pin!r} is not a pinned package (name==version)")
    return pins


def _pip_command(words: list[str]) -> list[str] | None:
    """The arguments after `install` when `words` is a pip install, else None."""
    for prefix in (["pip", "install"], ["pip3", "install"], ["python", "-m", "pip", "install"],
                   ["python3", "-m", "pip", "install"], ["uv", "pip", "install"]):  # fmt: skip
        if words[: len(prefix)] == prefix:
            return words[len(prefix) :]
    return None


def read_dockerfile(path: Path, *, tests_image: bool = False) -> HarborEnvironment:
    """environment/Dockerfile (or tests/Dockerfile when `tests_image`: its COPY of the
    tests is Harbor's own) -> what the sandbox builds; HarborRefusal names the line."""
    from dockerfile_parse import DockerfileParser

    context = path.parent
    parser = DockerfileParser(fileobj=open(path, "rb"))  # noqa: SIM115 - parser keeps it
    python, workdir = None, WORKDIR
    requirements: list[str] = []
    copies: list[tuple[str, str]] = []
    for ins in parser.structure:
        kind, value = ins["instruction"], ins["value"].strip()
        where = f"{path.parent.name}/Dockerfile line {ins['startline'] + 1} ({kind})"
        if kind == "FROM":
            m = PYTHON_IMAGE.match(value.split()[0])
            if python is not None:
                raise HarborRefusal(f"{where}: a multi-stage build cannot run in the sandbox")
            if m is None:
                raise HarborRefusal(
                    f"{where}: base image {value!r} is not a Python image; the sandbox runs "
                    "Python environments only (no apt packages, services or other languages)"
                )
            python = m["version"]
        elif kind == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / value)
        elif kind == "RUN":
            for part in re.split(r"\s*(?:&&|;)\s*", value):
                words = shlex.split(part)
                pip = _pip_command(words) if words else []
                if pip is None:
                    raise HarborRefusal(f"{where}: {part!r}: the sandbox installs pinned Python "
                                        "packages only (no system packages or network)")  # fmt: skip
                requirements += _pins(pip, where, context)
        elif kind in ("COPY", "ADD"):
            words = shlex.split(value)
            sources, dest = words[:-1], words[-1]
            source_image = next(
                (w.split("=", 1)[1] for w in sources if w.startswith("--from=")), None
            )
            sources = [w for w in sources if not w.startswith("--")]
            if source_image is not None:
                if not source_image.startswith(INSTALLER_IMAGES):
                    raise HarborRefusal(f"{where}: copies from another image ({source_image})")
                continue  # the uv binary: we install with pip
            if tests_image:
                continue  # tests/Dockerfile copies the tests: Harbor's /tests, ours too
            target = PurePosixPath(workdir) / dest
            if not (target == PurePosixPath(workdir) or PurePosixPath(workdir) in target.parents):
                raise HarborRefusal(f"{where}: copies to {target}, outside WORKDIR {workdir}")
            for src in sources:
                if "://" in src:
                    raise HarborRefusal(f"{where}: {src} is a download (no network)")
                resolved = (context / src).resolve()
                if resolved != context.resolve() and context.resolve() not in resolved.parents:
                    raise HarborRefusal(f"{where}: {src} is outside the build context")
                rel = target.relative_to(workdir).as_posix()
                copies.append((src, "" if rel == "." else rel))
        elif kind not in IGNORED_INSTRUCTIONS:
            raise HarborRefusal(f"{where}: {kind} cannot be honoured by the sandbox")
    if python is None:
        raise HarborRefusal(f"{path}: no FROM line")
    return HarborEnvironment(python, tuple(requirements), workdir, tuple(copies))


def _check_toml(config: dict, where: str) -> None:
    env = config.get("environment") or {}
    for phase in ("environment", "agent", "verifier"):
        section = config.get(phase) or {}
        if section.get("network_mode") not in (None, "no-network") or section.get("allow_internet"):
            raise HarborRefusal(f"{where}: [{phase}] asks for network access; the sandbox has none")
    for key, why in (("gpus", "GPUs"), ("tpu", "TPUs"), ("mcp_servers", "MCP servers (services)"),
                     ("docker_image", "a prebuilt image"), ("healthcheck", "a service healthcheck")):  # fmt: skip
        if env.get(key):
            raise HarborRefusal(f"{where}: [environment] {key}: {why} cannot run in the sandbox")
    if env.get("os", "linux") != "linux":
        raise HarborRefusal(f"{where}: [environment] os = {env['os']!r}: the sandbox is Linux")
    if (config.get("verifier") or {}).get("environment"):
        raise HarborRefusal(f"{where}: [verifier] environment: a separate verifier image")


def _repo_files(env: HarborEnvironment, context: Path) -> dict[str, bytes]:
    """{path under WORKDIR: bytes} of what the Dockerfile copies there."""
    files: dict[str, bytes] = {}
    for src, dest in env.copies:
        source = context / src
        if source.is_dir():
            for p in sorted(source.rglob("*")):
                rel = p.relative_to(source).as_posix()
                if p.is_file() and rel != "Dockerfile" and not rel.startswith(".git/"):
                    files[str(PurePosixPath(dest) / rel) if dest else rel] = p.read_bytes()
        elif source.is_file():
            name = dest if dest and not dest.endswith("/") else f"{dest}{source.name}"
            files[name.lstrip("/")] = source.read_bytes()
        else:
            raise HarborRefusal(f"environment/Dockerfile: COPY {src}: not in the build context")
    return files


def import_harbor_task(src: Path, dest_root: Path, *, split: str = "test") -> Path:
    """One Harbor task folder -> a task folder in dest_root (without reference.patch:
    `add_reference_from_solution` runs solve.sh in the sandbox). HarborRefusal: why not."""
    where = src.name
    if not (src / "task.toml").is_file():
        raise HarborRefusal(f"{where}: no task.toml")
    try:
        config = tomllib.loads((src / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise HarborRefusal(f"{where}: task.toml is not TOML ({e})") from e
    _check_toml(config, f"{where}/task.toml")
    if not (src / "tests" / "test.sh").is_file():
        raise HarborRefusal(f"{where}: no tests/test.sh")
    if not (src / "environment" / "Dockerfile").is_file():
        raise HarborRefusal(f"{where}: no environment/Dockerfile")
    env = read_dockerfile(src / "environment" / "Dockerfile")
    requirements = list(env.requirements)
    if (src / "tests" / "Dockerfile").is_file():
        requirements += read_dockerfile(src / "tests" / "Dockerfile", tests_image=True).requirements
    if env.workdir != WORKDIR:
        raise HarborRefusal(f"{where}: WORKDIR {env.workdir}: only {WORKDIR} is mapped")
    repo = _repo_files(env, src / "environment")
    if not repo:
        raise HarborRefusal(f"{where}: the Dockerfile copies no files into {WORKDIR}")
    task_id = re.sub(r"[^A-Za-z0-9._-]", "-", where)
    meta = config.get("metadata") or {}
    folder = dest_root / task_id
    for rel, data in repo.items():  # bytes as the image has them (write_task_folder writes text)
        (folder / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "repo" / rel).write_bytes(data)
    write_task_folder(
        folder,
        task_id=task_id,
        instruction=(src / "instruction.md").read_text()
        if (src / "instruction.md").is_file()
        else "",
        metadata=TaskMetadata(
            family=str(meta.get("category") or "harbor"),
            bug_class=str(meta.get("bug_class") or "harbor"),
            split=meta.get("split") if meta.get("split") in ("train", "val", "test") else split,
            source="harbor",
            extra={"harbor": {"task_toml": config, "workdir": env.workdir}},
        ),
        repo_files={},
        hidden_test_files={
            f"{HARBOR_TESTS}/{p.relative_to(src / 'tests').as_posix()}": p.read_text()
            for p in sorted((src / "tests").rglob("*"))
            if p.is_file()
        },  # fmt: skip
        test_command=("python", "-m", "pytest", "-q"),
        protected_paths=(f"{HARBOR_TESTS}/",),
    )
    if (src / "tests" / CASES_FILE).is_file():  # an agentrl export's hidden cases, back
        shutil.copy(src / "tests" / CASES_FILE, folder / CASES_FILE)
    if (src / "solution").is_dir():
        shutil.copytree(src / "solution", folder / "solution")
    _write_environment(folder, env.python, requirements)
    return folder


def _write_environment(folder: Path, python: str, requirements: list[str]) -> None:
    """The task's environment in task.json; none when the project's interpreter is that
    Python and nothing beyond the harness (pytest) is asked for."""
    from components.tasks.environments import HARNESS_DISTRIBUTIONS

    extra = [
        r for r in requirements if re.split(r"[=\[]", r)[0].lower() not in HARNESS_DISTRIBUTIONS
    ]
    if python == f"{sys.version_info[0]}.{sys.version_info[1]}" and not extra:
        return
    task = load_task(folder)
    task = dataclasses.replace(task, environment=TaskEnvironment(python, tuple(requirements)))
    (folder / "task.json").write_text(json.dumps(task_spec(task), indent=2) + "\n")


# ----------------------------------------------------------------------------- running

# Runs inside the sandbox (python -I): test.sh, then whatever outlived it is killed and
# counted, then the reward files are read and printed after the marker (last line).
_WRAPPER = r"""
import json, os, signal, subprocess, sys, time
env = dict(os.environ)
if sys.argv[1] == "own-plugins":  # a task environment: its plugins (pytest-json-ctrf) are its own
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None); env.pop("PYTEST_PLUGINS", None)
# /tests is read-only: pytest's cache there would fail loudly (and read as a refused write)
env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p no:cacheprovider").strip()
rc = subprocess.call(["bash", "/tests/test.sh"], env=env, cwd="/app")
def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
keep, pid = {1, os.getpid()}, os.getpid()
while pid > 1:
    pid = parent(pid); keep.add(pid)
def alive():
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in keep:
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        out.append(int(d))
            except OSError:
                pass
    return out
survivors = alive()
for _ in range(50):
    for p in alive():
        try: os.kill(p, signal.SIGKILL)
        except OSError: pass
    if not alive(): break
    time.sleep(0.02)
rewards = {}
for name in ("reward.txt", "reward.json", "rewards.json"):
    try:
        with open("/logs/verifier/" + name, errors="replace") as f:
            rewards[name] = f.read(4096)
    except OSError:
        pass
sys.stdout.flush()
print("\nAGENTRL-HARBOR-VERDICT " + json.dumps({"rc": rc, "survivors": len(survivors), "rewards": rewards}), flush=True)
"""


@dataclass
class HarborRun:
    """What one run of a Harbor task's test.sh gave."""

    passed: bool
    reward: float | None
    forged: list[str]
    lost: str
    command: object  # the sandbox's CommandResult
    detail: str


def _reward(rewards: dict[str, str]) -> tuple[float | None, str]:
    """(reward, problem) from the files test.sh left; reward.txt first, as Harbor reads."""
    if "reward.txt" in rewards:
        try:
            return float(rewards["reward.txt"].strip()), ""
        except ValueError:
            return None, f"reward.txt is not a number: {rewards['reward.txt'][:40]!r}"
    for name in ("reward.json", "rewards.json"):
        if name in rewards:
            try:
                data = json.loads(rewards[name])
            except ValueError:
                return None, f"{name} is not JSON"
            values = [data] if isinstance(data, int | float) else (
                [data["reward"]] if isinstance(data, dict) and "reward" in data
                else list(data.values()) if isinstance(data, dict) else [])  # fmt: skip
            if values and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values
            ):
                return float(min(values)), ""
            return None, f"{name} holds no numeric reward"
    return None, "test.sh wrote no reward file (/logs/verifier/reward.txt or reward.json)"


def run_verifier(task: Task, tree: Path, cfg) -> HarborRun:
    """Run the task's tests/test.sh on `tree` (the agent's repo as verification builds it)
    with Harbor's layout; see the module doc for what makes the verdict trustworthy."""
    from components.sandbox.config import SandboxError
    from components.sandbox.process import run_sandboxed

    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-") as tmp:
        ws, tests = Path(tmp) / "ws", Path(tmp) / "tests"
        shutil.copytree(tree, ws / "app", symlinks=True,
                        ignore=shutil.ignore_patterns(HARBOR_TESTS))  # fmt: skip
        shutil.copytree(task.hidden_tests_dir / HARBOR_TESTS, tests)  # the task's own copy
        (ws / "logs").mkdir()
        mounts = ((str(ws / "app"), WORKDIR, True), (str(tests), "/tests", False),
                  (str(ws / "logs"), "/logs/verifier", True))  # fmt: skip
        plugins = "own-plugins" if task.environment is not None else "harness-plugins"
        try:
            cmd = run_sandboxed(["python", "-I", "-c", _WRAPPER, plugins], WORKDIR, cfg,
                                workspace=ws, mounts=mounts)  # fmt: skip
        except SandboxError as e:
            raise RuntimeError(f"{task.id}: Harbor verification needs bubblewrap: {e}") from e
    out = cmd.output
    detail = out[-2000:]
    if cmd.limit_hit not in (None, "output") or MARKER not in out:
        why = cmd.limit_hit or f"exit code {cmd.exit_code}"
        return HarborRun(False, None, [], f"Harbor's test.sh gave no verdict ({why})", cmd, detail)
    try:
        verdict = json.loads(out[out.rfind(MARKER) + len(MARKER) :].splitlines()[0])
    except (ValueError, IndexError):
        return HarborRun(False, None, [], "the Harbor verdict line is damaged", cmd, detail)
    forged = []
    if verdict["rc"] < 0 or verdict["rc"] >= 128:
        forged.append(f"test.sh was killed (exit {verdict['rc']}): its reward is not its own")
    if verdict["survivors"]:
        forged.append(
            f"{verdict['survivors']} process(es) outlived test.sh (could rewrite the reward)"
        )
    reward, problem = _reward(verdict["rewards"])
    if problem and not forged:
        return HarborRun(False, None, [], problem, cmd, detail)
    passed = not forged and reward is not None and reward >= 1.0
    return HarborRun(passed, reward, forged, "", cmd, f"reward {reward}; {detail}")


def add_reference_from_solution(folder: Path, cfg) -> str | None:
    """Run solution/solve.sh in the sandbox on a copy of repo/ at /app and write what it
    changed as reference.patch; returns the patch (None without a solution)."""
    from components.sandbox.process import run_sandboxed

    solve = folder / "solution" / "solve.sh"
    if not solve.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-solve-") as tmp:
        ws = Path(tmp) / "ws"
        shutil.copytree(folder / "repo", ws / "app", symlinks=True)
        mounts = ((str(ws / "app"), WORKDIR, True), (str(folder / "solution"), "/solution", False))
        cfg = dataclasses.replace(cfg, allowed_programs=(*cfg.allowed_programs, "bash"))
        cmd = run_sandboxed(["bash", "/solution/solve.sh"], WORKDIR, cfg, workspace=ws,
                            mounts=mounts)  # fmt: skip
        if cmd.exit_code != 0:
            raise HarborRefusal(f"{folder.name}: solution/solve.sh failed (exit {cmd.exit_code}): "
                                f"{cmd.output.strip().splitlines()[-1:] }")  # fmt: skip
        patch = _diff(folder / "repo", ws / "app")
    if not patch:
        raise HarborRefusal(f"{folder.name}: solution/solve.sh changes nothing under {WORKDIR}")
    (folder / "reference.patch").write_text(patch)
    task = dataclasses.replace(load_task(folder), has_reference=True)
    (folder / "task.json").write_text(json.dumps(task_spec(task), indent=2) + "\n")
    return patch


def _diff(old: Path, new: Path) -> str:
    def files(root: Path) -> dict[str, str]:
        return {p.relative_to(root).as_posix(): p.read_text(errors="replace")
                for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip

    a, b = files(old), files(new)
    parts = []
    for rel in sorted(set(a) | set(b)):
        if a.get(rel) != b.get(rel):
            diff = unified_diff(rel, a.get(rel, ""), b.get(rel, ""))
            if rel not in a:
                diff = diff.replace(f"--- a/{rel}", "--- /dev/null", 1)
            if rel not in b:
                diff = diff.replace(f"+++ b/{rel}", "+++ /dev/null", 1)
            parts.append(diff)
    return "".join(parts)


# ----------------------------------------------------------------------------- writing

_TEST_SH = """#!/bin/bash
# Written by agentrl: put the hidden tests over the agent's /app, run them, write the reward.
cp -r /tests/hidden/. /app/
cd /app
if {command}; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
CASES_FILE = "hidden_cases.json"  # tests/<this>: the task's hidden cases, as we keep them
CASES_RUNNER = "run_cases.py"  # tests/<this>: test.sh runs it after the hidden tests pass

# tests/run_cases.py of an exported task with hidden cases: the verifier's hidden-case
# check (components/verifier/__init__.py) without agentrl. Each case is called in a child
# process that is given only the arguments; the expected values stay in this process and
# are compared here with exact types (3 != 3.0 != True), so an object whose __eq__ always
# says yes, or code that patches pytest, does not pass a case.
_RUN_CASES = r'''# Written by agentrl: the task's hidden cases (hidden_cases.json beside this file).
import ast, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import ast, importlib, importlib.util, json, os, signal, sys
token, module_file, function = sys.argv[1:4]
calls = json.loads(sys.stdin.read())
PLAIN = (int, float, complex, str, bytes, bool, type(None))
def check(x, depth=0):
    t = type(x)
    if depth > 64 or t not in PLAIN + (list, tuple, set, frozenset, dict):
        raise TypeError(t.__name__)
    if t is dict:
        for k, v in x.items():
            check(k, depth + 1); check(v, depth + 1)
    elif t not in PLAIN:
        for y in x:
            check(y, depth + 1)
def on_alarm(*_):
    raise TimeoutError("case timed out")
signal.signal(signal.SIGALRM, on_alarm)
def load(path):
    parts = path[:-3].split("/")
    k = len(parts) - 1
    while k > 0 and os.path.isfile("/".join(parts[:k]) + "/__init__.py"):
        k -= 1
    if k < len(parts) - 1:
        sys.path.append("/".join(parts[:k]) or ".")
        return importlib.import_module(".".join(parts[k:]).removesuffix(".__init__"))
    spec = importlib.util.spec_from_file_location("module_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
sys.path.append(".")
out = []
try:
    signal.alarm(30)
    module = load(module_file)
    signal.alarm(0)
except BaseException as e:
    module = e
for args in calls:
    try:
        if isinstance(module, BaseException):
            raise module
        signal.alarm(10)
        try:
            value = getattr(module, function)(*ast.literal_eval(args))
        finally:
            signal.alarm(0)
        check(value)
        out.append({"repr": repr(value)})
    except BaseException as e:
        out.append({"error": type(e).__name__})
sys.stdout.write("\\n" + token + " " + json.dumps(out) + "\\n")
sys.stdout.flush()
os._exit(0)
"""


def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def main():
    with open(os.path.join(HERE, "hidden_cases.json")) as f:
        spec = json.load(f)
    token = "AGENTRL-CASES-" + os.urandom(8).hex()
    calls = [c["args"] for c in spec["cases"]]
    try:
        run = subprocess.run([sys.executable, "-c", CHILD, token, spec["module"],
                              spec["function"]], input=json.dumps(calls), capture_output=True,
                             text=True, timeout=60 + 11 * len(calls))
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith(token + " ")]
        results = json.loads(lines[-1][len(token) + 1:]) if lines else []
    except (subprocess.TimeoutExpired, ValueError):
        results = []
    failed = 0
    for n, case in enumerate(spec["cases"]):
        got = results[n] if n < len(results) else {"error": "no result"}
        try:
            ok = "repr" in got and same(ast.literal_eval(got["repr"]),
                                        ast.literal_eval(case["expected"]))
        except Exception:
            ok = False
        if not ok:
            failed += 1
            print(("hidden case %d: %s%s: expected %s, got %s" % (
                n + 1, spec["function"], case["args"], case["expected"],
                got.get("repr", got.get("error"))))[:300])
    print("hidden cases: %d of %d passed" % (len(spec["cases"]) - failed, len(spec["cases"])))
    sys.exit(1 if failed or not spec["cases"] else 0)


main()
'''


def _fixed_files(task: Task, patch: str) -> tuple[dict[str, bytes], list[str]]:
    """({path: bytes} the reference fix writes, [paths it deletes]) under repo/."""
    from components.tasks.patching import apply_unified_diff

    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-export-") as tmp:
        fixed = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, fixed, symlinks=True)
        changed = apply_unified_diff(fixed, patch)
        written = {rel: (fixed / rel).read_bytes() for rel in changed if (fixed / rel).is_file()}
    return written, [rel for rel in changed if rel not in written]


def _write_solution(out: Path, task: Task, patch: str) -> None:
    """solution/: the fixed files themselves and a solve.sh that copies them over /app
    (and removes what the fix deletes). No `patch` or `git`: python:X-slim images ship
    neither; `cp`/`rm` are in every image. reference.patch rides along for readers."""
    written, deleted = _fixed_files(task, patch)
    (out / "solution" / "files").mkdir(parents=True)
    (out / "solution" / "reference.patch").write_text(patch)
    for rel, data in written.items():
        (out / "solution" / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "solution" / "files" / rel).write_bytes(data)
    lines = ["#!/bin/bash", "# Written by agentrl: the reference fix (solution/files/ over "
             f"{WORKDIR}; reference.patch is the same fix as a diff).", "set -e",
             f"cp -r /solution/files/. {WORKDIR}/"]  # fmt: skip
    lines += [f"rm -f {shlex.quote(f'{WORKDIR}/{rel}')}" for rel in deleted]
    (out / "solution" / "solve.sh").write_text("\n".join(lines) + "\n")


def export_harbor_task(task: Task, dest: Path) -> Path:
    """Write `task` as a Harbor task folder dest/<id>/; returns it. Its hidden cases
    (hidden_cases.json: mined and imported tasks) go to tests/ with tests/run_cases.py,
    which test.sh runs after the hidden tests; the import of the export takes them back."""
    from importlib.metadata import version

    out = dest / task.id
    (out / "environment").mkdir(parents=True)
    shutil.copytree(task.repo_dir, out / "environment" / "app", symlinks=True)
    env = task.environment
    python = env.python if env is not None else f"{sys.version_info[0]}.{sys.version_info[1]}"
    pins = [f"pytest=={version('pytest')}", f"pytest-timeout=={version('pytest-timeout')}",
            *(env.requirements if env is not None else ())]  # fmt: skip
    (out / "environment" / "Dockerfile").write_text(
        f"FROM python:{python}-slim\n\nRUN pip install --no-cache-dir {' '.join(pins)}\n\n"
        f"WORKDIR {WORKDIR}\n\nCOPY app/ {WORKDIR}/\n"
    )
    shutil.copytree(task.hidden_tests_dir, out / "tests" / "hidden")
    if task.verify_command is not None:
        command = shlex.join(task.verify_command)
    else:
        command = shlex.join(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              *task.hidden_test_files()])  # fmt: skip
    if task.hidden_cases_path is not None:
        shutil.copy(task.hidden_cases_path, out / "tests" / CASES_FILE)
        (out / "tests" / CASES_RUNNER).write_text(_RUN_CASES)
        command += f" && python /tests/{CASES_RUNNER}"
    (out / "tests" / "test.sh").write_text(_TEST_SH.format(command=command))
    (out / "instruction.md").write_text(task.instruction)
    patch = task.reference_patch()
    if patch is not None:
        _write_solution(out, task, patch)
    m = task.metadata
    (out / "task.toml").write_text(_toml({
        "schema_version": SCHEMA_VERSION,
        "metadata": {"agentrl_id": task.id, "category": m.family, "bug_class": m.bug_class,
                     "split": m.split, "source": m.source},
        "verifier": {"timeout_sec": 600.0, "network_mode": "no-network"},
        "agent": {"timeout_sec": 1800.0, "network_mode": "no-network"},
        "environment": {"build_timeout_sec": 600.0, "network_mode": "no-network"},
    }))  # fmt: skip
    return out


def _toml(doc: dict) -> str:
    """The small TOML export needs (strings, floats, one level of tables)."""

    def value(v) -> str:
        return json.dumps(v) if isinstance(v, str) else repr(v)

    lines = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for table, items in ((k, v) for k, v in doc.items() if isinstance(v, dict)):
        lines += ["", f"[{table}]", *(f"{k} = {value(v)}" for k, v in items.items())]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- import


_FETCHES = re.compile(r"\b(apt-get|apt|apk|yum|curl|wget|uvx|pip3?|uv)\b\s")


def _check_test_sh(path: Path, where: str) -> None:
    """Refuse a test.sh that installs or downloads at verification time (no network)."""
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        code = line.split("#", 1)[0]
        if m := _FETCHES.search(code):
            raise HarborRefusal(f"{where}: tests/test.sh line {n} runs {m[1]!r}: installing or "
                                "downloading at verification needs a network the sandbox has not")  # fmt: skip


def _tree_with_patch(task: Task, dest: Path) -> Path:
    from components.tasks.patching import apply_unified_diff

    shutil.copytree(task.repo_dir, dest, symlinks=True)
    if task.reference_patch() is not None:
        apply_unified_diff(dest, task.reference_patch())
    shutil.copytree(task.hidden_tests_dir, dest, dirs_exist_ok=True)
    return dest


def determinism_problem(task: Task, cfg, runs: int = 3) -> str | None:
    """None when the buggy repo fails and the reference fix passes in each of `runs` runs
    of test.sh; else what differed."""
    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-gate-") as tmp:
        buggy = Path(tmp) / "buggy"
        shutil.copytree(task.repo_dir, buggy, symlinks=True)
        shutil.copytree(task.hidden_tests_dir, buggy, dirs_exist_ok=True)
        trees = {"buggy": buggy}
        if task.has_reference:
            trees["solution"] = _tree_with_patch(task, Path(tmp) / "solution")
        for name, tree in trees.items():
            got = [run_verifier(task, tree, cfg) for _ in range(runs)]
            rewards = [(r.reward, r.lost, tuple(r.forged)) for r in got]
            if len(set(rewards)) > 1:
                return f"{name} state gives different results over {runs} runs: {rewards}"
            if got[0].lost or got[0].forged:
                return f"{name} state: {got[0].lost or got[0].forged[0]}"
            if got[0].passed != (name == "solution"):
                return f"{name} state {'passes' if got[0].passed else 'fails'} (reward {got[0].reward})"
    return None


def convert_harbor(
    src: Path, staging: Path, cfg, runs: int = 3, wheelhouse: str = ""
) -> tuple[list[Path], list[str]]:
    """Every Harbor task under `src` (src itself when it holds task.toml) -> task folders in
    staging, each solution turned into reference.patch and each checked deterministic over
    `runs` runs; returns (folders, one-line refusal per task not converted)."""
    from components.tasks.environments import (
        PrepareConfig,
        TaskEnvironmentError,
        prepare_environments,
        task_python_env,
    )

    roots = [src] if (src / "task.toml").is_file() else sorted(
        p.parent for p in src.glob("*/task.toml"))  # fmt: skip
    folders, errors = [], []
    for root in roots:
        try:
            _check_test_sh(root / "tests" / "test.sh", root.name)
            folder = import_harbor_task(root, staging)
            task = load_task(folder)
            task_cfg = cfg
            if task.environment is not None:  # built now (registry or wheelhouse), like `prepare`
                (built,) = prepare_environments([task], PrepareConfig(
                    cache_dir=cfg.environments_dir, wheelhouse=wheelhouse))  # fmt: skip
                if built.error:
                    raise HarborRefusal(f"{root.name}: environment: {built.error.splitlines()[0]}")
                path = task_python_env(task, cfg.environments_dir)
                task_cfg = dataclasses.replace(cfg, python_env=path)
            add_reference_from_solution(folder, task_cfg)
            problem = determinism_problem(load_task(folder), task_cfg, runs)
            if problem:
                raise HarborRefusal(f"{root.name}: {problem}")
        except (HarborRefusal, TaskEnvironmentError, TaskFormatError) as e:
            errors.append(str(e).splitlines()[0])
            shutil.rmtree(staging / re.sub(r"[^A-Za-z0-9._-]", "-", root.name), ignore_errors=True)
            continue
        folders.append(folder)
    if not roots:
        errors.append(f"{src}: no Harbor task (no task.toml in it or its subfolders)")
    return folders, errors
