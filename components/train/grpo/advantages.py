"""GRPO's advantages of an iteration's episodes: group-relative advantages of the episode
rewards (`losses.group_advantages`), optionally each turn's own process reward added to its
tokens (`turn_credit`). Infra failures (no reward) are left out of their group's mean and
std *and* out of the update batch, so a broken sandbox cannot change the update; so is an
episode whose verdict this pipeline's verifier did not sign under the current version
(components/verifier/provenance.py), counted and logged (`verified_rollout`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from components.rollout.engine import Rollout
from components.train.config import GRPOConfig
from components.train.losses import group_advantages, turn_token_advantages
from components.verifier.provenance import log_quarantine, unverified_reason


def advantages_of(rollouts: Sequence[Rollout], config: GRPOConfig):
    """(advantages, episode advantages [B], valid [B], keep).

    advantages: group-relative advantages of the episode rewards, [B], or with turn_credit
    [B, T], each turn's tokens also getting their turn's own reward. Infra failures are out
    of their group's mean and std and get 0; keep lists the episodes the update trains on.
    """
    rewards, group_ids, valid = rollout_rewards(rollouts)
    episode = group_advantages(
        rewards, group_ids, scale_by_std=config.scale_by_std,
        leave_one_out=config.leave_one_out, valid_mask=valid,
    )  # fmt: skip
    advantages = episode
    if config.turn_credit:
        advantages = rollout_turn_advantages(
            rollouts, episode, valid, group_ids, config.scale_by_std
        )  # [B, T]
    # Infra failures leave the batch: no tokens in the loss, the KL or a denominator
    # (an episode with no sampled token has nothing to train on either).
    keep = [i for i, v in enumerate(valid.tolist()) if v and any(rollouts[i].assistant_mask)]
    return advantages, episode, valid, keep


def rollout_rewards(rollouts: Sequence[Rollout]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards [B] with NaN for infra failures, group ids [B], valid mask [B] bool)."""
    groups: dict[str, int] = {}
    rewards, group_ids, valid = [], [], []
    quarantined: list[dict] = []
    for r in rollouts:
        ok = not r.infra_failure and r.result.reward is not None
        if ok and not verified_rollout(r, quarantined):
            ok = False
        rewards.append(float(r.result.reward) if ok else float("nan"))
        group_ids.append(groups.setdefault(r.group_id, len(groups)))
        valid.append(ok)
    log_quarantine(quarantined, "grpo advantages")
    return (
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(group_ids, dtype=torch.long),
        torch.tensor(valid, dtype=torch.bool),
    )


def verified_rollout(rollout: Rollout, quarantined: list[dict] | None = None) -> bool:
    """Its reward and success are the ones signed on its record by this pipeline's verifier
    under the current version; otherwise False, with the reason appended to `quarantined`."""
    result, record = rollout.result, rollout.result.record
    reason = unverified_reason(record)
    if reason is None and (record.get("reward") != result.reward
                           or (record.get("metadata") or {}).get("success") != result.success):  # fmt: skip
        reason = "the episode's reward or success differs from its signed record"
    if reason is not None and quarantined is not None:
        quarantined.append({"id": record.get("id"), "task_id": record.get("task_id"),
                            "reason": reason})  # fmt: skip
    return reason is None


def token_turns(assistant_mask: Sequence[int]) -> list[int]:
    """The turn (0, 1, ...) that sampled each token, -1 on tokens no turn sampled. Each
    completion is one contiguous run of mask 1 (an environment turn of at least one token
    separates two completions, and a completion has at least one token), so run k is the
    k-th assistant action."""
    out, turn, previous = [], -1, 0
    for m in assistant_mask:
        if m and not previous:
            turn += 1
        out.append(turn if m else -1)
        previous = m
    return out


def rollout_turn_advantages(
    rollouts: Sequence[Rollout], advantages: torch.Tensor, valid: torch.Tensor,
    group_ids: torch.Tensor, scale_by_std: bool,
) -> torch.Tensor:  # fmt: skip
    """[B, T] token advantages of GRPOConfig.turn_credit (losses.turn_token_advantages);
    infra failures carry no turn rewards."""
    steps = max((len(r.result.step_rewards) for r in rollouts), default=0)
    turn_rewards = torch.full((len(rollouts), max(steps, 1)), float("nan"))  # [B, S]
    for i, r in enumerate(rollouts):
        if valid[i]:
            row = r.result.step_rewards
            turn_rewards[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    turns = pad_rows([token_turns(r.assistant_mask) for r in rollouts], -1, torch.long)  # [B, T]
    return turn_token_advantages(
        advantages, turn_rewards, turns, group_ids, scale_by_std=scale_by_std
    )


def per_token(advantages: torch.Tensor, rollouts: Sequence[Rollout]) -> torch.Tensor:
    """[B, T] token advantages: per-episode ones [B] repeated over the episode's tokens (a
    view, no copy); [B, T] ones as they are."""
    if advantages.dim() == 2:
        return advantages
    width = max(len(r.input_ids) for r in rollouts)
    return advantages.reshape(-1, 1).expand(-1, width)  # [B, T]


def pad_rows(rows: Sequence[Sequence], fill, dtype) -> torch.Tensor:
    """Rows of different lengths as one right-padded [len(rows), longest] tensor."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)
