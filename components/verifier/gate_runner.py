"""The task gate's test runner: a task's own trees (reference fix, unfixed repository)
judged by `verify`, so the gate and the reward never disagree on what passes."""

from __future__ import annotations

from pathlib import Path

from components.sandbox.config import SandboxConfig
from components.tasks.task import Task
from components.verifier.checks import VerifierSettings
from components.verifier.verdict import verify


class VerifierInfraError(RuntimeError):
    """The harness failed; the task's verdict is unknown (not a test failure)."""


def sandboxed_test_runner(env: VerifierSettings, sandbox: SandboxConfig | None = None):
    """`run_tests(task, repo_dir) -> (passed, detail)` for the task gate, via `verify`;
    `env` is the episode's settings (components/env/config.py's EnvConfig)."""
    sandbox = sandbox or SandboxConfig()

    def run_tests(task: Task, repo_dir: Path) -> tuple[bool, str]:
        v = verify(task, Path(repo_dir), env, sandbox)
        if v.status != "ok":
            raise VerifierInfraError(f"{task.id}: {v.detail.strip()[:300]}")
        if v.verdict_lost:  # the gate's trees are the task's own: no verdict is a task bug
            raise VerifierInfraError(f"{task.id}: no verdict: {v.verdict_lost}")
        return v.tests_passed, f"{v.tests_total - v.tests_failed}/{v.tests_total} hidden tests pass"

    return run_tests
