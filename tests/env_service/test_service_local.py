"""`env.remote: local` (components/env_service/local.py): the first episode of a task suite
starts one health-waited server on that suite, later episodes share it, and it is stopped
when the run's scope ends, on SIGTERM, and when its process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
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


# A server that can never answer: its interpreter sleeps before it runs (sitecustomize sees
# the command line), so only the start-up budget ends the wait.
_NEVER_READY = """import sys, time
if "components.env_service" in sys.orig_argv:
    time.sleep(600)
"""
BUDGET_S = 1.5


def _never_ready_servers(tmp_path) -> str:
    """A PYTHONPATH whose environment servers never become ready."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NEVER_READY)
    return os.pathsep.join([str(site), str(REPO)])


def _preset(tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text(
        f"name: local\nenv: {{remote: local}}\nruntime: {{startup_timeout_s: {BUDGET_S}}}\n"
    )
    return path


def test_a_stage_alone_waits_its_presets_startup_budget(suite, tmp_path, monkeypatch):
    """Outside a flow's scope the local server gets the preset's runtime.startup_timeout_s
    (was RuntimeConfig's 180 s): the error comes after two tries of 1.5 s and names it."""
    from components.preset import load_preset
    from components.runtime import ServiceStartError

    monkeypatch.setenv("PYTHONPATH", _never_ready_servers(tmp_path))
    monkeypatch.setattr(local.SERVERS, "preset_budget", None)
    monkeypatch.setattr(local.SERVERS, "log_dir", tmp_path)
    preset = _preset(tmp_path)
    env = load_preset(preset).section("env")  # as a stage command reads it
    outcome: list = []

    def start() -> None:
        t0 = time.monotonic()
        try:
            local.remote_url(env.remote, suite[1][0], SandboxConfig())
        except ServiceStartError as e:
            outcome.append((str(e), time.monotonic() - t0))

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "still waiting after 90 s: not the preset's 1.5 s budget"
    ((message, took),) = outcome
    assert 2 * BUDGET_S <= took < 2 * BUDGET_S + 20, took  # two tries, each stopped
    assert f"within {BUDGET_S:g}s (runtime.startup_timeout_s)" in message
    assert f"the budget is the runtime.startup_timeout_s of {preset}" in message
    assert not local.SERVERS.servers


@pytest.mark.integration  # a stage command started (its imports: seconds on a busy machine)
def test_a_stage_process_with_local_env_fails_within_its_presets_budget(suite, tmp_path):
    """`agentrl env eval` as its own process, preset `env.remote: local` and a 1.5 s budget,
    a server that never answers: one line naming the setting, long before 2 x 180 s."""
    environ = {**os.environ, "PYTHONPATH": _never_ready_servers(tmp_path)}
    preset = _preset(tmp_path)
    argv = [
        sys.executable,
        "-m",
        "components.cli",
        "env",
        "eval",
        "--tasks",
        str(suite[0]),
        "--policy",
        "oracle",
        "--preset",
        str(preset),
        "--out",
        str(tmp_path / "o.json"),
    ]
    t0 = time.monotonic()
    done = subprocess.run(
        argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - t0
    assert done.returncode != 0, done.stdout[-2000:]
    assert f"within {BUDGET_S:g}s (runtime.startup_timeout_s)" in done.stderr, done.stderr
    assert f"runtime.startup_timeout_s of {preset}" in done.stderr
    assert "Traceback" not in done.stderr
    assert took < 150, took  # the default budget would wait 360 s before the first line
    assert (tmp_path / "runs" / "env-serve" / f"{suite[0].name}.log").is_file()
