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
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.tasks.generate import unified_diff
from components.tasks.task import (
    Task,
    load_task,
    task_spec,
)

HARBOR_TESTS = ".harbor-tests"  # hidden_tests/<this>/ holds Harbor's tests/
REWARD_FILES = ("reward.txt", "reward.json", "rewards.json")
WORKDIR = "/app"
# The Harbor format version export writes (task.toml schema_version).
SCHEMA_VERSION = "1.4"


MARKER = "\nAGENTRL-HARBOR-VERDICT "


class HarborRefusal(ValueError):
    """A Harbor task the sandbox cannot honour; the message is one line saying why."""


def is_harbor_task(task: Task) -> bool:
    return (task.hidden_tests_dir / HARBOR_TESTS / "test.sh").is_file()


CASES_FILE = "hidden_cases.json"  # tests/<this>: the task's hidden cases, as we keep them
CASES_RUNNER = "run_cases.py"  # tests/<this>: test.sh runs it after the hidden tests pass


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
        patch = tree_diff(folder / "repo", ws / "app")
    if not patch:
        raise HarborRefusal(f"{folder.name}: solution/solve.sh changes nothing under {WORKDIR}")
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
