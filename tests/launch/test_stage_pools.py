"""No pod beside the trainer runs an agent's action (issue 47): on Kubernetes, every stage
that executes agent actions runs in the sandbox pool (deny-all network) or behind the
environment server, where its Job carries AGENTRL_REQUIRE_ENV_REMOTE and an in-process
episode is refused. Fails on 271619e's map, which sent `train grpo` to the gpu pool and
`rollout sample`, `evaluate run` and `evaluate safety` to the cpu pool, with nothing
keeping their episodes out of those pods."""

from __future__ import annotations

import pytest

from components.env.config import EnvConfig
from components.launch.config import LauncherConfig
from components.launch.launcher import build_job

# Every stage whose command runs episodes or sandboxed task checks (written out here, not
# imported: the test must not inherit a shortened list).
EXECUTES_AGENT_ACTIONS = {
    "train grpo": [
        "train",
        "grpo",
        "--policy",
        "/shared/p",
        "--tasks",
        "/shared/tasks",
        "--out",
        "/shared/o",
    ],
    "rollout sample": [
        "rollout",
        "sample",
        "--policy",
        "/shared/p",
        "--tasks",
        "/shared/t",
        "--out",
        "/shared/o",
    ],
    "evaluate run": [
        "evaluate",
        "run",
        "--policy",
        "model:/shared/p",
        "--tasks",
        "/shared/t",
        "--out",
        "/shared/o",
    ],
    "evaluate safety": ["evaluate", "safety", "--policy", "model:/shared/p", "--out", "/s/o"],
    "env eval": ["env", "eval", "--tasks", "/shared/t", "--policy", "oracle", "--out", "/s/o"],
    "tasks check": ["tasks", "check", "/shared/tasks"],
    "tasks import": ["tasks", "import", "/shared/in", "--out", "/shared/tasks"],
}


def _env_of(job: dict) -> dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


@pytest.mark.parametrize("stage", sorted(EXECUTES_AGENT_ACTIONS))
def test_agent_stages_run_sandboxed_or_behind_the_environment_server(stage):
    config = LauncherConfig()
    job = build_job(stage.replace(" ", "-"), EXECUTES_AGENT_ACTIONS[stage], config)
    pool = job["metadata"]["labels"]["agentrl/pool"]
    if pool == "sandbox":
        return
    # (no such field before 6da1843: then no stage ran behind a server)
    behind_server = getattr(config, "env_server_stages", ())
    assert stage in behind_server, f"{stage} runs agent actions in pool {pool}, beside no server"
    assert _env_of(job).get("AGENTRL_REQUIRE_ENV_REMOTE") == "1", stage


def test_stages_that_execute_nothing_of_the_agents_are_not_restricted():
    job = build_job("sft", ["train", "sft", "--out", "/shared/o"], LauncherConfig())
    assert "AGENTRL_REQUIRE_ENV_REMOTE" not in _env_of(job)


def test_a_map_that_leaves_an_agent_stage_beside_the_trainer_is_refused():
    with pytest.raises(ValueError, match="'train grpo' executes agent actions in pool 'gpu'"):
        LauncherConfig(env_server_stages=())
    with pytest.raises(ValueError, match="'tasks check' executes agent actions in pool 'cpu'"):
        LauncherConfig(stage_pools={"train": "gpu"})


def test_a_pod_that_requires_the_server_refuses_an_in_process_episode(monkeypatch):
    from components.env_service.client import RemoteRequired, open_episode
    from components.evaluate.episodes import run_policy
    from components.rollout.config import RolloutConfig
    from components.sandbox.config import SandboxConfig

    monkeypatch.setenv("AGENTRL_REQUIRE_ENV_REMOTE", "1")
    with pytest.raises(RemoteRequired, match="set env.remote"):
        open_episode(None, EnvConfig(), SandboxConfig(), policy_name="model")
    with pytest.raises(RemoteRequired, match="set env.remote"):
        run_policy([], "oracle", rollout=RolloutConfig(), env=EnvConfig(), sandbox=SandboxConfig())
