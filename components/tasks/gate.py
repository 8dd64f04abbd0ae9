"""The data gate: a task enters a suite only if its tests can tell a bug from a fix.

For each task:
  1. the unmodified repo, with hidden_tests/ overlaid, must FAIL at least one hidden test
     (otherwise there is nothing to fix, and any policy gets the reward for free);
  2. the repo with reference.patch applied must PASS all hidden tests (otherwise the task
     is unsolvable or its tests are wrong). The patch must also leave protected paths alone.
  0. before both, a mined task must ship hidden cases (`IN_PROCESS_ONLY`).
  3. with a replay (`replay`, the command line's `oracle_replay` under the preset it gates
     for), the oracle plays the task through the tools within the preset's `max_steps`
     and must succeed with reward 1.0: a task it cannot finish in budget is rejected with
     why, so every gated task can become full-reward expert data. The replay may also
     flag (a warning): e.g. a fix the fix-search oracle cannot show.
Tasks without reference.patch get only check 1 and are reported as 'unverified fix'.

Besides, a warning rather than a failure: what hangs on the buggy code (`find_hangs`,
`hang_finder`): visible tests the task's test command runs, hidden tests and hidden cases
that run past the per-test timeout on the unmodified repository, each named, so a
converter can drop or bound it (docs/tasks.md, "Hanging cases"). A hang is legitimate (real
bugs loop) but costs the timeout in every test run of every episode.

The test runner is injected (`run_tests(task, repo_dir) -> (passed, detail)`): it receives
a candidate repo folder, must not modify it, overlays the hidden tests on a copy and runs
them. The production runner is the sandboxed verifier; `subprocess_run_tests` here is a
plain local one for development and tests.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components import shutdown
from components.tasks.external import RunPython
from components.tasks.patching import PatchError, apply_unified_diff, parse_unified_diff
from components.tasks.task import Task

RunTests = Callable[[Task, Path], tuple[bool, str]]
# `find_hangs(task)`: what hangs on the task's unmodified repository, each named.
FindHangs = Callable[[Task], list[str]]
# `replay(task) -> (why the oracle failed it or "", flags)`: check 3.
ReplayOracle = Callable[[Task], tuple[str, list[str]]]
UNVERIFIED = "unverified fix"
# A mined task's hidden tests run inside the process of the code under test, which can print
# the harness's verdict line itself; only hidden cases (components/mining/hidden_cases.py) hold.
IN_PROCESS_ONLY = ("no hidden cases: the verdict of a mined task would rest on pytest in the "
                   "process of the code under test alone, which that code can forge")  # fmt: skip
HANG_TIMEOUT_S = 5.0  # EnvConfig.per_test_timeout_s's default: what verification allows a test


@dataclass
class TaskCheck:
    task_id: str
    split: str
    ok: bool
    reason: str  # "" when ok; UNVERIFIED for an ok task without a reference patch
    seconds: float
    hanging: list[str] = field(default_factory=list)  # what hangs on the buggy code (warning)
    oracle: str = ""  # "replayed" when check 3 ran and held ("" when it did not run)
    flags: list[str] = field(default_factory=list)  # the replay's warnings


@dataclass
class GateReport:
    passed: list[str] = field(default_factory=list)  # usable tasks (unverified ones included)
    failed: dict[str, str] = field(default_factory=dict)  # task id -> reason
    unverified: list[str] = field(default_factory=list)  # passed, but no reference to check
    hanging: dict[str, list[str]] = field(default_factory=dict)  # task id -> what hangs (warning)
    flagged: dict[str, list[str]] = field(default_factory=dict)  # task id -> replay warnings
    checks: list[TaskCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict:
        return asdict(self)

    def summary_table(self) -> str:
        """Per-split counts plus one line per failed task."""
        rows: dict[str, list[int]] = {}
        for c in self.checks:
            r = rows.setdefault(c.split, [0, 0, 0, 0])
            r[0] += 1
            r[1] += c.ok
            r[2] += not c.ok
            r[3] += c.reason == UNVERIFIED
        lines = [f"{'split':<8}{'tasks':>7}{'passed':>8}{'failed':>8}{'unverified':>12}"]
        total = [0, 0, 0, 0]
        for split in sorted(rows):
            r = rows[split]
            total = [a + b for a, b in zip(total, r, strict=True)]
            lines.append(f"{split:<8}{r[0]:>7}{r[1]:>8}{r[2]:>8}{r[3]:>12}")
        lines.append(f"{'total':<8}{total[0]:>7}{total[1]:>8}{total[2]:>8}{total[3]:>12}")
        replayed = sum(c.oracle == "replayed" for c in self.checks)
        if replayed or any(r.startswith("oracle") for r in self.failed.values()):
            lines.append(f"oracle replay: {replayed} task(s) solved at reward 1.0 within the "
                         "preset's max_steps (built-in tasks by their plan and verdict, "
                         "the others as episodes)")  # fmt: skip
        lines.append(f"gate time: {self.seconds:.1f}s")
        for task_id, reason in sorted(self.failed.items()):
            lines.append(f"FAILED {task_id}: {reason}")
        for task_id, items in sorted(self.hanging.items()):
            lines.append(f"HANGS {task_id} on the buggy code (a timeout in every run; "
                         "docs/tasks.md, Hanging cases): " + "; ".join(items))  # fmt: skip
        for task_id, items in sorted(self.flagged.items()):
            lines.append(f"FLAGGED {task_id}: " + "; ".join(items))
        return "\n".join(lines)


def _tail(text: str, limit: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _python_argv(argv: Iterable[str]) -> list[str]:
    # "python" in a task's command means the interpreter running us (the venv), not PATH's.
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def overlay_hidden_tests(task: Task, repo_copy: Path) -> None:
    """Copy hidden_tests/ onto repo_copy at the same relative paths (overwriting)."""
    for rel in task.hidden_test_files():
        dst = repo_copy / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(task.hidden_tests_dir / rel, dst)


def hidden_test_command(task: Task) -> list[str]:
    """The command verification runs in the repo root: verify_command, else pytest on
    the hidden test files."""
    if task.verify_command is not None:
        return _python_argv(task.verify_command)
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *task.hidden_test_files(),
    ]


def subprocess_run_tests(
    task: Task, repo_dir: Path, timeout: float = 60.0, disable_plugin_autoload: bool = True
) -> tuple[bool, str]:
    """Local runner: copy repo_dir to a temp dir, overlay hidden tests, run them.

    Not a sandbox: only for trusted tasks (our own suite, tests). Plugin autoloading is
    off by default because hidden tests are plain asserts and it halves pytest start-up.
    A task with its own environment is refused: this runner has only the project's python.
    """
    if task.environment is not None:
        raise ValueError(f"{task.id}: a task with an environment is gated by the sandboxed "
                         "verifier (agentrl tasks check), which runs its interpreter")  # fmt: skip
    with shutdown.temporary_folder(f"agentrl-gate-{task.id}-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(repo_dir, work, symlinks=True)
        overlay_hidden_tests(task, work)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if disable_plugin_autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        try:
            proc = subprocess.run(
                hidden_test_command(task),
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f}s"
        output = _tail(proc.stdout + proc.stderr)
        if proc.returncode == 0:
            return True, output
        return False, f"exit code {proc.returncode}: {output}"


# ----------------------------------------------------------------------------- hangs

_JUNIT = "_agentrl_gate_junit.xml"
_HANGS_MARKER = "AGENTRL-GATE-HANGS"
# Calls the function on each hidden case's arguments under a per-case alarm; prints the
# indices of the cases that ran out of time (run in the sandbox: it executes task code).
_CASE_SCAN = r"""
import ast, importlib.util, json, sys

import agentrl_limits  # components/sandbox/harness_plugins/, on the sandbox's PYTHONPATH


class CaseTimeout(BaseException):  # not TimeoutError: the function may raise that itself
    pass


def on_limit(kind):
    raise CaseTimeout


module_file, function, timeout, args_file = sys.argv[1:5]
sys.path.insert(0, ".")
spec = importlib.util.spec_from_file_location("module_under_test", module_file)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
hung = []
for i, text in enumerate(json.load(open(args_file))):
    call_args = ast.literal_eval(text)
    try:  # a limit that hits anywhere from arm() to cancel() lands in this try
        try:
            # CPU time, and wall time less the time starved of a core (load adds neither).
            agentrl_limits.arm(float(timeout), float(timeout), on_limit)
            getattr(module, function)(*call_args)
        finally:
            agentrl_limits.cancel()
    except CaseTimeout:
        hung.append(i)
    except BaseException:
        pass
print("\n%s %s" % (sys.argv[5], json.dumps(hung)))
"""


def _visible_test_paths(task: Task, repo: Path) -> list[str]:
    """The paths a pytest test command names (its tests, without its options)."""
    argv = list(task.test_command)
    at = next((i for i, a in enumerate(argv) if a == "pytest" or a.endswith("/pytest")), None)
    if at is None:
        return []
    return [
        a for a in argv[at + 1 :] if not a.startswith("-") and (repo / a.split("::")[0]).exists()
    ]


def _count_tests(paths: list[Path]) -> int:
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))]
    return sum(f.read_text(errors="replace").count("def test") for f in files)


def _timeouts(junit: Path) -> list[str]:
    """`file::test` of every test pytest-timeout stopped, from a junit report (xunit1)."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = [b for b in (case.find("failure"), case.find("error")) if b is not None]
        if any("Failed: Timeout" in (b.get("message") or "") + (b.text or "") for b in bad):
            out.append(f"{case.get('file') or case.get('classname')}::{case.get('name')}")
    return out


def hanging_tests(task: Task, run_python: RunPython, timeout_s: float) -> list[str]:
    """The visible tests the task's test command runs and the hidden tests that run past
    `timeout_s` on the unmodified repository, as "visible <test id>" / "hidden <test id>"."""
    hidden = task.hidden_test_files() if task.verify_command is None else []
    with shutdown.temporary_folder(f"agentrl-gate-hangs-{task.id}-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, work, symlinks=True)
        overlay_hidden_tests(task, work)
        targets = _visible_test_paths(task, work) + hidden
        if not targets:
            return []
        n_tests = _count_tests([work / t.split("::")[0] for t in targets])
        wall = 60 + 2 * timeout_s * max(n_tests, 10)
        argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                f"--timeout={timeout_s:g}", "-o", "junit_family=xunit1",
                f"--junitxml={_JUNIT}", *targets]  # fmt: skip
        code, output = run_python(work, argv, wall)
        try:
            stopped = _timeouts(work / _JUNIT)
        except (ET.ParseError, OSError):
            return [f"tests: no report after {wall:g} s (exit code {code}): {_tail(output, 200)}"]
    return [f"{'hidden' if t.split('::')[0] in hidden else 'visible'} {t}" for t in stopped]


def hanging_cases(task: Task, run_python: RunPython, timeout_s: float) -> list[str]:
    """The hidden cases (hidden_cases.json) whose call runs past `timeout_s` on the
    unmodified repository, as "hidden case N: f(args)"."""
    if task.hidden_cases_path is None:
        return []
    spec = json.loads(task.hidden_cases_path.read_text())
    args = [c["args"] for c in spec["cases"]]
    token = f"{_HANGS_MARKER}-{secrets.token_hex(8)}"
    with shutdown.temporary_folder(f"agentrl-gate-cases-{task.id}-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, work, symlinks=True)
        (work / "_agentrl_case_scan.py").write_text(_CASE_SCAN)
        (work / "_agentrl_case_args.json").write_text(json.dumps(args))
        wall = 60 + len(args) * (timeout_s + 1)
        code, output = run_python(work, ["_agentrl_case_scan.py", spec["module"], spec["function"],
                                         f"{timeout_s:g}", "_agentrl_case_args.json", token],
                                  wall)  # fmt: skip
    found = [ln for ln in output.splitlines() if ln.startswith(token + " ")]
    if not found:
        return [f"hidden cases: no result (exit code {code}): {_tail(output, 200)}"]
    hung = json.loads(found[-1][len(token) + 1 :])
    return [f"hidden case {i + 1}: {spec['function']}{args[i]}"[:120] for i in hung]


def hang_finder(run_python: RunPython, timeout_s: float = HANG_TIMEOUT_S) -> FindHangs:
    """`find_hangs(task)` for the gate: hanging_tests + hanging_cases, run through
    `run_python` (the command line's is sandboxed: it runs task code)."""

    def find_hangs(task: Task) -> list[str]:
        return hanging_tests(task, run_python, timeout_s) + hanging_cases(
            task, run_python, timeout_s
        )

    return find_hangs


# ----------------------------------------------------------------------------- the gate


def check_task(
    task: Task, run_tests: RunTests = subprocess_run_tests, find_hangs: FindHangs | None = None,
    replay: ReplayOracle | None = None,
) -> TaskCheck:  # fmt: skip
    """The gate's checks on one task; with `find_hangs`, also what hangs on the buggy code
    (a warning kept in `hanging`, never a failure); with `replay`, check 3."""
    start = time.monotonic()
    hanging: list[str] = []
    flags: list[str] = []

    def done(ok: bool, reason: str, oracle: str = "") -> TaskCheck:
        return TaskCheck(task.id, task.metadata.split, ok, reason, time.monotonic() - start,
                         hanging, oracle, flags)  # fmt: skip

    if task.metadata.source == "mined" and task.hidden_cases_path is None:
        return done(False, IN_PROCESS_ONLY)
    try:
        passed, detail = run_tests(task, task.repo_dir)
        if passed:
            return done(False, "hidden tests pass on the unmodified repo (bug not detected)")
        # The built-in generator already rejects mutants that loop (a trace budget per
        # call, GenerateConfig.step_budget): only other sources are scanned for hangs.
        # A task with its own environment: the scan's runner has only the project's python
        # (mining screens its mutants for hangs with the environment's).
        scan = task.metadata.source != "builtin" and task.environment is None
        if find_hangs is not None and scan:
            try:
                hanging += find_hangs(task)
            except Exception as e:  # noqa: BLE001 - a warning must not fail the task
                hanging.append(f"hang scan failed: {type(e).__name__}: {e}")
        patch = task.reference_patch()
        if patch is None:
            return done(True, UNVERIFIED)
        try:
            touched = [p for fp in parse_unified_diff(patch) for p in (fp.old_path, fp.new_path)]
        except PatchError as e:
            return done(False, f"reference.patch is malformed: {e}")
        protected = sorted({p for p in touched if p and task.is_protected(p)})
        if protected:
            return done(False, f"reference.patch modifies protected paths: {', '.join(protected)}")
        with shutdown.temporary_folder(f"agentrl-gate-fix-{task.id}-") as tmp:
            fixed = Path(tmp) / "repo"
            shutil.copytree(task.repo_dir, fixed, symlinks=True)
            try:
                apply_unified_diff(fixed, patch)
            except PatchError as e:
                return done(False, f"reference.patch does not apply: {e}")
            passed, detail = run_tests(task, fixed)
        if not passed:
            return done(False, f"hidden tests fail with reference.patch applied: {detail}")
        if replay is None:
            return done(True, "")
        why, found = replay(task)
        flags += found
        return done(False, f"oracle: {why}") if why else done(True, "", "replayed")
    except Exception as e:  # a broken runner or task must be reported, not crash the gate
        return done(False, f"gate error: {type(e).__name__}: {e}")


def check_tasks(
    tasks: list[Task],
    run_tests: RunTests = subprocess_run_tests,
    workers: int = 2,
    progress: Callable[[TaskCheck], None] | None = None,
    find_hangs: FindHangs | None = None,
    replay: ReplayOracle | None = None,
) -> GateReport:
    """Gate every task (in parallel threads; the runner does the heavy work in
    subprocesses or sandboxes). Results are ordered by task id."""
    start = time.monotonic()
    report = GateReport()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(check_task, t, run_tests, find_hangs, replay) for t in tasks]
        for fut in futures:
            check = fut.result()
            if progress is not None:
                progress(check)
            report.checks.append(check)
    report.checks.sort(key=lambda c: c.task_id)
    for c in report.checks:
        if c.hanging:
            report.hanging[c.task_id] = c.hanging
        if c.flags:
            report.flagged[c.task_id] = c.flags
        if c.ok:
            report.passed.append(c.task_id)
            if c.reason == UNVERIFIED:
                report.unverified.append(c.task_id)
        else:
            report.failed[c.task_id] = c.reason
    report.seconds = round(time.monotonic() - start, 3)
    return report
