"""The environment server follows its suite folder (issue 47): on a cluster it starts before
the flow generates the suite on the shared volume, so a worker starts on an absent or empty
folder and reads the suite again when a session names a task it lacks or the folder changed
(a suite regenerated under the same ids gives the new tasks). Real servers on loopback."""

from __future__ import annotations

import httpx

from components.env.config import EnvConfig
from components.evaluate.episodes import run_policy
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks
from tests.env_service.served_env import served
from tests.env_service.test_service_attacks import _create


def _suite(folder, seed: int, overwrite: bool = False):
    generate_suite(folder, 2, seed, overwrite=overwrite)
    tasks, errors = load_tasks(folder)
    assert not errors and len(tasks) == 2
    return tasks


def _oracle(tasks, url: str):
    return run_policy(
        tasks,
        "oracle",
        rollout=RolloutConfig(),
        env=EnvConfig(remote=url),
        sandbox=SandboxConfig(),
        workers=1,
        seed=3,
    )


def _instruction_served(url: str, task_id: str) -> str:
    """The instruction the server's episode shows for `task_id` (the session is dropped)."""
    reply = _create(url, task_id)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    httpx.delete(f"{url}/sessions/{body['session']}", timeout=60)
    return str(body["events"])


def test_a_server_started_on_an_empty_folder_serves_the_suite_generated_later(tmp_path):
    folder = tmp_path / "tasks"  # absent at the start, as /shared/tasks before `generate`
    with served(folder, workers=1) as (url, _proc):
        assert httpx.get(f"{url}/readyz", timeout=10).json()["tasks"] == 0
        missing = _create(url, "test-0001")
        assert missing.status_code == 404 and "unknown task" in missing.text, missing.text
        tasks = _suite(folder, 0)
        results = _oracle(tasks, url)
        assert [r.status for r in results] == ["ok", "ok"]
        assert all(r.success and r.reward > 0 for r in results)  # the oracle's right verdict
        assert httpx.get(f"{url}/readyz", timeout=10).json()["tasks"] == 2
        wrong = _create(url, "test-9999")  # an id still unknown after the new read
        assert wrong.status_code == 404 and "unknown task" in wrong.text, wrong.text


def test_a_suite_regenerated_under_the_same_ids_gives_the_new_tasks(tmp_path):
    folder = tmp_path / "tasks"
    old = _suite(folder, 0)
    with served(folder, workers=1) as (url, _proc):
        assert old[0].instruction in _instruction_served(url, old[0].id)
        new = _suite(folder, 1, overwrite=True)
        assert [t.id for t in new] == [t.id for t in old]
        assert new[0].instruction != old[0].instruction
        assert new[0].instruction in _instruction_served(url, new[0].id)
        results = _oracle(new, url)  # the new reference fixes pass on the new repositories
        assert all(r.status == "ok" and r.success for r in results)
        (folder / "broken").mkdir()
        (folder / "broken" / "task.json").write_text("{")
        (folder / "suite.json").touch()
        invalid = _create(url, new[0].id)
        assert invalid.status_code == 500, invalid.text
        assert str(folder) in invalid.text and "invalid task" in invalid.text
