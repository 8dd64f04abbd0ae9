"""Losses and advantages of the training stages: pure tensor code, no models, no trainers.

Shapes: B sequences, T tokens, V vocabulary, N groups of G samples each. Masks are 1 on
tokens the loss trains on (the assistant's own tokens, `tokenize_trajectory`'s
assistant_mask) and 0 on prompt, environment observations and padding.

Conventions follow TRL 1.16 where it has the same setting (tests/train/test_losses.py
checks equality on identical inputs): DPO's sigmoid/hinge/IPO/robust losses, GRPO's group
advantages (Bessel-corrected std, +1e-4), RLOO's leave-one-out baseline, the clipped
per-token surrogate with the k3 KL estimator, and the grpo / token (dapo, bnpo) / dr_grpo
reductions.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

DPOLossType = Literal["sigmoid", "hinge", "ipo", "robust"]
GRPOLossType = Literal["grpo", "token", "dapo", "bnpo", "dr_grpo"]


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each *given* next token: out[:, t] = log p(ids[:, t+1] | ids[:, :t+1]).

    logits: [B, T, V] from a causal LM on input_ids [B, T]. Returns [B, T-1] in float32.
    The shift is here and nowhere else: position t's logits score token t+1.
    """
    logits = (
        logits[:, :-1].float() / temperature
    )  # [B, T-1, V]; the last position predicts past the end
    targets = input_ids[:, 1:]  # [B, T-1]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    # gather - logsumexp rather than log_softmax: never materialises a second [B, T-1, V] tensor
    return picked - torch.logsumexp(logits, dim=-1)  # [B, T-1]


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy (nats) of the next-token distribution at each position, shifted like
    token_logprobs: out[:, t] is the entropy of the distribution that scored token t+1.

    logits: [B, T, V]. Returns [B, T-1] float32 (no gradient is needed through it).
    """
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # [B, T-1, V]
    return -(logp.exp() * logp).sum(-1)  # [B, T-1]


def high_entropy_mask(entropies: Tensor, mask: Tensor, top_quantile: float) -> Tensor:
    """The tokens whose entropy is at or above the (1 - top_quantile) quantile of the masked
    tokens' entropies ("Beyond the 80/20 rule", Wang et al. 2025; TRL's
    get_high_entropy_mask on one process). entropies, mask: [B, T]. Returns [B, T] bool,
    False wherever mask is 0 (all False when nothing is masked in)."""
    chosen = entropies[mask.bool()].float()  # [N]
    if chosen.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(chosen, 1.0 - top_quantile)
    return (entropies * mask.float() >= threshold) & mask.bool()  # [B, T]


def sequence_logprobs(
    logits: Tensor, input_ids: Tensor, mask: Tensor, temperature: float = 1.0
) -> Tensor:
    """Sum of the log-probabilities of the masked tokens of each sequence.

    logits [B, T, V], input_ids [B, T], mask [B, T] (1 on the tokens to score; mask[:, 0] is
    ignored: the first token has no prediction). Returns [B].
    """
    per_token = token_logprobs(logits, input_ids, temperature)  # [B, T-1]
    return (per_token * mask[:, 1:].to(per_token.dtype)).sum(-1)  # [B]


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where mask is 1 (over `dim`, or everything); 0 where the mask is empty."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    loss_type: DPOLossType = "sigmoid",
) -> tuple[Tensor, Tensor, Tensor]:
    """Direct Preference Optimization on sequence log-probs (each [B]).

    With z = beta * ((pi_c - ref_c) - (pi_r - ref_r)):
    - sigmoid: -(1-eps) log s(z) - eps log s(-z)  (eps = label_smoothing: conservative DPO;
      eps=0 is TRL's "sigmoid")
    - hinge: relu(1 - z)
    - ipo: ((pi_c - ref_c) - (pi_r - ref_r) - 1/(2 beta))^2. TRL divides each side by the
      completion's token count: pass per-token mean log-probs to get its length-normalised IPO.
    - robust: (-(1-eps) log s(z) + eps log s(-z)) / (1 - 2 eps)  (TRL's "robust")
    Returns (mean loss, chosen_rewards [B], rejected_rewards [B]); rewards are
    beta * (policy - ref), detached, for logging.
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # [B]
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # [B]
    margin = chosen_logratios - rejected_logratios  # [B]
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * margin) - (
            label_smoothing * F.logsigmoid(-beta * margin)
        )
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1 / (2 * beta)) ** 2
    elif loss_type == "robust":
        if not 0.0 <= label_smoothing < 0.5:
            raise ValueError("robust DPO needs 0 <= label_smoothing < 0.5")
        losses = (
            -(1 - label_smoothing) * F.logsigmoid(beta * margin)
            + label_smoothing * F.logsigmoid(-beta * margin)
        ) / (1 - 2 * label_smoothing)
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}")
    chosen_rewards = beta * chosen_logratios.detach()  # [B]
    rejected_rewards = beta * rejected_logratios.detach()  # [B]
    return losses.mean(), chosen_rewards, rejected_rewards


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    scale_by_std: bool = True,
    leave_one_out: bool = False,
    valid_mask: Tensor | None = None,
    eps: float = 1e-4,
) -> Tensor:
    """Advantage of each sample relative to the other samples of its task (its group).

    rewards: [N, G] (one row per group), or flat [B] with group_ids [B] (any integer ids,
    groups may differ in size). valid_mask (same shape, bool) marks samples that count:
    infra failures carry no reward, are left out of their group's mean and std, and get
    advantage 0; NaN rewards are treated as invalid too.
    - baseline: the group mean, or with leave_one_out the mean of the *other* valid samples
      (RLOO); a group with fewer than two valid samples gives 0.
    - scale_by_std: divide by the group's sample std (Bessel-corrected) + eps, as GRPO; off,
      the raw difference (Dr. GRPO, RLOO).
    Returns advantages of the same shape as rewards, float32.
    """
    shape = rewards.shape
    flat = rewards.reshape(-1).float()  # [B]
    if rewards.dim() == 2:
        if group_ids is not None:
            raise ValueError("group_ids only go with flat rewards; [N, G] rows are the groups")
        n_groups, group_size = shape
        group_ids = torch.arange(n_groups, device=rewards.device).repeat_interleave(group_size)
    elif rewards.dim() != 1 or group_ids is None or group_ids.shape != rewards.shape:
        raise ValueError("rewards must be [N, G], or flat [B] with group_ids [B]")
    _, group = torch.unique(group_ids.reshape(-1), return_inverse=True)  # [B] in 0..K-1
    num_groups = int(group.max()) + 1 if group.numel() else 0
    valid = ~torch.isnan(flat)
    if valid_mask is not None:
        valid &= valid_mask.reshape(-1).bool()
    r = torch.where(valid, flat, torch.zeros_like(flat))  # [B]; invalid rewards never enter a sum
    v = valid.float()  # [B]

    count = torch.zeros(num_groups, device=flat.device).index_add_(0, group, v)  # [K]
    total = torch.zeros(num_groups, device=flat.device).index_add_(0, group, r)  # [K]
    mean = total / count.clamp(min=1.0)  # [K]
    n_i, mean_i = count[group], mean[group]  # [B]
    # [B] RLOO: the mean of the *other* valid samples; GRPO: the group mean
    loo = (total[group] - r) / (n_i - 1).clamp(min=1.0)
    baseline = loo if leave_one_out else mean_i
    advantages = r - baseline  # [B]
    if scale_by_std:
        sq_dev = torch.zeros(num_groups, device=flat.device).index_add_(
            0, group, v * (r - mean_i) ** 2
        )  # [K]
        std = torch.sqrt(sq_dev / (count - 1).clamp(min=1.0))  # [K]; Bessel, as TRL's nanstd
        advantages = advantages / (std[group] + eps)
    # Nothing to compare against with fewer than two valid samples: no signal.
    advantages = torch.where(valid & (n_i >= 2), advantages, torch.zeros_like(advantages))
    return advantages.reshape(shape)


def turn_token_advantages(
    advantages: Tensor,
    turn_rewards: Tensor,
    token_turns: Tensor,
    group_ids: Tensor,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> Tensor:
    """Token-level advantages: the episode's advantage plus its turn's own process reward,
    normalised over all turns of the group.

    advantages [B] (group_advantages of the episode rewards); turn_rewards [B, S] with NaN
    where an episode has no turn s; token_turns [B, T] the turn (0..S-1) that sampled each
    token, -1 on tokens no turn sampled; group_ids [B].
    As DeepSeekMath's process supervision (Shao et al. 2024, 4.1.3) the turn rewards are
    normalised by the mean (and std, with scale_by_std) of every turn reward of the group;
    unlike it, a turn is credited with its own reward only, not the sum of the later
    turns', so a long episode gets no credit for its length. A group whose turn rewards
    are all equal adds nothing. Returns [B, T] float32 (the episode advantage where
    token_turns is -1).
    """
    b, s = turn_rewards.shape
    r = turn_rewards.float()  # [B, S]
    valid = ~torch.isnan(r)  # [B, S]
    _, group = torch.unique(group_ids.reshape(-1), return_inverse=True)  # [B] in 0..K-1
    k = int(group.max()) + 1 if group.numel() else 0
    cells = group.unsqueeze(1).expand(b, s).reshape(-1)  # [B*S] group of each turn
    v = valid.reshape(-1).float()  # [B*S]
    x = torch.where(valid, r, torch.zeros_like(r)).reshape(-1)  # [B*S]
    count = torch.zeros(k, device=r.device).index_add_(0, cells, v)  # [K]
    mean = torch.zeros(k, device=r.device).index_add_(0, cells, x) / count.clamp(min=1.0)  # [K]
    centred = (x - mean[cells]) * v  # [B*S]
    if scale_by_std:
        sq = torch.zeros(k, device=r.device).index_add_(0, cells, centred**2)  # [K]
        std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # [K]
        centred = centred / (std[cells] + eps)
    turn_adv = centred.reshape(b, s)  # [B, S]; 0 where there is no turn
    padded = torch.cat(
        [turn_adv, torch.zeros(b, 1, device=r.device)], dim=1
    )  # [B, S+1]; column S = no turn
    index = torch.where(token_turns >= 0, token_turns, torch.full_like(token_turns, s))  # [B, T]
    return advantages.float().reshape(-1, 1) + padded.gather(1, index.clamp(max=s))  # [B, T]


# Its keywords are TRL's GRPO settings by name, each defaulted (test_losses.py sets them as TRL).
# long: a pure tensor function: the tensors, then TRL's coefficients as keywords
def grpo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    loss_type: GRPOLossType = "grpo",
    max_completion_length: int | None = None,
    num_items: Tensor | float | None = None,
    policy_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped policy-gradient surrogate of GRPO / DAPO / Dr. GRPO, with an optional KL penalty.

    logps, old_logps, ref_logps: [B, T] log-probs of the sampled tokens under the current,
    sampling and reference policies; advantages [B] (one per sequence) or [B, T] (one per
    token, turn_token_advantages); mask [B, T], 1 on
    the assistant's tokens only (prompt, tool observations and padding are 0).
    Per token: -min(r A, clip(r, 1-eps_low, 1+eps_high) A) + beta * k3, where r =
    exp(logps - old_logps) and k3 = exp(ref - logps) - (ref - logps) - 1 >= 0.
    Reduction (loss_type):
    - "grpo": mean over each sequence's tokens, then over sequences (short answers weigh more).
    - "token" (= "dapo", "bnpo"): sum over all tokens / number of tokens (`num_items` overrides
      the divisor: pass the token count of the whole accumulation window for exact DAPO).
    - "dr_grpo": sum over all tokens / (B * max_completion_length, default T): no length bias.
    policy_mask [B, T] (optional, e.g. high_entropy_mask): the policy term counts only on
    these tokens; the KL term and every denominator keep `mask`, as TRL's
    top_entropy_quantile does.
    Returns (loss, metrics); metrics are detached 0-dim tensors (no device sync here):
    clip_low / clip_high / clip_region fractions of masked tokens, kl (masked mean, 0 without
    a reference), ratio (masked mean of r), policy_loss (the loss without the KL term).
    """
    mask = mask.to(logps.dtype)  # [B, T]
    adv = advantages if advantages.dim() == 2 else advantages.reshape(-1, 1)
    adv = adv.to(logps.dtype)  # [B, T] or [B, 1]
    ratio = torch.exp(logps - old_logps)  # [B, T]
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # [B, T]
    policy_per_token = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    if policy_mask is not None:
        policy_per_token = policy_per_token * policy_mask.to(logps.dtype)  # [B, T]
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("grpo_loss: beta != 0 needs ref_logps")
        delta = ref_logps - logps  # [B, T]
        kl = torch.exp(delta) - delta - 1  # [B, T]; k3 estimator of KL(pi || ref)
        per_token = policy_per_token + beta * kl
    else:
        kl = torch.zeros_like(logps)
        per_token = policy_per_token

    def reduce(x: Tensor) -> Tensor:
        if loss_type == "grpo":
            return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        if loss_type in ("token", "dapo", "bnpo"):
            divisor = mask.sum().clamp(min=1.0) if num_items is None else num_items
            return (x * mask).sum() / divisor
        if loss_type == "dr_grpo":
            length = logps.shape[1] if max_completion_length is None else max_completion_length
            return (x * mask).sum() / (x.shape[0] * length)
        raise ValueError(f"unknown GRPO loss_type {loss_type!r}")

    loss = reduce(per_token)
    with torch.no_grad():
        # Tokens whose gradient the clip removed, as TRL counts them.
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(logps.dtype)  # [B, T]
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(logps.dtype)  # [B, T]
        metrics = {
            "clip_low": masked_mean(low, mask),
            "clip_high": masked_mean(high, mask),
            "clip_region": masked_mean(torch.clamp(low + high, max=1.0), mask),
            "kl": masked_mean(kl.detach(), mask),
            "ratio": masked_mean(ratio.detach(), mask),
            "policy_loss": reduce(policy_per_token.detach()),
        }
    return loss, metrics
