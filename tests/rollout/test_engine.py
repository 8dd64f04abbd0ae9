"""Rollout engine: token-exactness, log-probs, limits, groups, infra failures."""

from __future__ import annotations

import dataclasses

import pytest

from components.env.config import EnvConfig
from components.policy.chat import IM_END, prompt_ids
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import environment_turn_ids, sample_episodes
from components.sandbox.config import SandboxConfig
from components.typed_config import config_from_dict

SMALL = RolloutConfig(
    max_new_tokens=24, max_episode_tokens=1500, batch_size=3,
    samples_per_task=2, workers=2, temperature=1.0, seed=0,
)  # fmt: skip
ENV = EnvConfig(max_steps=3)  # assistant actions per episode: the environment's limit


def rebuild(tokenizer, rollout) -> tuple[list[int], list[int]]:
    """The token sequence from its parts: first prompt, then per turn the sampled ids and the
    environment turn (closing <|im_end|> if the turn was cut)."""
    events = rollout.result.record["trajectory"]
    ids = prompt_ids(tokenizer, events[:1])
    mask = [0] * len(ids)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    for i, event in enumerate(events):
        if event["role"] != "assistant":
            continue
        ids += event["token_ids"]
        mask += [1] * len(event["token_ids"])
        nxt = events[i + 1]
        if i + 2 < len(events):  # another turn followed: the observation went in as context
            closed = bool(event["token_ids"]) and event["token_ids"][-1] == eos
            ctx = environment_turn_ids(tokenizer, nxt["observation"], closed)
            ids += ctx
            mask += [0] * len(ctx)
    return ids, mask


@pytest.fixture(scope="module")
def sampled(model, tokenizer, tasks):
    return sample_episodes(tasks, model, tokenizer, SMALL, ENV, SandboxConfig())


def test_config_is_validated_and_documented():
    for f in dataclasses.fields(RolloutConfig):
        assert f.metadata.get("help"), f.name
    for bad in ({"backend": "tgi"}, {"top_p": 0.0}, {"temperature": -1.0},
                {"samples_per_task": 0}, {"max_wall_s": 0}):  # fmt: skip
        with pytest.raises(ValueError):
            RolloutConfig(**bad)
    with pytest.raises(ValueError, match="unknown key"):
        config_from_dict(RolloutConfig, {"temprature": 1.0})


def test_groups_and_untrained_model_sanity(sampled, tasks):
    """K samples per task, grouped and ordered; an untrained model's episodes end by a limit,
    count their invalid calls and are verified (a reward, not a crash)."""
    assert [(r.group_id, r.sample_index) for r in sampled] == [
        (t.id, k) for t in tasks for k in range(SMALL.samples_per_task)
    ]
    assert len({r.result.episode_id for r in sampled}) == len(sampled)
    for r in sampled:
        assert not r.infra_failure, r.result.infra_detail
        assert r.result.end_reason in ("max_steps", "token_limit", "finished")
        assert r.result.reward is not None
        assert r.result.steps <= ENV.max_steps
        assert r.result.record["metadata"]["num_tokens"] == len(r.input_ids)
    assert sum(r.result.invalid_calls for r in sampled) > 0


def test_token_exactness(sampled, tokenizer):
    """input_ids = prompt ids + sampled ids + environment-turn ids, nothing re-tokenized."""
    for r in sampled:
        assert len(r.input_ids) == len(r.assistant_mask) == len(r.sampling_logprobs)
        ids, mask = rebuild(tokenizer, r)
        assert ids == r.input_ids
        assert mask == r.assistant_mask
        sampled_ids = [t for e in r.result.record["trajectory"] if e["role"] == "assistant"
                       for t in e["token_ids"]]  # fmt: skip
        assert sampled_ids == [t for t, m in zip(r.input_ids, r.assistant_mask, strict=True) if m]
        assert all(
            lp == 0.0 for lp, m in zip(r.sampling_logprobs, r.assistant_mask, strict=True) if not m
        )


def test_stored_logprobs_match_a_forward_pass(sampled, model):
    """At T=1, log p(sampled token) recomputed on the stored ids equals the stored value."""
    import torch

    from components.train.losses import token_logprobs

    for r in sampled:
        ids = torch.tensor([r.input_ids])
        with torch.no_grad():
            lp = token_logprobs(model(ids).logits, ids, temperature=1.0)[0]  # [T-1]
        mask = torch.tensor(r.assistant_mask[1:], dtype=torch.bool)
        stored = torch.tensor(r.sampling_logprobs[1:])
        assert mask.any()
        assert torch.allclose(lp[mask], stored[mask], atol=1e-4), (
            (lp[mask] - stored[mask]).abs().max()
        )


def test_token_limit_ends_the_episode(model, tokenizer, tasks):
    """A budget of the task prompt + ~one turn: one step, then the next turn cannot fit."""
    from components.env.episode import initial_message

    task = tasks[0]
    first = len(prompt_ids(tokenizer, [{"role": "user", "content": initial_message(task)}]))
    limit = first + 40
    config = dataclasses.replace(SMALL, max_episode_tokens=limit, samples_per_task=1,
                                 max_new_tokens=24)  # fmt: skip
    (r,) = sample_episodes([task], model, tokenizer, config, EnvConfig(max_steps=10),
                           SandboxConfig())  # fmt: skip
    assert r.result.end_reason == "token_limit" and r.result.steps >= 1
    assert r.result.record["metadata"]["end_reason"] == "token_limit"
    assert len(r.input_ids) <= limit
    assert r.result.reward is not None


def _scripted(tokenizer, texts: list[str]):
    """A generate_fn that plays `texts` in turn for every episode (ids from the tokenizer)."""
    calls = {"n": 0}

    def generate(prompts, caps, seed):
        text = texts[min(calls["n"], len(texts) - 1)]
        calls["n"] += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [Completion(ids[:cap], [-0.5] * len(ids[:cap]),
                           "stop" if len(ids) <= cap else "length") for cap in caps]  # fmt: skip

    return generate


def test_cut_turn_is_closed_as_context_and_finish_ends(model, tokenizer, tasks):
    """A turn without <|im_end|> (cut, or a backend that drops it) is closed by a context
    <|im_end|> the policy is not trained on; a finish call ends the episode."""
    finish = '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>' + IM_END
    generate = _scripted(tokenizer, ["no tool call, and no end of turn", finish])
    config = dataclasses.replace(SMALL, samples_per_task=1, max_new_tokens=128)
    (r,) = sample_episodes(tasks[:1], model, tokenizer, config, ENV, SandboxConfig(),
                           generate_fn=generate)  # fmt: skip
    assert r.result.end_reason == "finished" and r.result.steps == 2
    assert r.result.invalid_calls == 1
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    first_turn = r.result.record["trajectory"][1]["token_ids"]
    assert eos not in first_turn
    start = len(prompt_ids(tokenizer, r.result.record["trajectory"][:1]))
    after = start + len(first_turn)
    assert r.input_ids[after] == eos and r.assistant_mask[after] == 0  # closed as context
    assert r.input_ids[-1] == eos and r.assistant_mask[-1] == 1  # the sampled end of turn
    assert rebuild(tokenizer, r)[0] == r.input_ids


def test_time_limit(model, tokenizer, tasks):
    generate = _scripted(tokenizer, ["thinking..." + IM_END])
    config = dataclasses.replace(SMALL, samples_per_task=1, max_wall_s=1e-6)
    (r,) = sample_episodes(tasks[:1], model, tokenizer, config, EnvConfig(max_steps=5),
                           SandboxConfig(),
                           generate_fn=generate)  # fmt: skip
    assert r.result.end_reason == "time_limit" and r.result.steps == 1


def test_backend_failure_is_a_flagged_infra_failure(model, tokenizer, tasks):
    def broken(prompts, caps, seed):
        raise ConnectionError("server went away")

    config = dataclasses.replace(SMALL, samples_per_task=2)
    rollouts = sample_episodes(tasks, model, tokenizer, config, ENV, SandboxConfig(),
                               generate_fn=broken)  # fmt: skip
    assert len(rollouts) == 4
    for r in rollouts:
        assert r.infra_failure and r.result.status == "infra_failure"
        assert r.result.reward is None and "server went away" in r.result.infra_detail
        assert r.result.record["metadata"]["status"] == "infra_failure"


def test_a_greedy_model_episode_runs_to_the_step_limit(model, tokenizer, tasks):
    """A model evaluated on a task (one greedy episode, through the engine) is stopped by the
    environment's step limit and verified."""
    config = RolloutConfig(temperature=0.0, max_new_tokens=16, samples_per_task=1)
    (r,) = sample_episodes(tasks[:1], model, tokenizer, config, EnvConfig(max_steps=2),
                           SandboxConfig())  # fmt: skip
    assert r.result.status == "ok" and r.result.end_reason == "max_steps" and r.result.steps == 2


def test_tool_and_verifier_crashes_are_flagged_infra_failures(model, tokenizer, tasks, monkeypatch):
    """A crash while stepping aborts the episode; a crash in verification after the episode
    ended keeps its end reason. Neither is verified or rewarded, and the run goes on."""
    from components.env import episode

    finish = '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>' + IM_END
    config = dataclasses.replace(SMALL, samples_per_task=1)

    def crash(*args, **kwargs):
        raise OSError("harness broke")

    with monkeypatch.context() as m:
        m.setattr(episode.EpisodeEnv, "step", crash)
        rollouts = sample_episodes(tasks, model, tokenizer, config, ENV, SandboxConfig(),
                                   generate_fn=_scripted(tokenizer, [finish]))  # fmt: skip
    for r in rollouts:
        assert r.infra_failure and r.result.reward is None
        assert r.result.end_reason == "infra_failure"
        assert r.result.infra_detail.startswith("tool execution failed: OSError")
        assert r.result.record["metadata"]["num_tokens"] == len(r.input_ids)
    monkeypatch.setattr(episode, "verify", crash)
    rollouts = sample_episodes(tasks, model, tokenizer, config, ENV, SandboxConfig(),
                               generate_fn=_scripted(tokenizer, [finish]))  # fmt: skip
    for r in rollouts:
        assert r.infra_failure and r.result.end_reason == "finished"
        assert r.result.infra_detail.startswith("verification failed: OSError")
        assert r.result.final_diff is None and r.result.record["final_diff"] is None


def test_the_served_backend_refuses_a_model_for_its_client():
    import pytest
    import torch

    from components.rollout.config import RolloutConfig
    from components.rollout.engine import make_generate_fn

    with pytest.raises(TypeError, match="rollout.backend is openai"):
        make_generate_fn(torch.nn.Linear(1, 1), None, RolloutConfig(backend="openai"))
