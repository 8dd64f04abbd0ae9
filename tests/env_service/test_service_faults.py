"""Faults of the environment server (issue 47), on loopback: a worker killed mid-episode, a
server restarted, a request that times out, a server that stops answering. Each episode is
replayed on a new session (another worker) and scores as in-process, or ends as an infra
failure (no reward: never the agent's); the client never waits without bound; no workspace
or process is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, run_episode
from components.env_service.client import EnvClient, RemoteEpisode
from components.sandbox.config import SandboxConfig
from components.scripted.registry import make_policy
from tests.env_service.served_env import (
    live_children,
    metrics,
    start_server,
    stop_server,
    workspaces_under,
)
from tests.env_service.test_service_identical import comparable

pytestmark = pytest.mark.integration  # real servers on loopback, minutes on a busy machine

SLEEP = Action("run_command", {"cmd": "python -c 'import time; time.sleep(40)'"})


def _oracle_steps(task, episode, until: int | None = None) -> None:
    """Step the oracle (seed 0) on `episode`, at most `until` steps."""
    policy = make_policy("oracle", seed=0)
    while not episode.done and (until is None or episode.steps < until):
        episode.step(policy.act(task, episode.events))


def _in_process(task):
    return run_episode(task, make_policy("oracle", seed=0), EnvConfig(), SandboxConfig())


def _remote(task, url: str, client: EnvClient | None = None) -> RemoteEpisode:
    return RemoteEpisode(
        task,
        EnvConfig(remote=url),
        policy_name="oracle",
        episode_id=_in_process_id(task),
        source="oracle",
        client=client or EnvClient(url),
    )


def _in_process_id(task) -> str:
    from components.env.episode import episode_id_for

    return episode_id_for("oracle", task, 0)


def _no_leftovers(proc, tmp_dir) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and workspaces_under(str(tmp_dir)):
        time.sleep(0.1)
    assert workspaces_under(str(tmp_dir)) == []
    if proc.poll() is None:  # only the workers (and multiprocessing's tracker) run below it
        assert sorted(live_children(proc.pid)) == sorted(metrics_of(proc))


def metrics_of(proc) -> list[int]:
    return proc.env_service_pids


def _start(suite, tmp_path, **kwargs):
    proc, url = start_server(suite[0], tmp_dir=tmp_path / "server-tmp", **kwargs)
    proc.env_service_pids = metrics(url)["worker_pids"]
    return proc, url


def test_a_worker_killed_mid_episode_is_replayed_on_another(suite, tmp_path):
    _, tasks = suite
    task = tasks[0]
    proc, url = _start(suite, tmp_path, workers=2)
    try:
        episode = _remote(task, url)
        _oracle_steps(task, episode, until=2)
        victim = metrics(url)["worker_pids"][episode.worker]
        os.kill(victim, signal.SIGKILL)
        _oracle_steps(task, episode)
        result = episode.finish()
        assert comparable(result) == comparable(_in_process(task))
        after = metrics(url)
        assert after["worker_restarts"] == 1 and victim not in after["worker_pids"]
        proc.env_service_pids = after["worker_pids"]
        _no_leftovers(proc, tmp_path / "server-tmp")
    finally:
        stop_server(proc)


def test_a_restarted_server_gets_the_episode_replayed(suite, tmp_path):
    _, tasks = suite
    task = tasks[1]
    proc, url = _start(suite, tmp_path, workers=1)
    port = int(url.rsplit(":", 1)[1])
    episode = _remote(task, url)
    _oracle_steps(task, episode, until=2)
    proc.kill()  # a crash: its workers die with it (SIGTERM) and free their workspaces
    proc.wait()
    _no_leftovers(proc, tmp_path / "server-tmp")
    restarted = {}

    def restart():
        time.sleep(1.0)  # the client meanwhile finds the port closed and keeps trying
        restarted["proc"], _ = start_server(
            tasks_dir(suite), port=port, workers=1, tmp_dir=tmp_path / "server-tmp"
        )

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        episode.client.connect_budget_s = 120.0
        _oracle_steps(task, episode)
        result = episode.finish()
        assert comparable(result) == comparable(_in_process(task))
    finally:
        thread.join()
        stop_server(restarted["proc"])
    _no_leftovers(restarted["proc"], tmp_path / "server-tmp")


def tasks_dir(suite):
    return suite[0]


def test_a_request_that_times_out_is_an_infra_failure(suite, tmp_path):
    _, tasks = suite
    proc, url = _start(suite, tmp_path, workers=1, request_timeout_s=3.0)
    try:
        episode = _remote(tasks[0], url)
        start = time.monotonic()
        try:
            episode.step(SLEEP)
            raise AssertionError("a step past the server's timeout answered")
        except Exception as e:  # noqa: BLE001 - what the engine does with a failed step
            episode.abort(f"tool execution failed: {e!r}")
        result = episode.finish()
        assert time.monotonic() - start < 30
        assert (result.status, result.reward, result.success) == ("infra_failure", None, False)
        assert "3 s" in result.infra_detail
        after = metrics(url)
        assert after["request_timeouts"] == 1 and after["worker_restarts"] == 1
        proc.env_service_pids = after["worker_pids"]
        _no_leftovers(proc, tmp_path / "server-tmp")  # the sleeping command was killed too
    finally:
        stop_server(proc)


def test_a_server_that_stops_answering_never_hangs_the_client(suite, tmp_path):
    _, tasks = suite
    proc, url = _start(suite, tmp_path, workers=1, request_timeout_s=2.0)
    try:
        episode = _remote(tasks[0], url)
        os.kill(proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            episode.step(Action("finish", {"summary": "x"}))
        except Exception as e:  # noqa: BLE001
            episode.abort(f"tool execution failed: {e!r}")
        result = episode.finish()
        waited = time.monotonic() - start
        assert result.status == "infra_failure" and result.reward is None
        assert waited < 2 * 2.0 + 10.0 + 5  # the client's bound, once: finish does not wait again
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop_server(proc)
