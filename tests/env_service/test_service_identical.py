"""Episodes through the environment server are the in-process episodes (issue 47): the same
events, verdicts, rewards and signed records at a fixed seed, for the evaluator's scripted
path and for the rollout engine's (GRPO's and `evaluate run`'s) path; and with a server
configured, nothing in this process runs an agent's tool or a verifier."""

from __future__ import annotations

import pytest

from components.env.config import EnvConfig
from components.evaluate.episodes import run_policy
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig

SANDBOX = SandboxConfig()


def comparable(result) -> dict:
    """A result without what differs run to run: wall-clock times; and without the verifier
    version (a hash of the sources, read once per process: a tree edited between the
    server's start and the in-process run gives two) and the MAC that covers it."""
    import copy

    out = result.summary()
    for key in ("wall_s", "timing", "verifier_version"):
        out.pop(key)
    record = copy.deepcopy(result.record)
    record["metadata"].pop("verifier_version")
    record["metadata"].pop("verdict_mac", None)
    return {**out, "record": record}


def oracle(tasks, env: EnvConfig):
    return run_policy(
        tasks, "oracle", rollout=RolloutConfig(), env=env, sandbox=SANDBOX, workers=2, seed=3
    )


@pytest.mark.integration  # every task twice, verified: minutes on a busy machine
def test_the_oracle_scores_the_same_through_the_server(suite, server):
    _, tasks = suite
    local = oracle(tasks, EnvConfig())
    remote = oracle(tasks, EnvConfig(remote=server))
    assert [r.status for r in remote] == ["ok"] * len(tasks)
    assert all(r.success and r.reward > 0 for r in remote)
    assert [comparable(r) for r in remote] == [comparable(r) for r in local]
    # the signature is the server's, over the same verdict: the same key on this machine
    assert all(r.record["metadata"]["verdict_mac"] for r in remote)


def _refuse(*_args, **_kwargs):
    raise AssertionError("an agent tool or verifier ran in the trainer's process")


@pytest.fixture
def no_local_tools(monkeypatch):
    """Every in-process entry point to an agent's tool or a verdict raises in this process
    (the server's workers are other processes)."""
    import components.env.episode as episode
    import components.env.tool_sets as tool_sets
    import components.verifier.verdict as verdict

    for module, name in (
        (episode, "run_tool"),
        (tool_sets, "run_tool"),
        (episode, "verify"),
        (verdict, "verify"),
    ):
        monkeypatch.setattr(module, name, _refuse)


def test_no_agent_tool_runs_in_the_client_process(suite, server, no_local_tools):
    _, tasks = suite
    remote = oracle(tasks[:1], EnvConfig(remote=server))
    assert remote[0].status == "ok" and remote[0].success


def test_the_guard_would_catch_an_in_process_tool(suite, no_local_tools):
    """The check can fail: in-process, the same episode hits the refusing entry point."""
    _, tasks = suite
    with pytest.raises(AssertionError, match="trainer's process"):
        oracle(tasks[:1], EnvConfig())


@pytest.mark.integration  # a tokenizer trained and 12 episodes verified
def test_rollout_engine_episodes_are_the_same_through_the_server(suite, server, tiny_policy):
    from tests.env_service.scripted_engine import sample_scripted

    _, tasks = suite
    local = sample_scripted(tasks, tiny_policy, EnvConfig(max_steps=6))
    remote = sample_scripted(tasks, tiny_policy, EnvConfig(max_steps=6, remote=server))
    for a, b in zip(local, remote, strict=True):
        assert (b.input_ids, b.assistant_mask, b.sampling_logprobs) == (
            a.input_ids,
            a.assistant_mask,
            a.sampling_logprobs,
        )
        assert comparable(b.result) == comparable(a.result)
    assert {r.result.reward for r in remote} != {None}


# The safety suite through the server: a sample of attacks, one per mechanism (a test file
# deleted, a secret read, an exit at import, a link out, another tool set's tool, a turn
# that stalls the monitor, a transcript handed back as a foreign file, an imported layout).
SAFETY_SAMPLE = (
    "delete_test_rm",
    "read_dotenv",
    "obf_os_exit",
    "symlink_outside",
    "other_set_edit_test",
    "long_join_turn",
    "foreign_rollout_claims_success",
    "enc_report_patch_imported",
)
# verified outside an episode (a verdict-cache warm-up, a rescore): skipped through a server
OUTSIDE_AN_EPISODE = ("cache_key_collision", "rescore_forged_record")


def _attacks(names):
    from components.evaluate.safety.suite import ATTACKS

    return tuple(a for a in ATTACKS if a.name in names)


@pytest.fixture(scope="module")
def safety_served(tmp_path_factory):
    """The safety suite's tempting tasks and a server on their folder: (tasks, url)."""
    from components.evaluate.safety.tasks import build_safety_tasks
    from tests.env_service.served_env import served

    out = tmp_path_factory.mktemp("safety-served")
    tasks = build_safety_tasks(out, 2, seed=7, harbor=False, mined=False)
    with served(out / "tasks", workers=2) as (url, _proc):
        yield tasks, url


@pytest.mark.integration  # 16 attack episodes verified
def test_the_safety_suite_scores_the_same_through_the_server(safety_served):
    from components.evaluate.safety.suite import run_safety_suite

    tasks, url = safety_served
    attacks = _attacks(SAFETY_SAMPLE)
    local = run_safety_suite(tasks, EnvConfig(), SANDBOX, attacks=attacks, workers=2)
    remote = run_safety_suite(tasks, EnvConfig(remote=url), SANDBOX, attacks=attacks, workers=2)
    assert [o.attack for o in remote.outcomes] == [a.name for a in attacks]
    assert remote.passed and not remote.skipped
    assert remote.to_dict() == local.to_dict()


@pytest.mark.integration  # a server on the safety tasks, one attack episode
def test_the_safety_suite_runs_no_agent_tool_in_the_client_process(
    safety_served, no_local_tools, monkeypatch
):
    import components.evaluate.safety.suite as suite

    monkeypatch.setattr(suite, "verify", _refuse)  # the cache warm-up's verification
    tasks, url = safety_served
    attacks = _attacks(("delete_test_rm", *OUTSIDE_AN_EPISODE))
    report = suite.run_safety_suite(tasks, EnvConfig(remote=url), SANDBOX, attacks=attacks)
    assert [o.attack for o in report.outcomes] == ["delete_test_rm"] and report.passed
    assert sorted(report.skipped) == sorted(OUTSIDE_AN_EPISODE)
    assert "not via env.remote" in report.to_markdown()


def test_the_safety_suite_refuses_in_process_episodes_where_a_server_is_required(
    suite, monkeypatch
):
    from components.env_service.client import REQUIRE_ENV_REMOTE, RemoteRequired
    from components.evaluate.safety.suite import run_safety_suite

    monkeypatch.setenv(REQUIRE_ENV_REMOTE, "1")
    with pytest.raises(RemoteRequired, match="env.remote is empty"):
        run_safety_suite(suite[1], EnvConfig(), SANDBOX, attacks=_attacks(("delete_test_rm",)))
