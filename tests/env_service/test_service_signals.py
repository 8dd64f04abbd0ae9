"""Ctrl-C and SIGTERM of `agentrl env serve` (issue 45 deliverable 3, for issue 47's server):
stopped by SIGINT or SIGTERM to its process group while an episode's command runs in a
worker's sandbox, it exits 130 / 143 within a few seconds, with no worker process, no
sandboxed command (they run in sessions of their own, out of the group's reach), no
workspace mount and no `agentrl-*` temporary folder left."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import httpx
import pytest

from components.env.config import EnvConfig
from components.env.episode import Action
from components.env_service.client import EnvClient, RemoteEpisode
from components.runtime import descendants
from tests.env_service.served_env import free_port
from tests.test_signals import SIGNALS, agentrl_mounts, assert_nothing_left, start, stop

# An episode's command that outlives the stop by far (the stop must end it).
SLEEP = Action("run_command", {"cmd": "python -c 'import time; time.sleep(300)'"})


def _ready(url: str, proc, budget_s: float = 240) -> None:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"env serve exited {proc.returncode}"
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"env serve not ready within {budget_s} s")


def _sleeping_command(pids: list[int]) -> list[int]:
    """Those of `pids` that run the episode's sleep (inside its sandbox)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"time.sleep(300)" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


@pytest.mark.integration  # a server, its workers and a sandboxed command: a minute at load
@pytest.mark.timeout(900)
@SIGNALS
def test_env_serve_stopped_mid_command_leaves_nothing(suite, tmp_path, how):
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "components.cli",
        "env",
        "serve",
        "--tasks",
        str(suite[0]),
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    proc = start(argv, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        _ready(url, proc)
        task = suite[1][0]
        episode = RemoteEpisode(
            task, EnvConfig(remote=url), policy_name="oracle", client=EnvClient(url)
        )
        stepping = threading.Thread(target=lambda: _step_quietly(episode), daemon=True)
        stepping.start()
        deadline = time.monotonic() + 240
        while not _sleeping_command(descendants(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        below = descendants(proc.pid)  # workers, the sandbox and the command
        assert _sleeping_command(below), "the episode's command never started"
        # the workspace is a tmpfs where this user may mount
        assert agentrl_mounts(tmp_path) or os.geteuid() != 0, "no workspace mounted"
        took, rest = stop(proc, how)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + how, rest[-3000:]
    print(f"env serve stopped by {how.name} in {took:.1f} s")
    assert took < 12, f"{took:.1f}s: {rest[-3000:]}"
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == f"agentrl env serve: {name}", rest[-3000:]
    assert "Traceback" not in rest
    time.sleep(0.5)
    assert _alive(below) == [], "a worker, sandbox or command outlived the server"
    assert_nothing_left(proc, tmp_path)  # group, mounts, the TMPDIR empty


def _step_quietly(episode: RemoteEpisode) -> None:
    # the server is stopped under it: any answer will do
    with contextlib.suppress(Exception):
        episode.step(SLEEP)
