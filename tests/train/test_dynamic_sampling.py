"""Dynamic sampling (DAPO) and the curriculum: which groups carry variance (hand-made
groups), the resampling loop on a scripted sampler, the task stream's replacements and
curriculum order, and tiny GRPO runs: a group with equal rewards is replaced, an iteration
with none left does no update, and a killed run resumes exactly with dynamic sampling on.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from components.env.episode import EpisodeResult
from components.policy.chat import IM_END, format_tool_call
from components.rollout.completion import Completion
from components.rollout.engine import Rollout
from components.sandbox.config import SandboxConfig
from components.train.config import GRPOConfig
from components.train.grpo import (
    curriculum_order,
    informative_groups,
    pass_rates,
    train_grpo,
    write_pass_rates,
)
from components.train.grpo.sources import EpisodeSettings, task_stream
from components.train.losses import token_logprobs
from components.train.task_stream import TaskStream, pick_tasks, sample_informative
from tests.train.test_grpo import ENV, ROLLOUT, TIMING


def result(task: str, reward: float | None, success: bool = False) -> EpisodeResult:
    return EpisodeResult(
        episode_id="e", task_id=task, split="train", policy="p",
        status="ok" if reward is not None else "infra_failure", end_reason="finished",
        success=success, reward=reward, reward_terms={}, steps=1, tool_calls=1,
        invalid_calls=0, safety_flags=[], ran_tests=True, tests_total=1, tests_failed=0,
        changed_files=[], tampered_files=[], wall_s=0.0,
    )  # fmt: skip


def episode(group: str, reward: float | None, index: int = 0) -> Rollout:
    return Rollout(result(group, reward), [1, 2], [0, 1], [0.0, -1.0], group, index)


def test_informative_groups_keeps_the_groups_whose_rewards_differ():
    """a: all equal (dropped); b: mixed (kept); c: mixed but for an infra failure, its two
    valid rewards equal (dropped); d: one valid episode left (dropped); e: mixed with an
    infra failure (kept, the failure too: the update drops it); f: a single episode."""
    rollouts = [
        episode("a", 1.0), episode("a", 1.0),
        episode("b", 0.0), episode("b", 1.0),
        episode("c", 0.5), episode("c", None), episode("c", 0.5),
        episode("d", 1.0), episode("d", None),
        episode("e", None), episode("e", 0.0), episode("e", -0.1),
        episode("f", 1.0),
    ]  # fmt: skip
    kept, dropped = informative_groups(rollouts)
    assert kept == [2, 3, 9, 10, 11]
    assert dropped == ["a", "c", "d", "f"]
    assert informative_groups([]) == ([], [])
    # Float noise of a reward sum is no variance.
    assert informative_groups([episode("g", 0.3), episode("g", 0.1 + 0.2)]) == ([], ["g"])


class FakeTask:
    def __init__(self, task_id: str):
        self.id = task_id


def test_sample_informative_replaces_equal_groups_round_by_round():
    """Rewards by task: t1 and t3 equal, t2, t4, t5 mixed. 3 tasks wanted, first t1 t2 t3:
    round 1 replaces the two dropped with the next two further tasks (t4, t5)."""
    mixed = {"t2", "t4", "t5"}
    tasks = [FakeTask(f"t{i}") for i in range(1, 7)]
    calls = []

    def sample_round(batch, round_):
        calls.append(([t.id for t in batch], round_))
        return [episode(t.id, float(i % 2 and t.id in mixed), i) for t in batch for i in range(2)]

    def replacements(drawn, count):
        return [t for t in tasks if t.id not in drawn][:count]

    kept, numbers = sample_informative(tasks[:3], sample_round, replacements, True, 2)
    assert calls == [(["t1", "t2", "t3"], 0), (["t4", "t5"], 1)]
    assert [r.group_id for r in kept] == ["t2", "t2", "t4", "t4", "t5", "t5"]
    assert numbers == {"groups_sampled": 5, "groups_zero_variance": 2,
                       "zero_variance_share": 0.4, "resample_rounds": 1,
                       # every episode sampled, dropped groups included: rewards 0,0 0,1 0,0
                       # 0,1 0,1 (the kept groups alone would say 0.5)
                       "sampled_episodes": 10, "sampled_success_rate": 0.0,
                       "sampled_mean_reward": pytest.approx(0.3),
                       "sampled_tokens": 10 * kept[0].num_generated_tokens}  # fmt: skip
    # Rounds run out: one round only, replacements t4 t5 -> t6 would be next.
    mixed.discard("t5")
    calls.clear()
    kept, numbers = sample_informative(tasks[:3], sample_round, replacements, True, 1)
    assert [r.group_id for r in kept] == ["t2", "t2", "t4", "t4"]
    assert numbers["resample_rounds"] == 1 and numbers["groups_zero_variance"] == 3
    # Off: round 0 as sampled, the equal groups counted but kept.
    calls.clear()
    kept, numbers = sample_informative(tasks[:3], sample_round, replacements, False, 2)
    assert len(kept) == 6 and calls == [(["t1", "t2", "t3"], 0)]
    assert numbers == {"groups_sampled": 3, "groups_zero_variance": 2,
                       "zero_variance_share": pytest.approx(2 / 3), "resample_rounds": 0,
                       "sampled_episodes": 6, "sampled_success_rate": 0.0,
                       "sampled_mean_reward": pytest.approx(1 / 6),
                       "sampled_tokens": 6 * kept[0].num_generated_tokens}  # fmt: skip


def test_replacements_peek_at_the_stream_without_consuming_it():
    tasks = [FakeTask(f"t{i}") for i in range(5)]
    stream = TaskStream(tasks, seed=3, per_iteration=2)
    first = stream.at(2)
    assert [t.id for t in first] == [f"t{i}" for i in pick_tasks(5, 2, 2, 3)]
    further = stream.replacements(2)
    drawn = {t.id for t in first}
    picked = further(drawn, 3)
    assert len(picked) == 3 and not drawn & {t.id for t in picked}
    assert [t.id for t in picked] == [t.id for t in stream.replacements(2)(drawn, 3)]
    assert len(further(drawn | {t.id for t in picked}, 5)) == 0  # all 5 drawn
    assert [t.id for t in stream.at(3)] == [f"t{i}" for i in pick_tasks(5, 4, 2, 3)]


def test_pass_rates_of_a_screen_and_the_curriculum_order(tmp_path):
    episodes = [result("a", 1.0, True), result("a", 0.0), result("a", None),
                result("b", 0.0), result("b", 0.0), result("c", 1.0, True),
                result("d", 1.0, True), result("d", 1.0, True), result("d", 0.0),
                result("e", None)]  # fmt: skip
    rates = write_pass_rates(tmp_path / "rates.json", episodes)
    assert rates == pass_rates(episodes) == {"a": 0.5, "b": 0.0, "c": 1.0, "d": 2 / 3}
    assert json.loads((tmp_path / "rates.json").read_text()) == pytest.approx(rates)
    ids = ["c", "b", "d", "x", "a", "e"]  # x, e: not screened (e: only an infra failure)
    order = curriculum_order(ids, rates)
    assert [ids[i] for i in order] == ["a", "d", "x", "e", "b", "c"]


def test_the_stream_walks_the_curriculum_order(tmp_path):
    tasks = [FakeTask(t) for t in ("never", "half", "always", "often")]
    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"never": 0.0, "half": 0.5, "always": 1.0, "often": 0.9}))
    config = GRPOConfig(tasks_per_iteration=3, task_pass_rates=str(path))
    stream = task_stream(EpisodeSettings(tasks, config, ROLLOUT, ENV, SandboxConfig()))
    assert [t.id for t in stream.at(1)] == ["half", "often", "never"]
    assert [t.id for t in stream.at(2)] == ["always", "half", "often"]  # walked again
    path.write_text(json.dumps({"half": 1.5}))
    with pytest.raises(ValueError, match="half"):
        task_stream(EpisodeSettings(tasks, config, ROLLOUT, ENV, SandboxConfig()))


def test_config_fields_are_validated():
    for bad in ({"max_resample_rounds": -1}, {"sync_probe_tolerance": -0.1}):
        with pytest.raises(ValueError):
            GRPOConfig(**bad)
    assert GRPOConfig().dynamic_sampling is False and GRPOConfig().task_pass_rates == ""


def hopeless_generate(model, tokenizer, tasks, hopeless: set[str]):
    """test_grpo.scripted_generate, but every sample of a `hopeless` task gives up (its
    group's rewards are all equal); the others alternate fix / give up."""
    files = {t.id: t.reference_patch().splitlines()[0].removeprefix("--- a/") for t in tasks}
    fix = {t.id: format_tool_call("apply_patch", {"patch": t.reference_patch()}) for t in tasks}
    give_up = format_tool_call("finish", {"summary": "no idea"}) + IM_END

    def generate(prompts, caps, seed):
        out = []
        for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
            text = tokenizer.decode(prompt)
            (task_id,) = [tid for tid, f in files.items() if f in text]
            body = fix[task_id] + IM_END if i % 2 == 0 and task_id not in hopeless else give_up
            ids = tokenizer(body, add_special_tokens=False)["input_ids"][:cap]
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                lp = token_logprobs(model(full).logits, full)[0, len(prompt) - 1 :]
            out.append(Completion(ids, lp.tolist(), "stop" if len(ids) < cap else "length"))
        return out

    return generate


def _run(model, tokenizer, tasks, out, iterations, hopeless, **overrides):
    config = GRPOConfig(
        iterations=iterations, tasks_per_iteration=1, group_size=2, learning_rate=1e-3,
        micro_batch_size=1, output_dir=str(out), dynamic_sampling=True, beta=0.05,
        **overrides,
    )  # fmt: skip
    return train_grpo(model, tokenizer, tasks, config, ROLLOUT, ENV, SandboxConfig(),
                      generate_fn=hopeless_generate(model, tokenizer, tasks, hopeless))  # fmt: skip


def test_a_group_without_variance_is_replaced(tiny_policy, suite, tmp_path):
    """Two tasks, one per iteration, the first hopeless: an iteration that drew it samples
    the other in one more round and trains on that group alone; KL and entropy logged."""
    model, tokenizer = tiny_policy
    _, tasks = suite
    result = _run(model, tokenizer, tasks, tmp_path, 3, {tasks[0].id})
    for row in result.metrics:
        replaced = row["groups_zero_variance"] == 1
        assert row["resample_rounds"] == int(replaced)
        assert row["groups_sampled"] == 1 + int(replaced)
        assert row["zero_variance_share"] == (0.5 if replaced else 0.0)
        assert row["episodes"] == 2 and row["success_rate"] == 0.5 and row["optimizer_steps"] == 1
        assert row["entropy"] > 0 and row["kl"] >= 0
    assert any(row["resample_rounds"] for row in result.metrics)


def test_an_iteration_without_variance_does_no_update(tiny_policy, suite, tmp_path):
    model, tokenizer = tiny_policy
    _, tasks = suite
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = _run(model, tokenizer, tasks, tmp_path, 1, {t.id for t in tasks},
                  max_resample_rounds=3)  # fmt: skip
    (row,) = result.metrics
    assert row["optimizer_steps"] == 0 and row["episodes"] == 0
    assert row["resample_rounds"] == 1  # the one other task; then nothing is left to draw
    assert row["groups_sampled"] == row["groups_zero_variance"] == 2
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_resume_with_dynamic_sampling_ends_where_an_uninterrupted_run_ends(
    tiny_config, suite, tmp_path
):
    from components.policy.model import build_policy

    _, tasks = suite
    hopeless = {tasks[0].id}
    model, tokenizer = build_policy(tiny_config)
    straight = _run(model, tokenizer, tasks, tmp_path / "straight", 4, hopeless)
    first, tokenizer = build_policy(tiny_config)
    _run(first, tokenizer, tasks, tmp_path / "killed", 2, hopeless)
    fresh, tokenizer = build_policy(tiny_config)
    resumed = _run(fresh, tokenizer, tasks, tmp_path / "killed", 4, hopeless)
    assert resumed.resumed_from == 2
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]

    assert strip(straight.metrics[2:]) == strip(resumed.metrics)
    assert [r["data_position"] for r in straight.metrics] == [1, 2, 3, 4]


def test_settings_are_plain_data():
    """The stream pickles into the rollout process (async_rollouts.ServedSampler)."""
    import pickle

    stream = TaskStream([FakeTask("a")], 0, 1, (0,))
    assert pickle.loads(pickle.dumps(stream)).order == (0,)
    assert dataclasses.is_dataclass(stream)


def test_the_curriculum_file_is_part_of_the_run_fingerprint(tiny_policy, suite, tmp_path):
    """A resumed run must walk the same order: the file's content is in the config hash;
    a missing file stops the run before anything starts."""
    from components.train.grpo import config_hash

    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"a": 0.5}))
    config = GRPOConfig(task_pass_rates=str(path))
    before = config_hash(config, ROLLOUT, ENV, SandboxConfig())
    path.write_text(json.dumps({"a": 0.0}))
    assert config_hash(config, ROLLOUT, ENV, SandboxConfig()) != before
    model, tokenizer = tiny_policy
    missing = GRPOConfig(task_pass_rates=str(tmp_path / "none.json"), output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="task_pass_rates: no file"):
        train_grpo(model, tokenizer, suite[1], missing, ROLLOUT, ENV, SandboxConfig())
