"""`stop_commands_in`: a driver whose thread waits on a sandboxed command past its own
deadline (the rollout engine's step limit, issue 44) kills that command from another
thread, with everything it started, and no new command starts in that workspace until the
workspace is gone."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.process import forget_stopped, run_sandboxed, stop_commands_in
from components.sandbox.workspace import Workspace

SLEEP_S = 40


def _sleeper_code(marker: str) -> str:
    """A command that sleeps, with a child in a session of its own (outside the command's
    process group) that sleeps too; both carry `marker` in their command line."""
    child = f"import time; time.sleep({SLEEP_S})  # {marker}"
    return (f"import subprocess, time; subprocess.Popen(['python', '-c', {child!r}], "
            f"start_new_session=True); time.sleep({SLEEP_S})")  # fmt: skip


def _alive_with(marker: str) -> int:
    """How many live (not zombie) processes carry `marker` in their command line."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        n += marker.encode() in cmdline and state != "Z"
    return n


def test_a_stopped_command_returns_at_once_and_nothing_it_started_lives_on(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    ws = Workspace.create(src)
    try:
        results = []
        marker = f"agentrl-stop-test-{os.getpid()}-{time.monotonic_ns()}"
        code = _sleeper_code(marker)
        runner = threading.Thread(target=lambda: results.append(
            run_sandboxed(["python", "-c", code], ws.root, SandboxConfig(wall_time_s=SLEEP_S + 20))))  # fmt: skip
        start = time.monotonic()
        runner.start()
        deadline = time.monotonic() + 20
        while _alive_with(marker) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the command and its child are running (the positive control)
        assert runner.is_alive() and _alive_with(marker) >= 2
        assert stop_commands_in(ws.root) == 1
        runner.join(timeout=15)
        assert not runner.is_alive() and time.monotonic() - start < SLEEP_S
        assert results[0].limit_hit == "wall_time" and results[0].timed_out
        assert _alive_with(marker) == 0
        with pytest.raises(SandboxError, match="stopped"):
            run_sandboxed(["python", "-c", "pass"], ws.root, SandboxConfig())
    finally:
        ws.cleanup()
    # The workspace is gone, and with it the refusal: its path may be used again.
    ws.root.mkdir()
    try:
        assert run_sandboxed(["python", "-c", "pass"], ws.root, SandboxConfig()).exit_code == 0
    finally:
        ws.root.rmdir()


def test_stopping_a_workspace_with_nothing_running_refuses_what_comes_next(tmp_path):
    assert stop_commands_in(tmp_path) == 0
    with pytest.raises(SandboxError, match="stopped"):
        run_sandboxed(["python", "-c", "pass"], tmp_path, SandboxConfig())
    forget_stopped(tmp_path)
    assert run_sandboxed(["python", "-c", "pass"], tmp_path, SandboxConfig()).exit_code == 0
