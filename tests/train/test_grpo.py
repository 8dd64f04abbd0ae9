"""GRPO loop: infra failures out of the group statistics, a tiny run that learns something,
and resume equivalence (a run killed and resumed ends where an uninterrupted run ends).

Episodes are real (sandboxed, verified) but scripted: `scripted_generate` plays the oracle
fix as an apply_patch call for even samples and a bare finish for odd ones, so the rewards
of a group differ. Its log-probs come from a forward pass of the model being trained on
exactly the scripted ids, so they are what the model's own sampler would have stored and
the first ratio of each iteration is 1.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from components.env.config import EnvConfig
from components.policy.chat import IM_END, format_tool_call
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig
from components.train.checkpoints import latest_checkpoint
from components.train.config import GRPOConfig
from components.train.grpo import (
    main_grpo,
    pick_tasks,
    rollout_rewards,
    rollout_turn_advantages,
    token_turns,
    train_grpo,
)
from components.train.losses import group_advantages, token_logprobs

ROLLOUT = RolloutConfig(
    max_new_tokens=400, max_episode_tokens=1024, batch_size=8,
    samples_per_task=2, workers=1, temperature=1.0,
)  # fmt: skip
ENV = EnvConfig(max_steps=1)
# Metrics that depend on the wall clock, not on the computation.
TIMING = {"sample_seconds", "update_seconds", "iteration_seconds", "tokens_per_s",
          "sample_tokens_per_s", "rollout_wait_seconds"}  # fmt: skip


def scripted_generate(model, tokenizer, tasks, fail_index: int | None = None, give_up=None):
    """Batch position i (task-major, sample-minor on the first turn): even -> the task's
    reference patch, odd -> finish without a fix (or the `give_up` call text); `fail_index`
    -> a backend error."""
    files = {t.id: t.reference_patch().splitlines()[0].removeprefix("--- a/") for t in tasks}
    fix = {t.id: format_tool_call("apply_patch", {"patch": t.reference_patch()}) for t in tasks}
    give_up = (give_up or format_tool_call("finish", {"summary": "no idea"})) + IM_END

    def generate(prompts, caps, seed):
        out = []
        for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
            if i == fail_index:
                out.append(Completion(error="backend failed: scripted"))
                continue
            text = tokenizer.decode(prompt)
            (task_id,) = [tid for tid, f in files.items() if f in text]
            body = fix[task_id] + IM_END if i % 2 == 0 else give_up
            ids = tokenizer(body, add_special_tokens=False)["input_ids"][:cap]
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                lp = token_logprobs(model(full).logits, full)[0, len(prompt) - 1 :]  # [len(ids)]
            out.append(Completion(ids, lp.tolist(), "stop" if len(ids) < cap else "length"))
        return out

    return generate


def test_config_is_validated_and_documented():
    for f in dataclasses.fields(GRPOConfig):
        assert f.metadata.get("help"), f.name
    for bad in ({"group_size": 1}, {"iterations": 0}, {"learning_rate": 0.0}, {"beta": -1.0},
                {"loss_type": "ppo"}, {"epsilon_low": 1.0}, {"micro_batch_size": 0},
                {"top_entropy_quantile": 1.5}):  # fmt: skip
        with pytest.raises(ValueError):
            GRPOConfig(**bad)


def test_task_order_is_a_pure_function_of_seed_and_position():
    stream = pick_tasks(5, 0, 15, seed=3)
    assert sorted(stream[:5]) == sorted(stream[5:10]) == list(range(5))  # each epoch a permutation
    assert pick_tasks(5, 7, 4, seed=3) == stream[7:11]  # resuming at a position replays it
    assert pick_tasks(5, 0, 5, seed=4) != stream[:5]


def test_infra_failures_are_excluded_from_group_statistics(tiny_policy, suite):
    """Group of 3 where sample 2 hits a backend error: it has no reward, advantage 0, and
    the other two get exactly the advantages of a group of those two alone."""
    model, tokenizer = tiny_policy
    _, tasks = suite
    config = dataclasses.replace(ROLLOUT, samples_per_task=3)
    rollouts = sample_episodes(
        tasks[:1], model, tokenizer, config, ENV, SandboxConfig(),
        generate_fn=scripted_generate(model, tokenizer, tasks, fail_index=2),
    )  # fmt: skip
    assert [r.infra_failure for r in rollouts] == [False, False, True]
    rewards, group_ids, valid = rollout_rewards(rollouts)
    assert valid.tolist() == [True, True, False] and math.isnan(rewards[2])
    assert rewards[0] > rewards[1]  # the fix beats giving up
    for scale, loo in ((True, False), (False, False), (True, True)):
        adv = group_advantages(rewards, group_ids, scale_by_std=scale, leave_one_out=loo,
                               valid_mask=valid)  # fmt: skip
        alone = group_advantages(rewards[:2], group_ids[:2], scale_by_std=scale, leave_one_out=loo)
        assert adv[2] == 0.0
        torch.testing.assert_close(adv[:2], alone)
        assert adv[0] > 0 > adv[1]


def test_token_turns_numbers_each_completion():
    assert token_turns([0, 0, 1, 1, 0, 1, 0, 0, 1]) == [-1, -1, 0, 0, -1, 1, -1, -1, 2]
    assert token_turns([]) == []


def test_turn_credit_charges_the_wasted_turn_only(tiny_policy, suite):
    """Group of 2: the fix, and a try_fix before any listing (a wasted try, step reward
    -0.1). With turn credit the wasted turn's sampled tokens get less than their episode's
    advantage, the fix's turn more; tokens no turn sampled keep the episode advantage."""
    model, tokenizer = tiny_policy
    _, tasks = suite
    wasted = format_tool_call("try_fix", {"id": "cmp-1"})
    rollouts = sample_episodes(
        tasks[:1], model, tokenizer, ROLLOUT, ENV, SandboxConfig(),
        generate_fn=scripted_generate(model, tokenizer, tasks, give_up=wasted),
    )  # fmt: skip
    assert [r.result.step_rewards for r in rollouts] == [[0.0], [pytest.approx(-0.1)]]
    rewards, group_ids, valid = rollout_rewards(rollouts)
    episode = group_advantages(rewards, group_ids, valid_mask=valid)  # [2]
    tokens = rollout_turn_advantages(rollouts, episode, valid, group_ids, scale_by_std=True)
    for i, r in enumerate(rollouts):
        turns = token_turns(r.assistant_mask)
        own = [tokens[i, t].item() for t, k in enumerate(turns) if k == 0]
        other = [tokens[i, t].item() for t, k in enumerate(turns) if k == -1]
        assert own and other
        assert all((a > episode[i]) if i == 0 else (a < episode[i]) for a in own)
        assert other == pytest.approx([episode[i].item()] * len(other))


def test_turn_credit_without_process_rewards_is_plain_grpo(tiny_config, suite, tmp_path):
    """Fix vs finish: every step reward is 0, so turn credit adds nothing and the run ends
    with exactly the weights of plain GRPO."""
    from components.policy.model import build_policy

    _, tasks = suite
    plain, tokenizer = build_policy(tiny_config)
    _run(plain, tokenizer, tasks, tmp_path / "plain", 1)
    credited, tokenizer = build_policy(tiny_config)
    _run(credited, tokenizer, tasks, tmp_path / "credited", 1, turn_credit=True)
    for (name, a), (_, b) in zip(plain.state_dict().items(), credited.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name


def test_high_entropy_tokens_only_still_update(tiny_config, suite, tmp_path):
    """top_entropy_quantile 0.2: the policy term on a fifth of the tokens; the run updates
    the weights, differently from a run on all tokens."""
    from components.policy.model import build_policy

    _, tasks = suite
    full, tokenizer = build_policy(tiny_config)
    start = {k: v.clone() for k, v in full.state_dict().items()}
    _run(full, tokenizer, tasks, tmp_path / "full", 1)
    top, tokenizer = build_policy(tiny_config)
    result = _run(top, tokenizer, tasks, tmp_path / "top", 1, top_entropy_quantile=0.2)
    assert all(math.isfinite(v) for v in result.metrics[0].values())
    moved = [k for k, v in top.state_dict().items() if not torch.equal(v, start[k])]
    differs = [k for k, v in top.state_dict().items() if not torch.equal(v, full.state_dict()[k])]
    assert moved and differs


def _run(model, tokenizer, tasks, out, iterations, **overrides):
    config = GRPOConfig(
        iterations=iterations, tasks_per_iteration=1, group_size=2, learning_rate=1e-3,
        ppo_epochs=2, minibatch_size=1, micro_batch_size=1, output_dir=str(out),
        **overrides,
    )  # fmt: skip
    return train_grpo(
        model, tokenizer, tasks, config, ROLLOUT, ENV, SandboxConfig(),
        generate_fn=scripted_generate(model, tokenizer, tasks),
    )  # fmt: skip


def test_tiny_run_updates_the_policy(tiny_policy, suite, tmp_path):
    """2 iterations on 2 tasks, G=2, mu=2 with a KL reference: parameters change, every
    logged number is finite, the first ratio is 1 (stored log-probs = the model's)."""
    model, tokenizer = tiny_policy
    _, tasks = suite
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = _run(model, tokenizer, tasks, tmp_path, 2, beta=0.05, loss_type="token")
    assert result.iterations == 2 and len(result.metrics) == 2
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    for row in result.metrics:
        assert row["infra_failures"] == 0 and row["episodes"] == 2
        assert row["success_rate"] == 0.5  # one fix, one give-up per group
        assert row["optimizer_steps"] == 4  # 2 epochs x 2 minibatches of 1
        assert all(math.isfinite(v) for v in row.values()), row
        assert "reward/tests_pass" in row and row["reward/tests_pass"] == 0.5
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [1, 2]
    assert (tmp_path / "policy" / "config.json").is_file()
    assert latest_checkpoint(tmp_path).name == "iter-000002"


def test_resume_ends_where_an_uninterrupted_run_ends(tiny_config, suite, tmp_path):
    """4 iterations straight vs 2, then a fresh process state (new model object built from
    scratch) resumed to 4: identical weights and identical metrics of iterations 3-4."""
    from components.policy.model import build_policy

    _, tasks = suite
    model, tokenizer = build_policy(tiny_config)
    straight = _run(model, tokenizer, tasks, tmp_path / "straight", 4)

    first, tokenizer = build_policy(tiny_config)
    _run(first, tokenizer, tasks, tmp_path / "killed", 2, checkpoint_every=1)
    del first  # the "killed" process: nothing survives but the output folder
    fresh, tokenizer = build_policy(tiny_config)
    resumed = _run(fresh, tokenizer, tasks, tmp_path / "killed", 4)

    assert resumed.resumed_from == 2 and [r["iteration"] for r in resumed.metrics] == [3, 4]
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in straight.metrics[2:]]
    assert strip == [{k: v for k, v in r.items() if k not in TIMING} for r in resumed.metrics]
    logged = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in logged] == [1, 2, 3, 4]


def _write_preset(path, sections: dict):
    import yaml

    path.write_text(yaml.safe_dump(sections))
    return path


def test_cli_smoke(tiny_policy, suite, tmp_path, capsys):
    """main_grpo through its argument parser, sampling with the (untrained) model itself."""
    from components.policy.model import save_policy

    root, _ = suite
    policy_dir = save_policy(*tiny_policy, tmp_path / "start")
    capsys.readouterr()  # a library's first-import notice while saving is not the CLI's output
    preset = _write_preset(tmp_path / "preset.yaml", {
        "grpo": {"iterations": 1, "group_size": 2, "tasks_per_iteration": 1,
                 "learning_rate": 0.0001},
        "rollout": {"max_new_tokens": 8, "workers": 1},
        "env": {"max_steps": 1},
    })  # fmt: skip
    code = main_grpo(["--preset", str(preset), "--policy", str(policy_dir), "--tasks",
                      str(root), "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["iterations"] == 1 and out["last"]["episodes"] == 2
    assert (tmp_path / "run" / "policy" / "config.json").is_file()


def test_cli_reads_every_section_of_the_preset(tiny_policy, suite, tmp_path, monkeypatch):
    """Non-default values in the preset's grpo, rollout, env and sandbox sections reach the
    run: train_grpo gets them, the episodes are sampled with them, the metrics show them."""
    import components.train.grpo.cli as grpo
    import components.train.grpo.sources as sources
    from components.policy.model import save_policy

    root, _ = suite
    policy_dir = save_policy(*tiny_policy, tmp_path / "start")
    preset = _write_preset(tmp_path / "preset.yaml", {
        "grpo": {"iterations": 1, "tasks_per_iteration": 1, "group_size": 3,
                 "loss_type": "dr_grpo", "turn_credit": True, "ppo_epochs": 2,
                 "leave_one_out": True, "learning_rate": 0.0001, "seed": 7},
        "rollout": {"max_new_tokens": 6, "temperature": 0.7, "workers": 1},
        "env": {"max_steps": 1, "max_changed_files": 3, "tool_set": "fix_search",
                "weights": {"failed_fix_try": -0.07}},
        "sandbox": {"wall_time_s": 45.0, "memory_mb": 1536},
        # A preset is checked whole: fix_search's expert acts through the same tools.
        "pipeline": {"expert_policy": "oracle-fixes"},
    })  # fmt: skip
    seen: dict = {}
    real_train, real_sample = grpo.train_grpo, sources.sample_episodes

    def train(model, tokenizer, tasks, config, rollout_config, env_config, sandbox_config,
              **kwargs):  # fmt: skip
        seen["train"] = (config, rollout_config, env_config, sandbox_config, kwargs)
        return real_train(model, tokenizer, tasks, config, rollout_config, env_config,
                          sandbox_config, **kwargs)  # fmt: skip

    def sample(tasks, model, tokenizer, config, env_config, sandbox_config, **kwargs):
        seen["sample"] = (config, env_config, sandbox_config)
        return real_sample(tasks, model, tokenizer, config, env_config, sandbox_config, **kwargs)

    monkeypatch.setattr(grpo, "train_grpo", train)
    monkeypatch.setattr(sources, "sample_episodes", sample)
    out = tmp_path / "run"
    assert main_grpo(["--preset", str(preset), "--policy", str(policy_dir), "--tasks",
                      str(root), "--out", str(out), "--no-resume"]) == 0  # fmt: skip

    config, rollout_config, env_config, sandbox_config, kwargs = seen["train"]
    assert (config.loss_type, config.turn_credit, config.ppo_epochs, config.group_size,
            config.leave_one_out, config.seed) == ("dr_grpo", True, 2, 3, True, 7)  # fmt: skip
    assert config.output_dir == str(out) and kwargs == {"resume": False}
    assert (rollout_config.max_new_tokens, rollout_config.temperature) == (6, 0.7)
    assert env_config.max_steps == 1
    assert env_config.max_changed_files == 3 and env_config.weights.failed_fix_try == -0.07
    assert sandbox_config.wall_time_s == 45.0 and sandbox_config.memory_mb == 1536
    sampled, env_sampled, sandbox_sampled = seen["sample"]
    assert sampled.samples_per_task == 3 and sampled.temperature == 0.7
    assert sampled.max_new_tokens == 6
    assert (env_sampled, sandbox_sampled) == (env_config, sandbox_config)
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["episodes"] == 3 and row["mean_steps"] <= 1
    assert row["optimizer_steps"] == 2  # ppo_epochs x one whole-batch minibatch
    result = json.loads((out / "result.json").read_text())
    assert result["curves"]["episodes"] == [3]
