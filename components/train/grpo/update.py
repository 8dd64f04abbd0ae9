"""The GRPO update: `ppo_epochs` passes of minibatch optimizer steps over an iteration's
stored episodes, the loss `losses.grpo_loss` on EXACTLY the sampled token ids and assistant
mask, with old_logps = the stored sampling log-probs (never re-tokenized, never recomputed)
and an optional k3 KL to a frozen reference (beta > 0). Each step logs the mean KL to the
reference (`kl`) and the policy's mean entropy over the sampled tokens (`entropy`, nats,
from the logits the loss already computed: no extra forward).

Batches are the stored episodes as sampled, right-padded to [B, T]. Every rank holds all
episodes; each step's minibatch is dealt out over the ranks (parallel.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from components.policy.lora import reference_or_base
from components.rollout.engine import Rollout
from components.rollout.policy_sync import version_number
from components.seeding import derive_seed
from components.train.config import GRPOConfig
from components.train.grpo.advantages import pad_rows, per_token
from components.train.losses import (
    grpo_loss,
    high_entropy_mask,
    masked_mean,
    token_entropy,
    token_logprobs,
)
from components.train.parallel import Stepper, all_sum, deal, score_shares

# Loss types that divide by the minibatch's tokens; the others average over sequences.
TOKEN_LOSSES = ("token", "dapo", "bnpo")


@dataclass(frozen=True)
class Learner:
    """What an update needs besides its episodes: the stepper, the frozen KL reference
    (None: the base with its adapters off under LoRA, or no KL), the settings, and the
    sampling temperature the log-probs are taken at (greedy ones are stored at T = 1)."""

    stepper: Stepper
    reference: object
    config: GRPOConfig
    temperature: float
    max_completion_length: int | None  # rollout.max_episode_tokens: dr_grpo's divisor
    pad_id: int
    device: torch.device

    @classmethod
    def of(cls, stepper, reference, config, rollout_config, pad_id: int, device) -> Learner:
        return cls(stepper, reference, config, rollout_config.temperature or 1.0,
                   rollout_config.max_episode_tokens, pad_id, device)  # fmt: skip


def collate_rollouts(rollouts: Sequence[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [B, T] tensors of the stored episodes; the mask is 0 on padding."""
    return {
        "input_ids": pad_rows([r.input_ids for r in rollouts], pad_id, torch.long),  # [B, T]
        "attention_mask": pad_rows([[1] * len(r.input_ids) for r in rollouts], 0, torch.long),
        "assistant_mask": pad_rows([r.assistant_mask for r in rollouts], 0, torch.long),
        "sampling_logprobs": pad_rows(
            [r.sampling_logprobs for r in rollouts], 0.0, torch.float32
        ),  # fmt: skip
    }


def policy_logps(model, batch: dict, device, temperature: float, entropy: bool = False,
                 sampled: torch.Tensor | None = None):  # fmt: skip
    """log p(input_ids[:, t+1]) under `model` at the sampling temperature: [B, T-1]; with
    `entropy`, also the (detached) entropy of each of those distributions, [B, T-1]; with
    `sampled` ([B, T-1] mask), also the entropies at those positions only (0 elsewhere),
    computed a chunk of positions at a time so no second [B, T-1, V] tensor is made."""
    ids = batch["input_ids"].to(device)
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"].to(device)).logits
    logps = token_logprobs(logits, ids, temperature=temperature)
    if entropy:
        with torch.no_grad():
            return logps, token_entropy(logits, temperature)
    if sampled is not None:
        return logps, masked_entropy(logits, sampled, temperature)
    return logps


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor, temperature: float,
                   chunk: int = 512) -> torch.Tensor:  # fmt: skip
    """Entropy (nats) of the next-token distributions at the positions of `mask` ([B, T-1],
    shifted like token_logprobs), 0 elsewhere: [B, T-1], detached."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)  # [B, T-1]
    where = mask.bool().nonzero(as_tuple=True)  # N positions
    with torch.no_grad():
        rows = logits[:, :-1][where]  # [N, V]
        for start in range(0, rows.shape[0], chunk):
            logp = torch.log_softmax(rows[start : start + chunk].float() / temperature, -1)
            entropy = -(logp.exp() * logp).sum(-1)  # [n]
            out[where[0][start : start + chunk], where[1][start : start + chunk]] = entropy
    return out


def update(learner: Learner, rollouts: list[Rollout], advantages: torch.Tensor,
           iteration: int) -> dict:  # fmt: skip
    """ppo_epochs passes of minibatch steps over the valid rollouts; returns mean metrics.
    advantages: [B, T] per token, or [B] per episode (repeated over its tokens)."""
    config, stepper = learner.config, learner.stepper
    advantages = per_token(advantages, rollouts)  # [B, T]
    ref_logps = None
    if config.beta > 0:  # once per iteration: the reference never changes
        with reference_or_base(stepper.model, learner.reference) as frozen:
            ref_logps = reference_logps(frozen, rollouts, learner)
    return run_minibatches(
        config,
        iteration,
        rollouts,
        lambda members: optimizer_step(learner, rollouts, advantages, ref_logps, members),
    )


def run_minibatches(config: GRPOConfig, iteration: int, rollouts: list[Rollout], step) -> dict:
    """config.ppo_epochs passes of `step(members)` over minibatches of rollout indices, in an
    order from (seed, iteration): nothing drawn from the global RNG. Returns the steps' mean
    metrics, optimizer_steps and update_tokens (GRPO's and PPO's update share it)."""
    n = len(rollouts)
    minibatch = config.minibatch_size or n
    generator = torch.Generator().manual_seed(derive_seed(config.seed, "minibatch", iteration))
    sums: dict[str, float] = {}
    steps = 0
    for _epoch in range(config.ppo_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, minibatch):
            for key, value in step(order[start : start + minibatch]).items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
    out = {key: value / steps for key, value in sums.items()}
    out["optimizer_steps"] = steps
    out["update_tokens"] = sum(len(r.input_ids) for r in rollouts) * config.ppo_epochs
    return out


# long: the update's inputs one by one, for callers that hold no Learner (bench, GPU tests)
def update_with(stepper, reference, rollouts: list[Rollout], advantages: torch.Tensor,
                config: GRPOConfig, rollout_config, pad_id: int, device, iteration: int) -> dict:  # fmt: skip
    """`update` with a Learner built from these settings."""
    learner = Learner.of(stepper, reference, config, rollout_config, pad_id, device)
    return update(learner, rollouts, advantages, iteration)


def optimizer_step(learner: Learner, rollouts: list[Rollout], advantages: torch.Tensor,
                   ref_logps: list | None, members: list[int]) -> dict:  # fmt: skip
    """One optimizer step on the minibatch `members` (indices into rollouts), gradients
    accumulated over its micro-batches (this rank's share of them); returns the step's
    metrics, summed over the ranks."""
    config, stepper = learner.config, learner.stepper
    # Token-level reductions normalise by the minibatch's tokens, not the micro-batch's.
    num_items = max(sum(sum(rollouts[i].assistant_mask[1:]) for i in members), 1)
    mine = deal(members, stepper.rank, stepper.world)
    chunks = [mine[i : i + config.micro_batch_size]
              for i in range(0, len(mine), config.micro_batch_size)]  # fmt: skip
    step_metrics: dict[str, float] = {}
    for k, chunk in enumerate(chunks):
        real = [i for i, weight in chunk if weight]
        idx = real or [chunk[0][0]]  # a zero-weight pass keeps the ranks' forwards in step
        loss, metrics, tokens = _micro_batch_loss(
            learner, [rollouts[i] for i in idx], advantages[idx],
            None if ref_logps is None else [ref_logps[i] for i in idx], num_items,
        )  # fmt: skip
        # "grpo" and "dr_grpo" average over sequences: weight each micro-batch by its
        # share of the minibatch. "token" already divides by the minibatch's tokens.
        share = 1.0 if config.loss_type in TOKEN_LOSSES else len(real) / len(members)
        share = share if real else 0.0
        # Both engines average gradients over the ranks: scale back up to the sum.
        stepper.backward(loss * share * stepper.world, last=k == len(chunks) - 1)
        _add_step_metrics(step_metrics, loss, metrics, share, tokens / num_items if real else 0)
    step_metrics = all_sum(step_metrics)
    step_metrics["grad_norm"] = stepper.step()
    return step_metrics


def reference_logps(model, rollouts: Sequence[Rollout], learner: Learner) -> list[torch.Tensor]:
    """Each episode's log-probs under `model` (the frozen reference, or the weights about to
    be updated), [len - 1] on the CPU. Each rank scores its share; the ranks exchange them."""

    def score(indices: list[int]) -> list[torch.Tensor]:
        chunk = [rollouts[i] for i in indices]
        batch = collate_rollouts(chunk, learner.pad_id)
        lp = policy_logps(model, batch, learner.device, learner.temperature)
        return [row[: len(r.input_ids) - 1].float().cpu() for r, row in zip(chunk, lp, strict=True)]

    return score_shares(len(rollouts), learner.config.micro_batch_size, score)


def decouple_stale(learner: Learner, rollouts: list[Rollout], advantages: torch.Tensor,
                   iteration: int) -> tuple[list[Rollout], torch.Tensor, int]:  # fmt: skip
    """AReaL's decoupled PPO for the episodes sampled by an older version than the weights
    about to be updated (version iteration - 1): their old log-probs become the current
    weights' (the proximal policy: the clip is around it), and each sampled token's
    advantage is multiplied by min(pi_prox / pi_sampling, cap), the importance ratio from the
    stored sampling log-probs. Returns (rollouts, advantages [B, T], how many were stale)."""
    versions = [version_number(r.policy_version) for r in rollouts]
    stale = [i for i, v in enumerate(versions) if v is not None and v < iteration - 1]
    if not stale:
        return rollouts, advantages, 0
    learner.stepper.model.eval()
    prox = reference_logps(learner.stepper.module, [rollouts[i] for i in stale], learner)
    advantages = per_token(advantages, rollouts).clone()  # [B, T]
    rollouts = list(rollouts)
    for i, logps in zip(stale, prox, strict=True):  # logps[t]: token t + 1, [L - 1]
        r = rollouts[i]
        sampled = torch.tensor(r.assistant_mask[1:], dtype=torch.bool)
        behaviour = torch.tensor(r.sampling_logprobs[1:], dtype=torch.float32)
        weight = torch.exp(logps - behaviour).clamp(max=learner.config.stale_importance_cap)
        advantages[i, 1 : len(r.input_ids)] *= torch.where(sampled, weight, 1.0)
        old = [0.0] + torch.where(sampled, logps, 0.0).tolist()
        rollouts[i] = dataclasses.replace(r, sampling_logprobs=old)
    return rollouts, advantages, len(stale)


def _micro_batch_loss(learner: Learner, chunk: list[Rollout], advantages: torch.Tensor,
                      ref_logps: list | None, num_items: int):  # fmt: skip
    """(loss, metrics, scored tokens) of one micro-batch: losses.grpo_loss on the stored
    tokens, advantages [b, T] of its episodes, `ref_logps` their reference log-probs."""
    config, device = learner.config, learner.device
    batch = collate_rollouts(chunk, learner.pad_id)
    mask = batch["assistant_mask"][:, 1:].to(device)  # [b, T-1]; token t+1 scored at t
    old = batch["sampling_logprobs"][:, 1:].to(device)  # [b, T-1]
    model = learner.stepper.module
    policy_mask = None
    if config.top_entropy_quantile < 1.0:
        logps, entropies = policy_logps(model, batch, device, learner.temperature, True)
        policy_mask = high_entropy_mask(entropies, mask, config.top_entropy_quantile)
    else:  # [b, T-1] each; the entropies only where a token was sampled (the metric's)
        logps, entropies = policy_logps(model, batch, device, learner.temperature,
                                        sampled=mask)  # fmt: skip
    width = logps.shape[1]
    ref = None
    if ref_logps is not None:
        ref = pad_rows([r.tolist() for r in ref_logps], 0.0, torch.float32)[:, :width].to(device)
    loss, metrics = grpo_loss(
        logps,
        old,
        advantages[:, 1 : width + 1].to(device),  # [b, T-1], shifted like the mask
        mask,
        epsilon_low=config.epsilon_low,
        epsilon_high=config.epsilon_high,
        ref_logps=ref,
        beta=config.beta,
        loss_type=config.loss_type,
        max_completion_length=learner.max_completion_length,
        num_items=float(num_items),
        policy_mask=policy_mask,
    )
    metrics["entropy"] = masked_mean(entropies, mask.to(entropies.dtype))
    return loss, metrics, mask.sum().item()


def _add_step_metrics(
    step_metrics: dict, loss: torch.Tensor, metrics: dict, weight: float, token_share: float
) -> None:
    """Add one micro-batch's loss and metrics to its optimizer step's: the loss and
    policy_loss weighted like the loss, token metrics by the micro-batch's share of tokens."""
    step_metrics["loss"] = step_metrics.get("loss", 0.0) + loss.item() * weight
    for key in ("policy_loss", "kl", "clip_region", "clip_low", "clip_high", "ratio", "entropy"):
        share = weight if key == "policy_loss" else token_share
        step_metrics[key] = step_metrics.get(key, 0.0) + metrics[key].item() * share
