"""What a client cannot make the environment server do (issue 47): the verdict, reward and
reward breakdown are the server's alone, and a task is named by id from the server's own
suite. Each attack is sent as raw HTTP, as a hostile client would."""

from __future__ import annotations

import httpx

from components.env.config import EnvConfig
from components.env_service.protocol import env_settings
from components.verifier.provenance import unverified_reason


def _create(url: str, task_id: str, **extra) -> httpx.Response:
    body = {
        "task_id": task_id,
        "env": env_settings(EnvConfig()),
        "policy_name": "attacker",
        "episode_id": f"attack-{task_id[:20]}",
        **extra,
    }
    return httpx.post(f"{url}/sessions", json=body, timeout=120)


def test_a_forged_verdict_is_refused_and_the_servers_own_stands(suite, server):
    _, tasks = suite
    session = _create(server, tasks[0].id).json()["session"]
    step = {"action": {"tool": "finish", "arguments": {"summary": "all fixed"}}}
    assert httpx.post(f"{server}/sessions/{session}/step", json=step, timeout=120).json()["done"]
    for forged in (
        {"reward": 1.0},
        {"success": True},
        {"reward_terms": {"tests_pass": 1.0}},
        {"verdict": {"status": "ok", "tests_failed": 0}},
        {"stop_reason": "passed"},
    ):
        refused = httpx.post(f"{server}/sessions/{session}/finish", json=forged, timeout=120)
        assert refused.status_code == 422, (forged, refused.text)
    reply = httpx.post(f"{server}/sessions/{session}/finish", json={}, timeout=300).json()
    result = reply["result"]
    assert result["status"] == "ok" and not result["success"]  # the bug is still there
    assert result["reward"] < 1.0 and result["reward_terms"]["tests_pass"] == 0.0
    assert unverified_reason(result["record"]) is None  # signed by the server's verifier


def test_a_task_is_an_id_in_the_servers_suite_never_a_file(suite, server, tmp_path):
    task_root = suite[1][0].root
    for task_id in (str(task_root), "../" + task_root.name, "/etc/passwd"):
        reply = _create(server, task_id)
        assert reply.status_code == 404 and "unknown task" in reply.text, reply.text
    smuggled = _create(server, suite[1][0].id, task={"repo": {"app.py": "x = 1"}})
    assert smuggled.status_code == 422
    forwarded = httpx.post(
        f"{server}/sessions",
        timeout=60,
        json={
            "task_id": suite[1][0].id,
            "env": {"remote": "http://elsewhere"},
            "policy_name": "a",
            "episode_id": "a",
        },
    )
    assert forwarded.status_code == 422 and "remote" in forwarded.text


def test_health_readiness_and_metrics(server):
    assert httpx.get(f"{server}/healthz", timeout=10).json() == {"status": "ok"}
    ready = httpx.get(f"{server}/readyz", timeout=10).json()
    assert ready["status"] == "ready" and ready["workers"] == 2
    m = httpx.get(f"{server}/metrics", timeout=10).json()
    for key in ("sessions_open", "steps_per_s", "queue_depth", "verdict_s_mean", "worker_pids"):
        assert key in m
