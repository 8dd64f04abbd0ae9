"""Harbor tasks in and out: the field's task format, run in our sandbox (docs/tasks.md).

A Harbor task (the `harbor` package, successor of the Terminal-Bench format) is a folder:
`task.toml` (timeouts, resources, metadata), `instruction.md`, `environment/Dockerfile`
(and its build context), `tests/test.sh` (writes a reward to /logs/verifier/reward.txt
or reward.json), optional `solution/solve.sh`.

Import is harbor_import.py (`import_harbor_task`, `convert_harbor`), export
harbor_export.py (`export_harbor_task`); this module holds the format's names and runs
a Harbor task's verifier in our sandbox.

Verification (`run_verifier`, called by the verifier for a task that has
hidden_tests/.harbor-tests) runs test.sh in the sandbox (bubblewrap) the way Harbor does:
the agent's tree at WORKDIR (/app), the tests read-only at /tests and a fresh, empty
/logs/verifier; the reward file it leaves is the verdict (a pass needs reward 1).

Tampering rules, each with a test (tests/tasks/test_harbor.py, test_harbor_owned.py):
  - the agent never sees the tests or /logs: they exist only in the verification run
    (a reward file written during the episode lands nowhere the verifier reads);
  - edits to .harbor-tests/ are tampering (protected path) and never taken;
  - test.sh runs under a trusted wrapper; a test.sh killed by a signal is a forged verdict
    (agent code that writes a reward and kills its harness), and so is any process still
    alive when test.sh exits (a process that would rewrite the reward after the harness
    wrote it): the wrapper kills them and the verdict fails, whatever the file says;
  - the reward files are read by the host after the sandbox is gone, never following a
    link: a reward name that is not a regular file (a folder, symlink, FIFO), a reward file
    test.sh could not have overwritten (read-only, linked, the folder's permissions
    changed) and two reward files that disagree (reward.txt 0 beside a reward.json 1) are
    a forged verdict (issue 44);
  - the hidden cases (an agentrl export's hidden_cases.json) are never mounted: /tests has
    no expected value, its run_cases.py is a stand-in, and when test.sh's reward passed the
    verifier runs the cases itself (`_cases_check`), in a fresh copy of the tree in a
    sandbox of its own given the arguments only, and compares here with exact types; a
    reward 1 whose cases fail is a forged verdict, as in components/verifier/verdict.py;
  - with a reference fix (what solution/solve.sh changes), a reward 1 is followed by
    differential cases (components/verifier/hidden_cases.py): each repository function
    the tests call with literal arguments, on arguments drawn for the task that test.sh
    never shows, answered by the reference fix outside any run of the agent's code; a
    lookup of every value test.sh checks, with the bug left elsewhere, fails them
    (a forged verdict);
  - the harness's modules cannot be shadowed: test.sh's interpreters run with
    PYTHONSAFEPATH (no current folder ahead of the harness's plugins under `python -m
    pytest`), and a file or folder named after one of them (RESERVED_MODULES:
    agentrl_cpu_timeout, agentrl_limits, pytest_timeout, ...) in the tree is tampering,
    never copied, and a forged verdict; one that appears while test.sh runs is too.
A test.sh stopped by the sandbox's time limit has failed (code under test that loops):
a verdict that carries the limit (never cached), not a missing one; on a machine so loaded
that a correct tree runs out of time, that is a false fail, which the limit names.
What is NOT protected: test.sh's own processes (pytest and the code under test) share a
user and the verdict folder, so code under test can still write a reward file while they
run: it counts only when test.sh writes nothing itself and no other rule above fires (a
test.sh that writes its reward only on success trusts what is there). An interpreter start
that sets its own path (`python -I`, an explicit PYTHONPATH) is test.sh's own choice.
PYTHONSAFEPATH also means a test that imports the app must say where it is (pytest's
`pythonpath`, or sys.path as Harbor's template does).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from components import shutdown
from components.sandbox.environ import HARNESS_PLUGINS
from components.tasks.generate import unified_diff
from components.tasks.task import (
    Task,
    load_task,
    task_spec,
)

HARBOR_TESTS = ".harbor-tests"  # hidden_tests/<this>/ holds Harbor's tests/
REWARD_FILES = ("reward.txt", "reward.json", "rewards.json")
# An exported test.sh moves a reward file it did not write aside under this prefix (and
# writes reward 0): the host reads that as a forged verdict (harbor_export.py).
SET_ASIDE = "not-from-test-sh-"
WORKDIR = "/app"
# The Harbor format version export writes (task.toml schema_version).
SCHEMA_VERSION = "1.4"


MARKER = "\nAGENTRL-HARBOR-VERDICT "
# The sandbox's time limits: test.sh stopped by one has failed (code under test that loops).
TIME_LIMITS = ("wall_time", "cpu_time")


class HarborRefusal(ValueError):
    """A Harbor task the sandbox cannot honour; the message is one line saying why."""


def is_harbor_task(task: Task) -> bool:
    return (task.hidden_tests_dir / HARBOR_TESTS / "test.sh").is_file()


def _harbor_meta(task: Task) -> dict:
    meta = task.metadata.extra.get("harbor")
    return meta if isinstance(meta, dict) else {}


def task_workdir(task: Task) -> str:
    """Where the task's Dockerfile puts the tree (its WORKDIR; /app when it said none)."""
    workdir = _harbor_meta(task).get("workdir")
    return workdir if isinstance(workdir, str) and workdir.startswith("/") else WORKDIR


def task_env(task: Task) -> dict[str, str]:
    """The Dockerfile's ENV, as test.sh runs with it."""
    env = _harbor_meta(task).get("env")
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items()}


CASES_FILE = "hidden_cases.json"  # tests/<this>: the task's hidden cases, as we keep them
CASES_RUNNER = "run_cases.py"  # tests/<this>: test.sh runs it (export; a stand-in here)


# ----------------------------------------------------------------------------- running

# Modules of the harness (its plugins, pytest-timeout, pytest and what runs at interpreter
# start): a file or folder of that name in the agent's tree could replace them.
RESERVED_MODULES = tuple(
    sorted({p.stem for p in HARNESS_PLUGINS.glob("*.py")} | {"pytest_timeout", "pytest",
           "_pytest", "pluggy", "iniconfig", "sitecustomize", "usercustomize"})
)  # fmt: skip
_CASES_STAND_IN = (
    "# Written by agentrl's verifier: the hidden cases are run by the verifier itself, in\n"
    "# its own sandbox with the arguments only (components/tasks/harbor.py).\n"
    "import sys\nsys.stdin.close()\nprint('hidden cases: run by the verifier')\n"
)

# Runs inside the sandbox (python -I): test.sh under a safe path (PYTHONSAFEPATH: no
# `python -m pytest` puts /app ahead of the harness's plugins), then whatever outlived it
# is killed and counted, and the verdict line is printed last. The reward files are read
# afterwards by the host, from the folder the sandbox has left.
_WRAPPER = r"""
import json, os, signal, subprocess, sys, time
env = dict(os.environ)
env.update(json.loads(sys.argv[2]))  # the Dockerfile's ENV (harbor_dockerfile.py checked the names)
if sys.argv[1] == "own-plugins":  # a task environment: its plugins (pytest-json-ctrf) are its own
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None); env.pop("PYTEST_PLUGINS", None)
# /tests is read-only: pytest's cache there would fail loudly (and read as a refused write)
env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p no:cacheprovider").strip()
env["PYTHONSAFEPATH"] = "1"
rc = subprocess.call(["bash", "/tests/test.sh"], env=env, cwd=sys.argv[3])
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
sys.stdout.flush()
print("\nAGENTRL-HARBOR-VERDICT " + json.dumps({"rc": rc, "survivors": len(survivors)}), flush=True)
"""

# The hidden-case child (also tests/run_cases.py's, harbor_export.py): the code under test
# called on the arguments only, one plain-value repr per case on the token's line. The
# expected values are never in its process. Usage: python -c CASE_CHILD TOKEN MODULE_FILE
# FUNCTION [CALLS_FILE] (the calls, a JSON list of argument tuples' reprs, else on stdin).
CASE_CHILD = r"""
import ast, importlib, importlib.util, json, os, signal, sys
token, module_file, function = sys.argv[1:4]
calls = json.loads(open(sys.argv[4]).read() if len(sys.argv) > 4 else sys.stdin.read())
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
sys.stdout.write("\n" + token + " " + json.dumps(out) + "\n")
sys.stdout.flush()
os._exit(0)
"""


@dataclass
class HarborRun:
    """What one run of a Harbor task's test.sh (and its hidden cases) gave."""

    passed: bool
    reward: float | None
    forged: list[str]
    lost: str
    command: object  # the sandbox's CommandResult (the hidden cases' when they lost it)
    detail: str


def _parse_reward(name: str, text: str) -> tuple[float | None, str]:
    """(reward, problem) of one reward file's text."""
    if name == "reward.txt":
        try:
            return float(text.strip()), ""
        except ValueError:
            return None, f"reward.txt is not a number: {text[:40]!r}"
    try:
        data = json.loads(text)
    except ValueError:
        return None, f"{name} is not JSON"
    values = [data] if isinstance(data, int | float) else (
        [data["reward"]] if isinstance(data, dict) and "reward" in data
        else list(data.values()) if isinstance(data, dict) else [])  # fmt: skip
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return float(min(values)), ""
    return None, f"{name} holds no numeric reward"


def _reward(rewards: dict[str, str]) -> tuple[float | None, str, list[str]]:
    """(reward, problem, forged) from the reward files' texts: reward.txt first, as Harbor
    reads; two files that do not say the same reward are a forged verdict (test.sh writes
    one, so the other came from somewhere else)."""
    parsed = {name: _parse_reward(name, text) for name, text in rewards.items()}
    said = {
        name: (value if value is not None else problem) for name, (value, problem) in parsed.items()
    }
    if len(set(said.values())) > 1:
        return None, "", ["the reward files disagree (" + ", ".join(
            f"{n}: {v}" for n, v in sorted(said.items())) + "): test.sh writes one verdict"]  # fmt: skip
    for name in REWARD_FILES:
        if name in parsed:
            return parsed[name][0], parsed[name][1], []
    return None, "test.sh wrote no reward file (/logs/verifier/reward.txt or reward.json)", []


def _reward_files(logs: Path, mode: int) -> tuple[dict[str, str], list[str]]:
    """({name: text} of the regular reward files in the verdict folder `logs` the sandbox
    left, forged): a reward name that is not a regular file (a folder, symlink, FIFO), a
    reward file test.sh could not overwrite (read-only, or a folder whose permissions were
    changed from `mode`) is a forged verdict. Read on the host, never following a link."""
    forged = []
    if stat.S_IMODE(logs.lstat().st_mode) != mode:
        forged.append("the permissions of /logs/verifier were changed (test.sh could not "
                      "have written its reward)")  # fmt: skip
        os.chmod(logs, mode)  # the host's own folder: read what is there all the same
    forged += [f"test.sh found /logs/verifier/{name.removeprefix(SET_ASIDE)} there before it "
               "wrote its reward (set aside)" for name in sorted(os.listdir(logs))
               if name.startswith(SET_ASIDE)]  # fmt: skip
    texts = {}
    for name in REWARD_FILES:
        try:
            st = (logs / name).lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            kind = "folder" if stat.S_ISDIR(st.st_mode) else (
                "symlink" if stat.S_ISLNK(st.st_mode) else "special file")  # fmt: skip
            forged.append(f"/logs/verifier/{name} is a {kind}, not a file test.sh wrote")
            continue
        if not st.st_mode & stat.S_IWUSR or st.st_nlink > 1:
            forged.append(f"/logs/verifier/{name} is read-only or linked: test.sh could not "
                          "have written it")  # fmt: skip
        fd = os.open(logs / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            texts[name] = f.read(4096).decode(errors="replace")
    return texts, forged


def reserved_names(root: Path) -> list[str]:
    """Paths under `root` whose name is one of the harness's modules (RESERVED_MODULES), at
    any depth (pytest puts test folders on sys.path), as `root`-relative POSIX paths."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            if name.split(".", 1)[0] in RESERVED_MODULES:
                found.append((Path(folder) / name).relative_to(root).as_posix())
    return sorted(found)


def _tests_copy(task: Task, dest: Path) -> None:
    """The task's tests as /tests: without the hidden cases' expected values (the verifier
    runs them itself, `_cases_check`), whose runner there becomes a stand-in."""
    shutil.copytree(task.hidden_tests_dir / HARBOR_TESTS, dest,
                    ignore=shutil.ignore_patterns(CASES_FILE))  # fmt: skip
    if task.hidden_cases_path is not None and (dest / CASES_RUNNER).is_file():
        (dest / CASES_RUNNER).write_text(_CASES_STAND_IN)


def _ignore_reserved(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n == HARBOR_TESTS or n.split(".", 1)[0] in RESERVED_MODULES}


def _cases_check(task: Task, tree: Path, cfg) -> tuple[int, str, object, str]:
    """(failed cases, lost, command, detail): the task's hidden cases run on a fresh copy of
    `tree` in a sandbox of their own, with the arguments only (CASE_CHILD); the expected
    values stay in this process and are compared here with exact types."""
    import secrets

    from components.sandbox.process import run_sandboxed
    from components.tasks.task import same_value

    spec = json.loads(task.hidden_cases_path.read_text())
    cases = spec["cases"]
    token = "AGENTRL-CASES-" + secrets.token_hex(8)
    with shutdown.temporary_folder("agentrl-harbor-cases-") as tmp:
        ws, calls = Path(tmp) / "ws", Path(tmp) / "calls"
        shutil.copytree(tree, ws / "app", symlinks=True, ignore=_ignore_reserved)
        calls.mkdir()
        (calls / "calls.json").write_text(json.dumps([c["args"] for c in cases]))
        argv = ["python", "-s", "-P", "-B", "-c", CASE_CHILD, token, spec["module"],
                spec["function"], "/agentrl-calls/calls.json"]  # fmt: skip
        workdir = task_workdir(task)
        mounts = ((str(ws / "app"), workdir, True), (str(calls), "/agentrl-calls", False))
        cmd = run_sandboxed(argv, workdir, cfg, workspace=ws, mounts=mounts)
    lines = [ln for ln in cmd.output.splitlines() if ln.startswith(token + " ")]
    try:
        results = json.loads(lines[-1][len(token) + 1 :]) if lines else None
    except ValueError:
        results = None
    if not isinstance(results, list):
        why = cmd.limit_hit or f"exit code {cmd.exit_code}"
        return len(cases), f"the hidden-case run gave no results ({why})", cmd, ""
    failed = 0
    for n, case in enumerate(cases):
        got = results[n] if n < len(results) and isinstance(results[n], dict) else {}
        try:
            ok = isinstance(got.get("repr"), str) and same_value(
                ast.literal_eval(got["repr"]), ast.literal_eval(case["expected"]))  # fmt: skip
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            ok = False
        failed += not ok
    return failed, "", cmd, f"{len(cases) - failed}/{len(cases)} hidden cases match"


def run_verifier(task: Task, tree: Path, cfg) -> HarborRun:
    """Run the task's tests/test.sh on `tree` (the agent's repo as verification builds it)
    with Harbor's layout, then its hidden cases when the reward passed; see the module doc
    for what makes the verdict trustworthy."""
    from components.sandbox.config import SandboxError
    from components.sandbox.process import run_sandboxed

    forged = [f"{rel} would shadow the harness's own module (tampering; not taken)"
              for rel in reserved_names(tree)]  # fmt: skip
    with shutdown.temporary_folder("agentrl-harbor-") as tmp:
        ws, tests = Path(tmp) / "ws", Path(tmp) / "tests"
        shutil.copytree(tree, ws / "app", symlinks=True, ignore=_ignore_reserved)
        _tests_copy(task, tests)
        (ws / "logs").mkdir()
        mode = stat.S_IMODE((ws / "logs").stat().st_mode)
        workdir = task_workdir(task)
        mounts = ((str(ws / "app"), workdir, True), (str(tests), "/tests", False),
                  (str(ws / "logs"), "/logs/verifier", True))  # fmt: skip
        plugins = "own-plugins" if task.environment is not None else "harness-plugins"
        argv = ["python", "-I", "-c", _WRAPPER, plugins, json.dumps(task_env(task)), workdir]
        try:
            cmd = run_sandboxed(argv, workdir, cfg, workspace=ws, mounts=mounts)
        except SandboxError as e:
            raise RuntimeError(f"{task.id}: Harbor verification needs bubblewrap: {e}") from e
        rewards, bent = _reward_files(ws / "logs", mode)
        forged += bent + [f"{rel} appeared during verification: it would shadow the "
                          "harness's own module" for rel in reserved_names(ws / "app")]  # fmt: skip
    out = cmd.output
    detail = out[-2000:]
    if cmd.limit_hit in TIME_LIMITS and MARKER not in out:
        # A test.sh that runs out of time fails (code under test that loops, issue 46): a
        # verdict that carries its limit, never cached (components/verifier/verdict.py).
        why = f"test.sh ran out of time ({cmd.limit_hit}): failed; {detail}"
        return HarborRun(False, None, forged, "", cmd, why)
    if cmd.limit_hit not in (None, "output") or MARKER not in out:
        why = cmd.limit_hit or f"exit code {cmd.exit_code}"
        return HarborRun(False, None, forged, f"Harbor's test.sh gave no verdict ({why})", cmd,
                         detail)  # fmt: skip
    try:
        verdict = json.loads(out[out.rfind(MARKER) + len(MARKER) :].splitlines()[0])
    except (ValueError, IndexError):
        return HarborRun(False, None, forged, "the Harbor verdict line is damaged", cmd, detail)
    if verdict["rc"] < 0 or verdict["rc"] >= 128:
        forged.append(f"test.sh was killed (exit {verdict['rc']}): its reward is not its own")
    if verdict["survivors"]:
        forged.append(
            f"{verdict['survivors']} process(es) outlived test.sh (could rewrite the reward)"
        )
    reward, problem, disagree = _reward(rewards)
    forged += disagree
    if problem and not forged:
        return HarborRun(False, None, [], problem, cmd, detail)
    passed = not forged and reward is not None and reward >= 1.0
    if passed and task.hidden_cases_path is not None:
        failed, lost, cases_cmd, cases_detail = _cases_check(task, tree, cfg)
        detail = f"{cases_detail}; {detail}"
        if lost:
            return HarborRun(False, reward, [], lost, cases_cmd, detail)
        if failed:
            passed = False
            forged.append("test.sh gave reward 1 but the hidden cases failed")
    return HarborRun(passed, reward, forged, "", cmd, f"reward {reward}; {detail}")


def add_reference_from_solution(folder: Path, cfg) -> str | None:
    """Run solution/solve.sh in the sandbox on a copy of repo/ at /app and write what it
    changed as reference.patch; returns the patch (None without a solution)."""
    from components.sandbox.process import run_sandboxed

    solve = folder / "solution" / "solve.sh"
    if not solve.is_file():
        return None
    workdir = task_workdir(load_task(folder))
    with shutdown.temporary_folder("agentrl-harbor-solve-") as tmp:
        ws = Path(tmp) / "ws"
        shutil.copytree(folder / "repo", ws / "app", symlinks=True)
        mounts = ((str(ws / "app"), workdir, True), (str(folder / "solution"), "/solution", False))
        cfg = dataclasses.replace(cfg, allowed_programs=(*cfg.allowed_programs, "bash"))
        cmd = run_sandboxed(["bash", "/solution/solve.sh"], workdir, cfg, workspace=ws,
                            mounts=mounts)  # fmt: skip
        if cmd.exit_code != 0:
            raise HarborRefusal(f"{folder.name}: solution/solve.sh failed (exit {cmd.exit_code}): "
                                f"{cmd.output.strip().splitlines()[-1:] }")  # fmt: skip
        patch = tree_diff(folder / "repo", ws / "app")
    if not patch:
        raise HarborRefusal(f"{folder.name}: solution/solve.sh changes nothing under {workdir}")
    (folder / "reference.patch").write_text(patch)
    task = dataclasses.replace(load_task(folder), has_reference=True)
    (folder / "task.json").write_text(json.dumps(task_spec(task), indent=2) + "\n")
    return patch


def tree_diff(old: Path, new: Path) -> str:
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
