"""Losses and advantages: hand-derived three-element cases, then equality with TRL 1.16.

The TRL comparisons run TRL's own code on the same inputs:
- DPO: `DPOTrainer._compute_loss` on a tiny Qwen2 (policy and reference), with TRL's fused
  LM head, against our `sequence_logprobs` + `dpo_loss` on the same model's logits.
- GRPO loss: `GRPOTrainer._compute_loss` with the per-token log-probs injected (the method
  reads them from `_get_per_token_logps_and_entropies`, replaced on the instance).
- Advantages: TRL computes them inline in a 600-line generation method, so the test cuts
  the advantage block out of the installed source (`inspect.getsource`) and executes it;
  it fails loudly if a TRL upgrade moves the block.
Trainers are created with `object.__new__` (no __init__: no datasets, no accelerate state)
and given only the attributes the method reads; `_FakeAccelerator` is a one-process
accelerator (gather/reduce are identities).
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from components.train.losses import (
    dpo_loss,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    masked_mean,
    sequence_logprobs,
    token_entropy,
    token_logprobs,
    turn_token_advantages,
)

torch.set_num_threads(1)

LN2 = math.log(2.0)
# -log sigmoid(z) for z = 0, 1, 2
NLS0, NLS1, NLS2 = math.log(2.0), math.log(1 + math.exp(-1)), math.log(1 + math.exp(-2))


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32),
        torch.as_tensor(expected, dtype=torch.float32),
        atol=tol,
        rtol=tol,
    )


# ---------------------------------------------------------------- log-probs


def test_token_logprobs_shift_and_mask():
    """V=2, ids = [0, 1, 0].

    Position 0 has logits [0, ln 3]: p(next=1) = 3/4. Position 1 has [ln 3, 0]: p(next=0) = 3/4.
    Position 2's logits predict past the end and must be ignored (set to garbage).
    So token_logprobs = [ln 3/4, ln 3/4]. With mask [1, 1, 0] only token 1 counts (mask[:, 0]
    never does): ln 3/4; with mask [0, 1, 1]: 2 ln 3/4.
    """
    ln3 = math.log(3.0)
    logits = torch.tensor([[[0.0, ln3], [ln3, 0.0], [100.0, -100.0]]])  # [1, 3, 2]
    ids = torch.tensor([[0, 1, 0]])
    close(token_logprobs(logits, ids), [[math.log(0.75), math.log(0.75)]])
    close(sequence_logprobs(logits, ids, torch.tensor([[1, 1, 0]])), [math.log(0.75)])
    close(sequence_logprobs(logits, ids, torch.tensor([[0, 1, 1]])), [2 * math.log(0.75)])


def test_token_logprobs_temperature():
    """Temperature 2 halves the logits: [0, ln 3] -> [0, ln 3 / 2], p(1) = sqrt3 / (1 + sqrt3)."""
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(3)))
    close(token_logprobs(logits, torch.tensor([[0, 1]]), temperature=2.0), [[expected]])


def test_masked_mean_empty_mask_is_zero():
    """[1, 2, 3] with mask [1, 0, 1] -> 2; an all-zero mask gives 0 rather than NaN."""
    x = torch.tensor([1.0, 2.0, 3.0])
    close(masked_mean(x, torch.tensor([1, 0, 1])), 2.0)
    close(masked_mean(x, torch.zeros(3)), 0.0)


# ---------------------------------------------------------------- DPO by hand

# Policy log-probs with ref = 0 and beta = 0.5: margins (chosen - rejected) = [0, 2, 4],
# so z = beta * margin = [0, 1, 2].
PC = torch.tensor([-1.0, -1.0, -1.0])
PR = torch.tensor([-1.0, -3.0, -5.0])
ZERO = torch.zeros(3)


def test_dpo_sigmoid_by_hand():
    """z = [0, 1, 2]: -log s(z) = [ln 2, ln(1+e^-1), ln(1+e^-2)] = [.693147, .313262, .126928],
    mean .377779. Rewards: chosen beta*(pc - 0) = [-.5]*3, rejected [-.5, -1.5, -2.5]."""
    loss, chosen, rejected = dpo_loss(PC, PR, ZERO, ZERO, beta=0.5)
    close(loss, (NLS0 + NLS1 + NLS2) / 3)
    close(chosen, [-0.5, -0.5, -0.5])
    close(rejected, [-0.5, -1.5, -2.5])


def test_dpo_label_smoothing_by_hand():
    """Conservative DPO: (1-e)(-log s(z)) + e(-log s(-z)); since -log s(-z) = -log s(z) + z,
    the mean is .377779 + e * mean(z) = .377779 + .1 * 1 = .477779 for e = .1."""
    loss, _, _ = dpo_loss(PC, PR, ZERO, ZERO, beta=0.5, label_smoothing=0.1)
    close(loss, (NLS0 + NLS1 + NLS2) / 3 + 0.1)


def test_dpo_hinge_ipo_robust_by_hand():
    """hinge: relu(1 - z) = [1, 0, 0] -> 1/3.
    ipo: (margin - 1/(2 beta))^2 = ([0, 2, 4] - 1)^2 = [1, 1, 9] -> 11/3.
    robust (e=.1): ((1-e)A - eB)/(1-2e) with A = -log s(z), B = A + z -> A - z/8, mean .377779 - .125.
    """
    close(dpo_loss(PC, PR, ZERO, ZERO, beta=0.5, loss_type="hinge")[0], 1 / 3)
    close(dpo_loss(PC, PR, ZERO, ZERO, beta=0.5, loss_type="ipo")[0], 11 / 3)
    loss, _, _ = dpo_loss(PC, PR, ZERO, ZERO, beta=0.5, label_smoothing=0.1, loss_type="robust")
    close(loss, (NLS0 + NLS1 + NLS2) / 3 - 0.125)


def test_dpo_reference_shifts_margin():
    """Only the log-ratios matter: adding the same ref to chosen and policy keeps the loss;
    ref_chosen = [0, 2, 4] cancels the margins -> z = 0 everywhere -> loss ln 2."""
    loss, chosen, _ = dpo_loss(PC, PR, torch.tensor([0.0, 2.0, 4.0]), ZERO, beta=0.5)
    close(loss, LN2)
    close(chosen, [-0.5, -1.5, -2.5])


# ---------------------------------------------------------------- advantages by hand


def test_group_advantages_std_by_hand():
    """Group [1, 0, 0]: mean 1/3, Bessel std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = .57735;
    advantages (r - mean) / (std + 1e-4) = [.66667, -.33333, -.33333] / .57745 = [1.15450, -.57725, -.57725].
    Group [1, 1, 1]: no spread, advantage 0."""
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    s = math.sqrt(1 / 3) + 1e-4
    close(adv, [[2 / 3 / s, -1 / 3 / s, -1 / 3 / s], [0.0, 0.0, 0.0]])


def test_group_advantages_no_std_and_leave_one_out_by_hand():
    """[1, 0, 0] without scaling: r - mean = [2/3, -1/3, -1/3].
    Leave-one-out baselines are the means of the others: [0, .5, .5] -> [1, -.5, -.5]."""
    r = torch.tensor([[1.0, 0.0, 0.0]])
    close(group_advantages(r, scale_by_std=False), [[2 / 3, -1 / 3, -1 / 3]])
    close(group_advantages(r, scale_by_std=False, leave_one_out=True), [[1.0, -0.5, -0.5]])


def test_group_advantages_invalid_samples_are_left_out():
    """[1, 0, (infra failure)]: the failure is out of the statistics: mean .5, std sqrt(.5) = .70711,
    advantages [.5, -.5] / .70721 = [.70701, -.70701] and 0 for the failure. A NaN reward is
    invalid too. A group with one valid sample has nothing to compare with: 0."""
    r = torch.tensor([[1.0, 0.0, 7.0], [1.0, float("nan"), 0.0], [3.0, 9.0, 9.0]])
    valid = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    adv = group_advantages(r, valid_mask=valid)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    close(adv, [[a, -a, 0.0], [a, 0.0, -a], [0.0, 0.0, 0.0]])


def test_group_advantages_flat_with_group_ids():
    """Flat [1, 0, .5, 1] in groups [7, 3, 7, 3]: group 7 = [1, .5] (mean .75), group 3 = [0, 1]
    (mean .5) -> unscaled [.25, -.5, -.25, .5]."""
    adv = group_advantages(
        torch.tensor([1.0, 0.0, 0.5, 1.0]), torch.tensor([7, 3, 7, 3]), scale_by_std=False
    )
    close(adv, [0.25, -0.5, -0.25, 0.5])


def test_turn_token_advantages_by_hand():
    """One group of two episodes. Turn rewards [0, -.1] and [0, (none)]: the group's three
    turns have mean -1/30 and deviations [1/30, -2/30, 1/30], Bessel std
    sqrt((1 + 4 + 1) / 900 / 2) = .057735. Unscaled, each token gets its episode advantage
    plus its turn's deviation; tokens of no turn (-1) get the episode advantage alone."""
    adv = torch.tensor([0.5, -0.5])
    turns = torch.tensor([[0.0, -0.1], [0.0, float("nan")]])
    token_turns = torch.tensor([[-1, 0, 0, -1, 1], [-1, 0, -1, -1, -1]])
    group = torch.tensor([4, 4])
    out = turn_token_advantages(adv, turns, token_turns, group, scale_by_std=False)
    a, b = 1 / 30, -2 / 30
    close(out, [[0.5, 0.5 + a, 0.5 + a, 0.5, 0.5 + b], [-0.5, -0.5 + a, -0.5, -0.5, -0.5]])
    scaled = turn_token_advantages(adv, turns, token_turns, group)
    s = math.sqrt(6 / 900 / 2) + 1e-4
    close(scaled[0, 4], 0.5 + b / s)
    close(scaled[1, 1], -0.5 + a / s)


def test_turn_token_advantages_equal_turns_add_nothing_and_groups_are_separate():
    """Group 1's turns are all -.1 (no spread): its tokens keep the episode advantage.
    Group 2's turns [0, -.2] are normalised on their own: mean -.1, unscaled +-.1."""
    adv = torch.tensor([1.0, -1.0, 0.25, -0.25])
    turns = torch.tensor([[-0.1, -0.1], [-0.1, -0.1], [0.0, float("nan")], [-0.2, float("nan")]])
    token_turns = torch.tensor([[0, 1], [0, 1], [0, -1], [0, -1]])
    out = turn_token_advantages(
        adv, turns, token_turns, torch.tensor([1, 1, 2, 2]), scale_by_std=False
    )
    close(out, [[1.0, 1.0], [-1.0, -1.0], [0.35, 0.25], [-0.35, -0.25]])


def test_grpo_loss_takes_token_advantages():
    """[B, T] advantages: ratios 1, A = [[1, -3]] over two tokens -> loss mean(-1, 3) = 1; the
    same as two sequences of one token with A = 1 and -3 under the "token" reduction."""
    logps, mask = torch.zeros(1, 2), torch.ones(1, 2)
    close(grpo_loss(logps, logps, torch.tensor([[1.0, -3.0]]), mask)[0], 1.0)
    close(
        grpo_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([1.0, -3.0]),
                  torch.ones(2, 1), loss_type="token")[0],
        1.0,
    )  # fmt: skip


def test_token_entropy_and_high_entropy_mask_by_hand():
    """Uniform over 4 -> ln 4; one-hot-ish -> ~0. Entropies [3, 1, 2, (masked 9)]: the
    top half by the 0.5 quantile (median of 1, 2, 3 = 2) keeps 3 and 2, never the masked 9."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]])
    h = token_entropy(logits)  # [1, 2]: positions 0 and 1 (the last position is dropped)
    close(h, [[math.log(4.0), 0.0]])
    ent = torch.tensor([[3.0, 1.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert high_entropy_mask(ent, mask, 0.5).tolist() == [[True, False, True, False]]
    assert high_entropy_mask(ent, mask, 1.0).tolist() == [[True, True, True, False]]
    assert not high_entropy_mask(ent, torch.zeros_like(mask), 0.2).any()


def test_grpo_policy_mask_keeps_kl_and_denominators():
    """Two tokens, ratios 1, A = 1, ref - logps = ln 2 on both: the policy mask drops token 2's
    policy term (-1) but not its KL: loss = (-1 + 2 * .1 * k3) / 2 with k3 = 1 - ln 2."""
    logps = torch.zeros(1, 2)
    loss, _ = grpo_loss(logps, logps, torch.ones(1), torch.ones(1, 2), ref_logps=logps + LN2,
                        beta=0.1, policy_mask=torch.tensor([[1.0, 0.0]]))  # fmt: skip
    close(loss, (-1.0 + 2 * 0.1 * (1 - LN2)) / 2)


# ---------------------------------------------------------------- GRPO by hand


def test_grpo_clipping_by_hand():
    """One sequence, ratios r = [1, 1.5, .5] (logps = ln r, old = 0), eps = .2: clip(r) = [1, 1.2, .8].
    A = +1: min(rA, clip(r)A) = [1, 1.2, .5] -> loss -(2.7)/3 = -.9; token 2 is clipped high (1/3),
    token 3 is below the range but A > 0 keeps its gradient: not counted.
    A = -1: min = [-1, -1.5, -.8] -> loss 3.3/3 = 1.1; token 3 clipped low (1/3)."""
    logps = torch.log(torch.tensor([[1.0, 1.5, 0.5]]))
    old, mask = torch.zeros(1, 3), torch.ones(1, 3)
    loss, m = grpo_loss(logps, old, torch.tensor([1.0]), mask)
    close(loss, -0.9)
    close(m["clip_high"], 1 / 3)
    close(m["clip_low"], 0.0)
    close(m["ratio"], 1.0)
    loss, m = grpo_loss(logps, old, torch.tensor([-1.0]), mask)
    close(loss, 1.1)
    close(m["clip_low"], 1 / 3)
    close(m["clip_region"], 1 / 3)


def test_grpo_reductions_by_hand():
    """Ratios 1, A = [1, -2]; sequence 1 has 3 masked tokens (-1 each), sequence 2 one token (+2).
    grpo: mean(-1, 2) = .5; token/dapo: (-3 + 2) / 4 = -.25; dr_grpo with length 4: -1 / (2 * 4)."""
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    close(grpo_loss(logps, logps, adv, mask, loss_type="grpo")[0], 0.5)
    close(grpo_loss(logps, logps, adv, mask, loss_type="token")[0], -0.25)
    close(grpo_loss(logps, logps, adv, mask, loss_type="dapo")[0], -0.25)
    close(
        grpo_loss(logps, logps, adv, mask, loss_type="dr_grpo", max_completion_length=4)[0], -0.125
    )
    close(grpo_loss(logps, logps, adv, mask, loss_type="token", num_items=8.0)[0], -0.125)


def test_grpo_kl_k3_by_hand():
    """ref - logps = ln 2 on every token: k3 = e^(ln 2) - ln 2 - 1 = .306853. A = 0, so the loss is
    beta * k3 = .1 * .306853 = .0306853; kl metric .306853, policy_loss 0."""
    logps = torch.zeros(1, 3)
    loss, m = grpo_loss(
        logps, logps, torch.zeros(1), torch.ones(1, 3), ref_logps=logps + LN2, beta=0.1
    )
    close(loss, 0.1 * (1 - LN2))
    close(m["kl"], 1 - LN2)
    close(m["policy_loss"], 0.0)


def test_grpo_mask_excludes_tool_tokens():
    """Masked tokens do not move the loss even with huge ratios: only token 1 counts (r=1, A=1)."""
    logps = torch.tensor([[0.0, 5.0, -5.0]])
    loss, _ = grpo_loss(logps, torch.zeros(1, 3), torch.ones(1), torch.tensor([[1.0, 0.0, 0.0]]))
    close(loss, -1.0)


# ---------------------------------------------------------------- equality with TRL


class _FakeAccelerator:
    """One process on the CPU: what DPOTrainer/GRPOTrainer._compute_loss call on it."""

    device = torch.device("cpu")
    num_processes = 1
    sync_gradients = True

    def gather(self, t):
        return t

    def gather_for_metrics(self, t):
        return t

    def reduce(self, t, reduction="sum"):
        return t

    def pad_across_processes(self, t, dim=0, pad_index=0):
        return t


def _tiny_qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def dpo_batch():
    """Two preference pairs, prompt 3 tokens, completions of 4 and 2 tokens (right padded)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (4, 7), generator=g)  # rows: chosen0, chosen1, rejected0, rejected1
    attention = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 6 + [0], [1] * 7])
    completion = attention.clone()
    completion[:, :3] = 0  # the prompt is not scored
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    ("loss_type", "label_smoothing"),
    [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0), ("robust", 0.2)],
)
def test_dpo_matches_trl(dpo_batch, loss_type, label_smoothing):
    from trl import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    policy, ref = _tiny_qwen2(1), _tiny_qwen2(2)
    beta = 0.3
    ids, attention, completion = (
        dpo_batch[k] for k in ("input_ids", "attention_mask", "completion_mask")
    )

    # Ours: full logits -> sequence log-probs -> dpo_loss.
    logps = sequence_logprobs(
        policy(input_ids=ids, attention_mask=attention).logits, ids, completion
    )
    with torch.no_grad():
        ref_logps = sequence_logprobs(
            ref(input_ids=ids, attention_mask=attention).logits, ids, completion
        )
    if loss_type == "ipo":  # TRL's IPO is length-normalised: feed per-token means
        lengths = completion.sum(-1).float()
        logps, ref_logps = logps / lengths, ref_logps / lengths
    ours, chosen_rewards, rejected_rewards = dpo_loss(
        *logps.chunk(2), *ref_logps.chunk(2), beta=beta, label_smoothing=label_smoothing,
        loss_type=loss_type,
    )  # fmt: skip
    ours.backward()
    our_grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()

    # TRL: its own fused log-prob head and loss, same models and batch.
    add_fused_lm_head(policy, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    add_fused_lm_head(ref)
    trainer = object.__new__(DPOTrainer)
    trainer.__dict__.update(
        model=policy, ref_model=ref, accelerator=_FakeAccelerator(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=False, f_divergence_type="reverse_kl",
        loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=label_smoothing,
        use_weighting=False, _total_train_tokens=0, _tp_size=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(gradient_checkpointing_kwargs=None),
    )  # fmt: skip
    theirs = trainer._compute_loss(policy, dict(dpo_batch), return_outputs=False)
    theirs.backward()

    close(ours, theirs.detach(), tol=1e-5)
    for mine, p in zip(our_grads, policy.parameters(), strict=True):
        close(mine, p.grad, tol=1e-4)
    if loss_type != "ipo":  # TRL logs rewards from the unnormalised log-ratios
        metrics = trainer._metrics["eval"]  # .eval() model: TRL files its metrics under eval
        close(chosen_rewards.mean(), metrics["rewards/chosen"][0], tol=1e-5)
        close(rejected_rewards.mean(), metrics["rewards/rejected"][0], tol=1e-5)


def _trl_block(source: str, first: str, last: str) -> str:
    """The lines of `source` from the one containing `first` through the one containing `last`."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start : end + 1]))


REWARDS = torch.tensor(
    [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, -1.0, 0.2, 0.0], [1.0, 0.0, 0.3, 0.0]]
)
VALID = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_group_advantages_match_trl_grpo(scale_rewards):
    from trl import GRPOTrainer
    from trl.trainer.utils import nanstd

    block = _trl_block(
        inspect.getsource(GRPOTrainer._generate_and_score_completions),
        'if self.multi_objective_aggregation == "sum_then_normalize":',
        "advantages = torch.nan_to_num(advantages, nan=0.0)",
    )
    rewards_per_func = torch.where(VALID, REWARDS, torch.nan).reshape(-1, 1)  # [B, 1 reward func]
    scope = {
        "torch": torch, "nanstd": nanstd, "device": "cpu", "num_generations": 4,
        "rewards_per_func": rewards_per_func,
        "unscorable_mask": torch.isnan(rewards_per_func).all(dim=1),
        "self": SimpleNamespace(
            multi_objective_aggregation="sum_then_normalize", scale_rewards=scale_rewards,
            reward_weights=torch.ones(1),
        ),
    }  # fmt: skip
    exec(block, scope)  # noqa: S102 - TRL's own installed source, see the module docstring
    ours = group_advantages(REWARDS, scale_by_std=scale_rewards == "group", valid_mask=VALID)
    close(ours.reshape(-1), scope["advantages"], tol=1e-6)


def test_entropy_pieces_match_trl():
    """token_entropy = trl's entropy_from_logits on the same (shifted, tempered) logits, and
    high_entropy_mask = GRPOTrainer.get_high_entropy_mask on one process."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import entropy_from_logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g)
    close(token_entropy(logits, 0.7), entropy_from_logits(logits[:, :-1] / 0.7))
    ent = torch.rand(3, 6, generator=g) * 3
    mask = (torch.rand(3, 6, generator=g) > 0.3).long()
    fake = SimpleNamespace(accelerator=_FakeAccelerator())
    for q in (0.2, 0.5, 1.0):
        ours = high_entropy_mask(ent, mask, q)
        theirs = GRPOTrainer.get_high_entropy_mask(fake, ent, mask, 1 - q)
        assert torch.equal(ours, theirs), q


def test_leave_one_out_matches_trl_rloo():
    from trl import RLOOTrainer
    from trl.trainer.utils import nanstd

    block = _trl_block(
        inspect.getsource(RLOOTrainer._generate_and_score_completions),
        "grouped_rewards = rewards.view(-1, num_generations)",
        "advantages = torch.nan_to_num(advantages, nan=0.0)",
    )
    scope = {
        "torch": torch, "nanstd": nanstd, "num_generations": 4,
        "rewards": torch.where(VALID, REWARDS, torch.nan).reshape(-1),
        "self": SimpleNamespace(normalize_advantages=False),
    }  # fmt: skip
    exec(block, scope)  # noqa: S102 - TRL's own installed source, see the module docstring
    ours = group_advantages(REWARDS, scale_by_std=False, leave_one_out=True, valid_mask=VALID)
    close(ours.reshape(-1), scope["advantages"], tol=1e-6)


@pytest.mark.parametrize(
    ("loss_type", "beta", "epsilon_high"),
    [("grpo", 0.0, 0.2), ("grpo", 0.04, 0.28), ("dapo", 0.0, 0.28), ("bnpo", 0.04, 0.2),
     ("dr_grpo", 0.04, 0.2)],
)  # fmt: skip
def test_grpo_loss_matches_trl(loss_type, beta, epsilon_high):
    """Same per-token log-probs, old/ref log-probs, advantages and masks into both.

    The mask is multi-turn shaped: TRL multiplies completion_mask by tool_mask (0 on tool
    output tokens); ours receives that product as the assistant mask.
    """
    from trl import GRPOTrainer

    B, T = 4, 6
    g = torch.Generator().manual_seed(0)
    logps = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = logps.detach() + 0.4 * torch.randn(B, T, generator=g)  # ratios well outside 1 +- eps
    ref = logps.detach() + 0.3 * torch.randn(B, T, generator=g)
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5])
    completion_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 2 + [0] * 4])
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1] * 6, [1, 0, 0, 1, 1, 1], [1] * 6])
    mask = completion_mask * tool_mask

    ours, metrics = grpo_loss(
        logps, old, advantages, mask, epsilon_low=0.2, epsilon_high=epsilon_high,
        ref_logps=ref if beta else None, beta=beta, loss_type=loss_type, max_completion_length=T,
    )  # fmt: skip
    (our_grad,) = torch.autograd.grad(ours, logps)

    trainer = object.__new__(GRPOTrainer)
    trainer.__dict__.update(
        # the one substitution: the log-probs a model forward would produce
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros(B, T), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        loss_type=loss_type, beta=beta, epsilon_low=0.2, epsilon_high=epsilon_high,
        use_vllm=False, vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False,
        aux_loss_enabled=False, max_completion_length=T, current_gradient_accumulation_steps=1,
        model=SimpleNamespace(training=True), accelerator=_FakeAccelerator(),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )  # fmt: skip
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": completion_mask,
        "tool_mask": tool_mask, "advantages": advantages, "old_per_token_logps": old,
        "ref_per_token_logps": ref, "num_items_in_batch": mask.sum(),
    }  # fmt: skip
    theirs = trainer._compute_loss(None, inputs)
    (their_grad,) = torch.autograd.grad(theirs, logps)

    close(ours, theirs, tol=1e-6)
    close(our_grad, their_grad, tol=1e-6)
    logged = trainer._metrics["train"]
    close(metrics["clip_low"], logged["clip_ratio/low_mean"][0], tol=1e-6)
    close(metrics["clip_high"], logged["clip_ratio/high_mean"][0], tol=1e-6)
    close(metrics["clip_region"], logged["clip_ratio/region_mean"][0], tol=1e-6)
    assert metrics["clip_region"] > 0  # the case exercises clipping
    if beta:
        close(metrics["kl"], logged["kl"][0], tol=1e-6)
