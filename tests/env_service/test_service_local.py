"""`env.remote: local` (components/env_service/local.py): the first episode of a task suite
starts one health-waited server on that suite, later episodes share it, and it is stopped
when the run's scope ends, on SIGTERM, and when its process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components.env.config import EnvConfig
from components.env_service import local
from components.evaluate.episodes import run_policy
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from tests.env_service.served_env import REPO, live_children
from tests.env_service.test_service_identical import comparable


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


def test_local_is_a_remote_a_preset_may_name_and_nothing_else_new():
    assert EnvConfig(remote="local").remote == "local"
    with pytest.raises(ValueError, match="http\\(s\\):// URL or 'local'"):
        EnvConfig(remote="locally")


def test_a_pod_that_needs_a_server_refuses_local(monkeypatch, suite):
    from components.env_service.client import REQUIRE_ENV_REMOTE, RemoteRequired, open_episode

    monkeypatch.setenv(REQUIRE_ENV_REMOTE, "1")
    with pytest.raises(RemoteRequired, match="'local'"):
        open_episode(suite[1][0], EnvConfig(remote="local"), SandboxConfig(), policy_name="p")


@pytest.mark.integration  # a server started, 6 episodes verified
def test_one_server_per_suite_started_shared_and_stopped_with_the_scope(suite, tmp_path):
    _, tasks = suite
    args = dict(rollout=RolloutConfig(), sandbox=SandboxConfig(), workers=2, seed=3)
    in_process = run_policy(tasks, "oracle", env=EnvConfig(), **args)
    local.SERVERS.log_dir = tmp_path
    try:
        with local.local_env_servers(120.0) as servers:
            through = run_policy(tasks, "oracle", env=EnvConfig(remote="local"), **args)
            assert len(servers.servers) == 1  # one suite: one server, started once
            (server,) = servers.servers.values()
            assert server.url.startswith("http://127.0.0.1:")
            assert server.tasks_dir == str(tasks[0].root.parent.resolve())
            pid = server.proc.pid
            assert live_children(pid)  # its workers
        assert not servers.servers and _gone(pid)
    finally:
        local.SERVERS.log_dir = local.LOG_DIR
    assert [comparable(r) for r in through] == [comparable(r) for r in in_process]
    assert "agentrl env serve" in (tmp_path / f"{tasks[0].root.parent.name}.log").read_text()


_STAGE = """
import os, sys, time
from components import shutdown
from components.env_service import local
shutdown.install("stage")
local.SERVERS.log_dir = sys.argv[2]
local.SERVERS.url_for(sys.argv[1], {})
(server,) = local.SERVERS.servers.values()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.integration  # a server started twice
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_stops_when_its_stage_is_signalled(suite, tmp_path, sig):
    """SIGTERM: components/shutdown.py stops every process the stage started; SIGKILL
    runs nothing, and the server still goes (it dies with its parent)."""
    stage = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_STAGE), str(suite[0]), str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        server_pid = int(stage.stdout.readline())
        workers = live_children(server_pid)
        assert workers
        os.kill(stage.pid, sig)
        stage.wait(timeout=60)
        assert _gone(server_pid), "the environment server outlived its stage"
        assert all(_gone(w) for w in workers), "a worker outlived its server"
    finally:
        if stage.poll() is None:
            stage.kill()
            stage.wait()
