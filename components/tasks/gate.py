"""The data gate: a task enters a suite only if its tests can tell a bug from a fix.

For each task:
  1. the unmodified repo, with hidden_tests/ overlaid, must FAIL at least one hidden test
     (otherwise there is nothing to fix, and any policy gets the reward for free);
  2. the repo with reference.patch applied must PASS all hidden tests (otherwise the task
     is unsolvable or its tests are wrong). The patch must also leave protected paths alone.
Tasks without reference.patch get only check 1 and are reported as 'unverified fix'.

The test runner is injected (`run_tests(task, repo_dir) -> (passed, detail)`): it receives
a candidate repo folder, must not modify it, overlays the hidden tests on a copy and runs
them. The production runner is the sandboxed verifier; `subprocess_run_tests` here is a
plain local one for development and tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components.tasks.patching import PatchError, apply_unified_diff, parse_unified_diff
from components.tasks.task import Task

RunTests = Callable[[Task, Path], tuple[bool, str]]
UNVERIFIED = "unverified fix"


@dataclass
class TaskCheck:
    task_id: str
    split: str
    ok: bool
    reason: str  # "" when ok; UNVERIFIED for an ok task without a reference patch
    seconds: float


@dataclass
class GateReport:
    passed: list[str] = field(default_factory=list)  # usable tasks (unverified ones included)
    failed: dict[str, str] = field(default_factory=dict)  # task id -> reason
    unverified: list[str] = field(default_factory=list)  # passed, but no reference to check
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
        lines.append(f"gate time: {self.seconds:.1f}s")
        for task_id, reason in sorted(self.failed.items()):
            lines.append(f"FAILED {task_id}: {reason}")
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
    """
    with tempfile.TemporaryDirectory(prefix=f"gate-{task.id}-") as tmp:
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


def check_task(task: Task, run_tests: RunTests = subprocess_run_tests) -> TaskCheck:
    start = time.monotonic()

    def done(ok: bool, reason: str) -> TaskCheck:
        return TaskCheck(task.id, task.metadata.split, ok, reason, time.monotonic() - start)

    try:
        passed, detail = run_tests(task, task.repo_dir)
        if passed:
            return done(False, "hidden tests pass on the unmodified repo (bug not detected)")
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
        with tempfile.TemporaryDirectory(prefix=f"gate-fix-{task.id}-") as tmp:
            fixed = Path(tmp) / "repo"
            shutil.copytree(task.repo_dir, fixed, symlinks=True)
            try:
                apply_unified_diff(fixed, patch)
            except PatchError as e:
                return done(False, f"reference.patch does not apply: {e}")
            passed, detail = run_tests(task, fixed)
        if not passed:
            return done(False, f"hidden tests fail with reference.patch applied: {detail}")
        return done(True, "")
    except Exception as e:  # a broken runner or task must be reported, not crash the gate
        return done(False, f"gate error: {type(e).__name__}: {e}")


def check_tasks(
    tasks: list[Task],
    run_tests: RunTests = subprocess_run_tests,
    workers: int = 2,
    progress: Callable[[TaskCheck], None] | None = None,
) -> GateReport:
    """Gate every task (in parallel threads; the runner does the heavy work in
    subprocesses or sandboxes). Results are ordered by task id."""
    start = time.monotonic()
    report = GateReport()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(check_task, t, run_tests) for t in tasks]
        for fut in futures:
            check = fut.result()
            if progress is not None:
                progress(check)
            report.checks.append(check)
    report.checks.sort(key=lambda c: c.task_id)
    for c in report.checks:
        if c.ok:
            report.passed.append(c.task_id)
            if c.reason == UNVERIFIED:
                report.unverified.append(c.task_id)
        else:
            report.failed[c.task_id] = c.reason
    report.seconds = round(time.monotonic() - start, 3)
    return report
