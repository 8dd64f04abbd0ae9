"""PPO with a value head (components/train/ppo.py): the math on hand-made tensors against
references written here from cleanrl's published formulas (loop form), then tiny runs on
real sandboxed, verified episodes (tests/train/test_grpo.py's scripted sampler: even samples
fix, odd ones give up).

cleanrl's ppo.py computes GAE over a flat stream of environment steps, `dones[t]` marking
a step that starts a new episode:

    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values

An episode's steps here are its sampled tokens: the reference lays every row's action
tokens end to end as such a stream (observation tokens are not steps), runs the loop, and
puts the results back at the tokens' positions.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from components.sandbox.config import SandboxConfig
from components.train.config import PPOConfig
from components.train.ppo import (
    explained_variance,
    gae,
    terminal_rewards,
    train_ppo,
    value_file,
    value_loss,
    whiten,
)
from tests.train.test_grpo import ENV, ROLLOUT, TIMING, scripted_generate


def cleanrl_gae(rewards, values, mask, gamma, lam):
    """The loop above over the rows' action tokens laid end to end (each row an episode
    ending in a terminal step); returns (advantages, returns) at the tokens' positions."""
    steps = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    n = len(steps)
    r = [float(rewards[b, t]) for b, t in steps]
    v = [float(values[b, t]) for b, t in steps]
    dones = [1.0 if i == 0 or steps[i - 1][0] != b else 0.0 for i, (b, _) in enumerate(steps)]
    next_done, next_value = 1.0, 0.0
    adv = [0.0] * n
    lastgaelam = 0.0
    for t in reversed(range(n)):
        if t == n - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = v[t + 1]
        delta = r[t] + gamma * nextvalues * nextnonterminal - v[t]
        adv[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    advantages, returns = torch.zeros(mask.shape), torch.zeros(mask.shape)
    for i, (b, t) in enumerate(steps):
        advantages[b, t], returns[b, t] = adv[i], adv[i] + v[i]
    return advantages, returns


def cleanrl_value_loss(newvalue, b_values, b_returns, clip_coef, clip_vloss=True):
    """cleanrl ppo.py's value loss, on flat tensors (the masked tokens)."""
    if clip_vloss:
        v_loss_unclipped = (newvalue - b_returns) ** 2
        v_clipped = b_values + torch.clamp(newvalue - b_values, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - b_returns) ** 2
        v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
        return 0.5 * v_loss_max.mean()
    return 0.5 * ((newvalue - b_returns) ** 2).mean()


# Two episodes of 10 positions: prompt, a turn of 2 tokens, an observation of 2, a turn of
# 3, then padding (row 0); prompt, one turn of 4 tokens, an observation, a turn of 1 (row 1).
MASK = torch.tensor(
    [[0, 1, 1, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0, 1, 0, 0]], dtype=torch.bool
)


def test_gae_on_three_positions_by_hand():
    """mask [1, 0, 1], values [0.5, 9.0, 0.2], reward 1 on the last action token.
    gamma = lam = 1: t=2: delta = 1 - 0.2 = 0.8; the observation at t=1 is not a step, its
    value 9.0 is never read; t=0: delta = 0.2 - 0.5 = -0.3, A = -0.3 + 0.8 = 0.5 = R - V(0).
    gamma = lam = 0.5: t=0: delta = 0.5 * 0.2 - 0.5 = -0.4, A = -0.4 + 0.25 * 0.8 = -0.2;
    returns = A + V = 0.3 there, 1.0 at t=2, 0 on the observation."""
    mask = torch.tensor([[1, 0, 1]])
    values = torch.tensor([[0.5, 9.0, 0.2]])
    rewards = terminal_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 1.0]]
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.0, 0.8])
    assert ret[0].tolist() == pytest.approx([1.0, 0.0, 1.0])
    adv, ret = gae(rewards, values, mask, 0.5, 0.5)
    assert adv[0].tolist() == pytest.approx([-0.2, 0.0, 0.8])
    assert ret[0].tolist() == pytest.approx([0.3, 0.0, 1.0])


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8), (0.99, 0.95), (0.5, 0.0)])
def test_gae_equals_cleanrl_across_turn_boundaries(gamma, lam):
    """Two episodes with observation tokens between their turns: equal to cleanrl's loop on
    the action tokens alone; nothing on observation or padding positions, whatever values
    and rewards stand there."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(MASK.shape, generator=generator)  # [2, 10]
    rewards = terminal_rewards(torch.tensor([1.0, -0.3]), MASK)  # [2, 10]
    assert rewards[0, 7] == 1.0 and rewards[1, 7] == pytest.approx(-0.3)
    assert rewards.count_nonzero() == 2
    adv, ret = gae(rewards, values, MASK, gamma, lam)
    want_adv, want_ret = cleanrl_gae(rewards, values, MASK, gamma, lam)
    torch.testing.assert_close(adv, want_adv)
    torch.testing.assert_close(ret, want_ret)
    # Values and rewards off the action tokens change nothing.
    noise = torch.randn(MASK.shape, generator=generator) * ~MASK
    adv2, ret2 = gae(rewards + noise, values + noise, MASK, gamma, lam)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)


def test_gae_is_the_same_for_one_row_or_the_batch():
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(MASK.shape, generator=generator)
    rewards = terminal_rewards(torch.tensor([0.4, 1.0]), MASK)
    both, _ = gae(rewards, values, MASK, 0.9, 0.7)
    for b in range(2):
        row, _ = gae(rewards[b : b + 1], values[b : b + 1], MASK[b : b + 1], 0.9, 0.7)
        torch.testing.assert_close(row[0], both[b])


def test_value_loss_on_three_tokens_by_hand():
    """values [1.0, 0.0, 0.5], old [0.5, 0.0, 0.5], returns [2.0, 1.0, 0.0], clip 0.2:
    token 0: unclipped (1 - 2)^2 = 1, clipped value 0.5 + 0.2 = 0.7, (0.7 - 2)^2 = 1.69,
    max 1.69; token 1: 1 both ways; token 2: 0.25 both ways. Loss 0.5 * (1.69 + 1 +
    0.25) / 3 = 0.49; the clipped term is the larger on 1 token of 3. Unclipped:
    0.5 * (1 + 1 + 0.25) / 3 = 0.375."""
    values = torch.tensor([[1.0, 0.0, 0.5]])
    old = torch.tensor([[0.5, 0.0, 0.5]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.ones(1, 3)
    loss, metrics = value_loss(values, old, returns, mask, 0.2)
    assert loss.item() == pytest.approx(0.49)
    assert metrics["value_clip_frac"].item() == pytest.approx(1 / 3)
    assert value_loss(values, old, returns, mask, 0.0)[0].item() == pytest.approx(0.375)


@pytest.mark.parametrize("clip", [0.2, 0.05, 0.0])
def test_value_loss_equals_cleanrl_on_the_masked_tokens(clip):
    """Random values on MASK's tokens: equal to cleanrl's on the flattened masked tokens;
    gradients reach the new values on masked tokens only; `num_items` divides instead."""
    generator = torch.Generator().manual_seed(2)
    values = torch.randn(MASK.shape, generator=generator).requires_grad_()
    old = values.detach() + 0.3 * torch.randn(MASK.shape, generator=generator)
    returns = torch.randn(MASK.shape, generator=generator)
    loss, _ = value_loss(values, old, returns, MASK, clip)
    m = MASK
    want = cleanrl_value_loss(values[m], old[m], returns[m], clip, clip_vloss=clip > 0)
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert values.grad[~MASK].abs().sum() == 0 and values.grad[MASK].abs().sum() > 0
    scaled, _ = value_loss(values, old, returns, MASK, clip, num_items=20.0)
    torch.testing.assert_close(scaled, want * int(MASK.sum()) / 20.0)


def test_whitening_and_explained_variance():
    """Whitened masked entries have mean 0 and std 1, the rest 0; explained variance is 1
    for a perfect value, 0 for a constant one and when the returns do not vary."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(MASK.shape, generator=generator) * 3 + 2
    w = whiten(x, MASK)
    assert w[~MASK].abs().sum() == 0
    assert w[MASK].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert w[MASK].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert explained_variance(x, x, MASK) == pytest.approx(1.0)
    assert explained_variance(torch.full(MASK.shape, 5.0), x, MASK) == pytest.approx(0.0)
    assert explained_variance(x, torch.ones(MASK.shape), MASK) == 0.0
    assert explained_variance(x, x + 1.0, MASK) == pytest.approx(1.0)
    # Equal rewards: GAE's returns (A + V) equal up to float rounding, not a huge ratio.
    rewards = terminal_rewards(torch.tensor([-1.1, -1.1]), MASK)
    _, returns = gae(rewards, x, MASK, 1.0, 1.0)
    assert returns[MASK].unique().numel() > 1  # the rounding is there
    assert explained_variance(x, returns, MASK) == 0.0


def test_config_checks_and_presets():
    """GRPO-only settings are refused by name; the ppo section loads from a preset; the
    pipeline takes ppo among its algorithms."""
    from components.cli import command
    from components.pipeline import PipelineConfig
    from components.stage_contract import PolicyResult

    assert PPOConfig().loss_type == "token" and PPOConfig().mlflow_experiment == "agentrl-ppo"
    for bad, match in [
        ({"turn_credit": True}, "PPOConfig.turn_credit"),
        ({"leave_one_out": True}, "PPOConfig.leave_one_out"),
        ({"gamma": 1.5}, "gamma"),
        ({"value_clip": -1.0}, "value_clip"),
        ({"value_learning_rate": 0.0}, "value_learning_rate"),
        ({"group_size": 1}, "group_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            PPOConfig(**bad)
    assert PipelineConfig(algorithms=("grpo", "ppo")).algorithms == ("grpo", "ppo")
    contract = command(["train", "ppo"]).contract
    assert contract.reads == ("ppo", "rollout", "env", "sandbox", "runtime")
    assert contract.result is PolicyResult


def _run(model, tokenizer, tasks, out, iterations, **overrides):
    config = PPOConfig(
        **{
            "iterations": iterations,
            "tasks_per_iteration": 1,
            "group_size": 2,
            "learning_rate": 1e-3,
            "value_learning_rate": 1e-2,
            "ppo_epochs": 2,
            "minibatch_size": 1,
            "micro_batch_size": 1,
            "output_dir": str(out),
            **overrides,
        }
    )
    return train_ppo(
        model,
        tokenizer,
        tasks,
        config,
        ROLLOUT,
        ENV,
        SandboxConfig(),
        generate_fn=scripted_generate(model, tokenizer, tasks),
    )


def test_tiny_run_trains_policy_and_value_head(tiny_policy, suite, tmp_path):
    """2 iterations, G=2 (one fix, one give-up per group), mu=2, a KL reference, a slow
    policy: the policy changes; the head starts at zero and learns (the value loss falls,
    the mean value moves to the mean return); every number is finite; a head is saved
    with each checkpoint; the final policy holds no head."""
    model, tokenizer = tiny_policy
    _, tasks = suite
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = _run(model, tokenizer, tasks, tmp_path, 2, beta=0.05, learning_rate=1e-5)
    assert result.iterations == 2 and len(result.metrics) == 2
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    for row in result.metrics:
        assert row["episodes"] == 2 and row["success_rate"] == 0.5
        assert row["optimizer_steps"] == 4  # 2 epochs x 2 minibatches of 1
        assert all(math.isfinite(v) for v in row.values()), row
        for key in (
            "value_loss",
            "explained_variance",
            "kl",
            "entropy",
            "value_grad_norm",
            "value_clip_frac",
            "mean_reward",
        ):
            assert key in row, key
    first, last = result.metrics
    assert first["value_mean"] == 0.0  # the head starts at zero
    assert last["value_loss"] < first["value_loss"]
    assert abs(last["value_mean"] - last["return_mean"]) < abs(first["return_mean"])
    heads = sorted(p.name for p in (tmp_path / "value").iterdir())
    assert heads == ["iter-000001.pt", "iter-000002.pt"]  # keep_checkpoints = 2
    head = torch.load(value_file(tmp_path, 2), weights_only=True)["head"]
    assert head["weight"].abs().sum() > 0
    saved = json.loads((tmp_path / "policy" / "config.json").read_text())
    assert saved["hidden_size"] == model.config.hidden_size
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "policy" / "model.safetensors")
    assert not [k for k in weights if "value" in k]


def test_lora_trains_the_adapters_and_the_head_beside_them(tiny_config, suite, tmp_path):
    """With LoRA the base stays as it was (it is also the KL reference, adapters off), the
    adapters and the value head train."""
    from components.policy.model import build_policy
    from tests.train.test_lora import LORA, _base_weights

    _, tasks = suite
    model, tokenizer = build_policy(tiny_config)
    start = _base_weights(model)
    result = _run(model, tokenizer, tasks, tmp_path, 1, beta=0.05, lora=LORA)
    row = result.metrics[0]
    assert row["kl"] >= 0 and math.isfinite(row["value_loss"])
    adapters = [v for k, v in model.state_dict().items() if "lora_B" in k]
    assert adapters and any(v.abs().sum() > 0 for v in adapters)
    for name, value in _base_weights(model).items():
        assert torch.equal(value, start[name]), name
    head = torch.load(value_file(tmp_path, 1), weights_only=True)["head"]
    assert head["weight"].abs().sum() > 0


@pytest.mark.slow
def test_resume_ends_where_an_uninterrupted_run_ends(tiny_config, suite, tmp_path):
    """3 iterations straight vs 2, then a fresh model resumed to 3: the same policy weights
    and the same metrics of iteration 3 (the head and its optimizer came back too)."""
    from components.policy.model import build_policy

    _, tasks = suite
    model, tokenizer = build_policy(tiny_config)
    straight = _run(model, tokenizer, tasks, tmp_path / "straight", 3)
    first, tokenizer = build_policy(tiny_config)
    _run(first, tokenizer, tasks, tmp_path / "killed", 2)
    del first
    fresh, tokenizer = build_policy(tiny_config)
    resumed = _run(fresh, tokenizer, tasks, tmp_path / "killed", 3)
    assert resumed.resumed_from == 2 and [r["iteration"] for r in resumed.metrics] == [3]
    for (name, a), (_, b) in zip(
        model.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in straight.metrics[2:]]
    assert strip == [{k: v for k, v in r.items() if k not in TIMING} for r in resumed.metrics]
    a = torch.load(value_file(tmp_path / "straight", 3), weights_only=True)["head"]
    b = torch.load(value_file(tmp_path / "killed", 3), weights_only=True)["head"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_agentrl_train_ppo_command(tiny_policy, suite, tmp_path, capsys):
    """`agentrl train ppo` through its real command line (the stage contract's sections):
    the preset's ppo section reaches the run; result.json has the curves the pipeline logs
    to MLflow, one point per iteration."""
    import yaml

    from components.cli import main as agentrl
    from components.policy.model import save_policy

    root, _ = suite
    policy_dir = save_policy(*tiny_policy, tmp_path / "start")
    capsys.readouterr()
    preset = tmp_path / "preset.yaml"
    preset.write_text(
        yaml.safe_dump(
            {
                "ppo": {
                    "iterations": 2,
                    "group_size": 2,
                    "tasks_per_iteration": 1,
                    "learning_rate": 0.0001,
                    "gae_lambda": 0.95,
                    "value_clip": 0.5,
                },
                "rollout": {"max_new_tokens": 8, "workers": 1},
                "env": {"max_steps": 1},
            }
        )
    )
    out = tmp_path / "run"
    code = agentrl(
        [
            "train",
            "ppo",
            "--preset",
            str(preset),
            "--policy",
            str(policy_dir),
            "--tasks",
            str(root),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["iterations"] == 2 and (out / "policy" / "config.json").is_file()
    curves = result["curves"]
    for key in ("mean_reward", "success_rate", "value_loss", "explained_variance", "kl", "entropy"):
        assert len(curves[key]) == 2, key
    assert (out / "value" / "iter-000002.pt").is_file()
