"""Ctrl-C and SIGTERM of `agentrl tasks import` (issue 45, deliverable 3 and finding 6):
stopped by SIGINT or SIGTERM to its process group while it gates Harbor tasks in the
sandbox, it exits 130 / 143 within a few seconds and leaves no `agentrl-*` mount, no
process of its group and no temporary folder: its import folder (`agentrl-import-*`) and
the Harbor verifier's, the solution's, the gate's and the reference fix's work folders
(`agentrl-harbor-*`, `agentrl-reference-*`, components/shutdown.py `temporary_folder`).
The helpers are the other signal tests' (tests/test_signals.py,
tests/test_signals_commands.py)."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from components.sandbox.isolation import resolve_isolation
from tests.test_signals import (
    ROOT,
    SIGNALS,
    assert_nothing_left,
    start,
    stop,
    unmount_below,
)
from tests.test_signals_commands import AGENTRL, wait_for_a_sandbox

# The published-shape fixture's python:3.11 task (the project's interpreter: no task
# environment to build), four times over, so the import is still gating when it is stopped.
TASK = ROOT / "tests" / "fixtures" / "harbor_humanevalfix" / "python-1"


@pytest.mark.integration  # sandboxed Harbor gates on a busy machine: a minute each
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    resolve_isolation("auto") != "bwrap", reason="Harbor verification needs bubblewrap"
)
@SIGNALS
def test_a_stopped_tasks_import_leaves_nothing(tmp_path, how):
    src = tmp_path / "dataset"
    for n in range(4):
        shutil.copytree(TASK, src / f"python-1-{n}")
    argv = [*AGENTRL, "tasks", "import", "--src", str(src), "--out", str(tmp_path / "out")]
    proc = start(argv, tmp_path)
    try:
        wait_for_a_sandbox(tmp_path / "tmp", prefixes=("agentrl-harbor-",))
        assert proc.poll() is None, "it ended before it was stopped"
        took, rest = stop(proc, how)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            unmount_below(tmp_path)
    assert proc.returncode == 128 + how, rest[-3000:]
    assert took < 12, f"{took:.1f}s: {rest[-3000:]}"  # as the other commands' signal tests
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == f"agentrl tasks import: {name}"
    assert "Traceback" not in rest
    assert_nothing_left(proc, tmp_path)
