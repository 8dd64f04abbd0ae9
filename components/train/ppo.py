"""PPO with a learned value function, on the same multi-turn sandboxed episodes as GRPO
(the product brief's "PPO/GRPO"; verl and OpenRLHF ship both).

An iteration samples exactly GRPO's episodes (grpo/sources.py: the seeded task stream,
G = group_size verified TITO episodes per task, in-process or on a server, with their
reward), and learns from them with a critic instead of the group baseline:

1. a value head on the policy: one linear layer from the last hidden state to a scalar
   V(state) at every position, read from the forward that gives the log-probs. The trunk
   is shared (the value loss reaches the weights, or with LoRA the adapters, beside which
   the head trains). The head starts at zero: V = 0 everywhere, a neutral prior for
   rewards in [-1, 1]. It has its own AdamW (`value_learning_rate`): the policy's stepper
   (plain or DeepSpeed) does not hold it;
2. before the update the current weights score every episode once, without gradients:
   the old values (the value clip's centre) and, with beta > 0, the reference log-probs;
3. GAE over the agent's sampled tokens (`gae`, after verl's multi-turn GAE): the episode's
   reward arrives at its last sampled token (`terminal_rewards`); environment tokens (the
   observations, the chat template, padding) carry no action, so they get no advantage and
   no value loss, and GAE steps over them: a turn's last token bootstraps from the value
   of the next turn's first. The advantages are then whitened over the batch's tokens;
4. `ppo_epochs` passes of minibatch steps on exactly the stored token ids, the sampling
   log-probs as old log-probs: GRPO's clipped policy loss with the k3 KL to the frozen
   reference (losses.grpo_loss), plus value_coef x the clipped value loss (`value_loss`,
   cleanrl's and OpenRLHF's).

What it simplifies: one head on a shared trunk (no separate critic model, so a critic
cannot be larger than the policy); the reward is the verifier's episode reward alone, no
per-token KL penalty in the reward (the KL is a loss term, as GRPO's); a truncated episode
is treated as terminal.

Shifted positions: position t of every [B, T-1] tensor here is the state before token
t + 1 (the logits at t score token t + 1, as losses.token_logprobs), so the action mask is
assistant_mask[:, 1:].

The rest is GRPO's recipe, composed: `train_ppo` is grpo.recipe.train_grpo with `PPO`, the
record of PPO's own part (`ppo_steps`: the learning step above and the head's file in each
checkpoint). Sampling, dynamic sampling, served sampling and policy sync, verification and
quarantine of unsigned verdicts, checkpoints and resume, metrics.jsonl and MLflow are the
recipe's. The head and its optimizer are written to output_dir/value/iter-NNNNNN.pt before
each checkpoint (so a complete checkpoint always has its head) and restored with it.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from components.policy.lora import reference_or_base
from components.rollout.engine import Rollout
from components.train.checkpoints import checkpoint_root
from components.train.config import PPOConfig
from components.train.grpo.advantages import pad_rows, rollout_rewards
from components.train.grpo.recipe import (
    Algorithm,
    GRPOResult,
    Steps,
    rollout_metrics,
    train_grpo,
)
from components.train.grpo.update import (
    TOKEN_LOSSES,
    Learner,
    collate_rollouts,
    masked_entropy,
    reference_logps,
    run_minibatches,
)
from components.train.losses import grpo_loss, masked_mean, token_logprobs
from components.train.parallel import all_sum, deal, score_shares, world

# ---------------------------------------------------------------------------------------
# The math: pure tensor functions. B episodes, T positions; masks are 1 on action tokens.


def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Each episode's reward on its last action token: rewards [B], mask [B, T]. Returns
    [B, T] float32, 0 elsewhere (everywhere in a row without an action token)."""
    mask = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # [B, T]
    last = torch.where(mask, positions, -1).max(dim=1).values  # [B]; -1: no action
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [B, T]
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = rewards[rows].float()
    return out


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over each row's action
    tokens. rewards, values, mask: [B, T]; mask 1 on action tokens.

    Positions where mask is 0 are not steps: the TD error of an action token uses the
    value of the *next action token* (across an observation, the next turn's first token),
    and the row ends after its last action token (terminal: next value 0). A reward on a
    position where mask is 0 is never read. Returns (advantages, returns), [B, T] float32,
    returns = advantages + values, both 0 where mask is 0.
    """
    act = mask.bool()  # [B, T]
    rewards, values = rewards.float(), values.float()
    advantages = torch.zeros_like(values)  # [B, T]
    next_value = values.new_zeros(values.shape[0])  # [B] V of the next action's state
    running = values.new_zeros(values.shape[0])  # [B] the next action's advantage
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        here = delta + gamma * lam * running  # [B]
        advantages[:, t] = torch.where(act[:, t], here, 0.0)
        next_value = torch.where(act[:, t], values[:, t], next_value)
        running = torch.where(act[:, t], here, running)
    returns = torch.where(act, advantages + values, 0.0)  # [B, T]
    return advantages, returns


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float,
    num_items: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped value loss of cleanrl's ppo.py and OpenRLHF's ValueLoss:
    0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2) per token, summed
    over the masked tokens and divided by their count (or `num_items`: the whole
    minibatch's, when micro-batches accumulate); clip 0 = the unclipped (V - R)^2 / 2.
    values, old_values, returns, mask: [B, T]. Returns (loss, {"value_clip_frac": the
    share of masked tokens where the clipped term is the larger, detached}).
    """
    mask = mask.to(values.dtype)  # [B, T]
    unclipped = (values - returns) ** 2  # [B, T]
    per_token = unclipped
    if clip > 0:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)  # [B, T]
        per_token = torch.max(unclipped, (clipped - returns) ** 2)  # [B, T]
    divisor = mask.sum().clamp(min=1.0) if num_items is None else num_items
    loss = 0.5 * (per_token * mask).sum() / divisor
    with torch.no_grad():
        clipped_share = masked_mean((per_token > unclipped).to(values.dtype), mask)
    return loss, {"value_clip_frac": clipped_share}


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries (population std), 0 elsewhere:
    [B, T] as `values`."""
    chosen = values[mask.bool()]  # [N]
    if chosen.numel() == 0:
        return torch.zeros_like(values)
    scaled = (values - chosen.mean()) / (chosen.std(unbiased=False) + eps)  # [B, T]
    return torch.where(mask.bool(), scaled, 0.0)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked entries (cleanrl's): 1 for a
    perfect value function, 0 for a constant one; 0 when the returns do not vary (variance
    under 1e-8: equal episode rewards give returns equal up to float rounding, whose ratio
    would be noise in the millions)."""
    m = mask.bool()
    target, predicted = returns[m].double(), values[m].double()  # [N]
    spread = target.var(unbiased=False) if target.numel() else torch.tensor(0.0)
    if spread < 1e-8:
        return 0.0
    return float(1.0 - (target - predicted).var(unbiased=False) / spread)


# ---------------------------------------------------------------------------------------
# The value head


@dataclass
class Critic:
    """The value head, a linear layer over the policy's last hidden state, and its own
    optimizer. Every rank holds the whole head; its gradients are averaged over the ranks
    at each step, like the plain stepper's."""

    head: torch.nn.Linear
    optimizer: torch.optim.Optimizer
    max_grad_norm: float

    @classmethod
    def of(cls, model, config: PPOConfig, device) -> Critic:
        head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        optimizer = torch.optim.AdamW(
            head.parameters(), lr=config.value_learning_rate, weight_decay=config.weight_decay
        )
        return cls(head, optimizer, config.max_grad_norm)

    def values(self, hidden: Tensor) -> Tensor:
        """hidden [b, T, H] -> V [b, T], float32 whatever the policy's dtype."""
        return self.head(hidden.float()).squeeze(-1)

    def step(self) -> float:
        """Average the gradients over the ranks, clip, step, zero; returns the grad norm."""
        params = list(self.head.parameters())
        _, size = world()
        if size > 1:
            import torch.distributed as dist

            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= size
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def save(self, path: Path) -> None:
        """Head and optimizer state, written to a temporary file and renamed into place."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load(self, path: Path) -> None:
        if not path.is_file():
            raise ValueError(f"{path}: the value head of this checkpoint is missing")
        state = torch.load(path, map_location=self.head.weight.device, weights_only=True)
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])


def value_file(output_dir: Path, iteration: int) -> Path:
    return Path(output_dir) / "value" / f"iter-{iteration:06d}.pt"


def policy_outputs(
    module, critic: Critic, batch: dict, device, temperature: float, mask: Tensor | None = None
):
    """One forward of the policy on a collated batch: log p(token t+1) at the sampling
    temperature, V(state t), and with `mask` the entropies at its positions (0 elsewhere),
    each [b, T-1] (entropies None without a mask)."""
    ids = batch["input_ids"].to(device)  # [b, T]
    out = module(
        input_ids=ids, attention_mask=batch["attention_mask"].to(device), output_hidden_states=True
    )
    logps = token_logprobs(out.logits, ids, temperature)  # [b, T-1]
    values = critic.values(out.hidden_states[-1][:, :-1])  # [b, T-1]
    entropies = None if mask is None else masked_entropy(out.logits, mask, temperature)
    return logps, values, entropies


# ---------------------------------------------------------------------------------------
# The update


@dataclass(frozen=True)
class Targets:
    """What an iteration's update trains toward, fixed before its first step: [B, W] each,
    W = the longest episode's length - 1 (shifted positions)."""

    mask: Tensor  # bool, the action tokens
    advantages: Tensor
    returns: Tensor
    old_values: Tensor
    ref_logps: Tensor | None  # None without a KL term (beta 0)


def targets(learner: Learner, critic: Critic, rollouts: Sequence[Rollout]) -> tuple[Targets, dict]:
    """Old values and reference log-probs from the weights before the update, the rewards
    on the last action tokens, GAE; and the iteration's value numbers."""
    config, stepper = learner.config, learner.stepper

    def score(indices: list[int]) -> list[Tensor]:
        chunk = [rollouts[i] for i in indices]
        batch = collate_rollouts(chunk, learner.pad_id)
        _, values, _ = policy_outputs(
            stepper.module, critic, batch, learner.device, learner.temperature
        )
        return [row[: len(r.input_ids) - 1].cpu() for r, row in zip(chunk, values, strict=True)]

    stepper.model.eval()
    values = pad_sequence(
        score_shares(len(rollouts), config.micro_batch_size, score), batch_first=True
    )  # [B, W]
    ref = None
    if config.beta > 0:
        with reference_or_base(stepper.model, learner.reference) as frozen:
            ref = pad_sequence(reference_logps(frozen, rollouts, learner), batch_first=True)
    mask = pad_rows([r.assistant_mask[1:] for r in rollouts], 0, torch.bool)  # [B, W]
    rewards = torch.tensor([float(r.result.reward) for r in rollouts])  # [B]
    advantages, returns = gae(
        terminal_rewards(rewards, mask), values, mask, config.gamma, config.gae_lambda
    )
    numbers = {
        "explained_variance": explained_variance(values, returns, mask),
        "value_mean": float(masked_mean(values, mask)),
        "return_mean": float(masked_mean(returns, mask)),
        "advantage_abs_mean": float(masked_mean(advantages.abs(), mask)),
    }
    if config.normalize_advantages:
        advantages = whiten(advantages, mask)
    return Targets(mask, advantages, returns, values, ref), numbers


def ppo_update(learner: Learner, critic: Critic, rollouts: list[Rollout], iteration: int) -> dict:
    """ppo_epochs passes of minibatch steps over the episodes (all valid, each with an action
    token); returns the iteration's value numbers and the steps' mean metrics."""
    config = learner.config
    goal, row = targets(learner, critic, rollouts)
    learner.stepper.model.train()
    row.update(
        run_minibatches(
            config,
            iteration,
            rollouts,
            lambda members: _optimizer_step(learner, critic, rollouts, goal, members),
        )
    )
    return row


def _optimizer_step(
    learner: Learner, critic: Critic, rollouts: list[Rollout], goal: Targets, members: list[int]
) -> dict:
    """One step of the policy and the head on the minibatch `members`, gradients accumulated
    over this rank's micro-batches; its metrics summed over the ranks."""
    config, stepper = learner.config, learner.stepper
    num_items = max(int(goal.mask[members].sum()), 1)  # the minibatch's action tokens
    mine = deal(members, stepper.rank, stepper.world)
    size = config.micro_batch_size
    chunks = [mine[i : i + size] for i in range(0, len(mine), size)]
    sums: dict[str, float] = {}
    for k, chunk in enumerate(chunks):
        real = [i for i, weight in chunk if weight]
        idx = real or [chunk[0][0]]  # a zero-weight pass keeps the ranks' forwards in step
        policy, value, metrics = _micro_batch_loss(learner, critic, rollouts, goal, idx, num_items)
        # A sequence-mean policy loss weighs the micro-batch by its share of the episodes;
        # token reductions and the value loss already divide by the minibatch's tokens.
        on = 1.0 if real else 0.0
        share = on * (1.0 if config.loss_type in TOKEN_LOSSES else len(real) / len(members))
        loss = policy * share + config.value_coef * value * on
        stepper.backward(loss * stepper.world, last=k == len(chunks) - 1)
        tokens = on * float(goal.mask[idx].sum()) / num_items
        weights = {"policy_loss": share, "value_loss": on}
        for key, number in {**metrics, "loss": loss.item(), "value_loss": value.item()}.items():
            weight = 1.0 if key == "loss" else weights.get(key, tokens)
            sums[key] = sums.get(key, 0.0) + number * weight
    sums = all_sum(sums)
    sums["grad_norm"] = stepper.step()
    sums["value_grad_norm"] = critic.step()
    return sums


def _micro_batch_loss(
    learner: Learner,
    critic: Critic,
    rollouts: list[Rollout],
    goal: Targets,
    idx: list[int],
    num_items: int,
):
    """(policy loss, value loss, metrics) of the episodes `idx`: one forward, GRPO's clipped
    loss and KL on the GAE advantages, the clipped value loss on the returns."""
    config, device = learner.config, learner.device
    batch = collate_rollouts([rollouts[i] for i in idx], learner.pad_id)
    mask = batch["assistant_mask"][:, 1:].to(device)  # [b, W']; token t+1 scored at t
    logps, values, entropies = policy_outputs(
        learner.stepper.module, critic, batch, device, learner.temperature, mask
    )
    width = logps.shape[1]

    def rows(t: Tensor | None) -> Tensor | None:  # this micro-batch's part, [b, W']
        return None if t is None else t[idx, :width].to(device)

    policy, metrics = grpo_loss(
        logps,
        batch["sampling_logprobs"][:, 1:].to(device),
        rows(goal.advantages),
        mask,
        epsilon_low=config.epsilon_low,
        epsilon_high=config.epsilon_high,
        ref_logps=rows(goal.ref_logps),
        beta=config.beta,
        loss_type=config.loss_type,
        max_completion_length=learner.max_completion_length,
        num_items=float(num_items),
    )
    value, value_metrics = value_loss(
        values, rows(goal.old_values), rows(goal.returns), mask, config.value_clip, float(num_items)
    )
    metrics = {**metrics, **value_metrics, "entropy": masked_mean(entropies, mask)}
    return policy, value, {key: float(number) for key, number in metrics.items()}


# ---------------------------------------------------------------------------------------
# PPO's part of the recipe: the learning step, the head in each checkpoint


def ppo_steps(learner: Learner, output_dir: Path, start: dict) -> Steps:
    """A run's value head (restored with the checkpoint the run resumes), the PPO update as
    its learning step, and the head saved before each checkpoint, pruned after."""
    critic = Critic.of(learner.stepper.model, learner.config, learner.device)
    if start["checkpoint"] is not None:
        critic.load(value_file(output_dir, start["iteration"]))
    return Steps(
        learn=functools.partial(learn_ppo, learner, critic),
        save=lambda iteration: critic.save(value_file(output_dir, iteration)),
        prune=functools.partial(prune_heads, output_dir),
    )


def learn_ppo(learner: Learner, critic: Critic, rollouts: list[Rollout], iteration: int) -> dict:
    """GAE and the PPO update on the iteration's valid episodes; returns its metrics.
    Infra failures and unsigned verdicts are dropped, as GRPO drops them."""
    t0 = time.perf_counter()
    _, _, valid = rollout_rewards(rollouts)
    row = rollout_metrics(rollouts, valid)
    kept = [
        r for r, ok in zip(rollouts, valid.tolist(), strict=True) if ok and any(r.assistant_mask)
    ]
    if kept:
        row.update(ppo_update(learner, critic, kept, iteration))
    else:
        logging.getLogger(__name__).warning(
            "PPO iteration %d: no valid episode with a sampled token: no update", iteration
        )
        row.update(optimizer_steps=0, update_tokens=0)
    row["update_seconds"] = time.perf_counter() - t0
    return row


def prune_heads(output_dir: Path) -> None:
    """Delete the heads whose checkpoint is gone (checkpoints.save_checkpoint keeps the last
    keep_checkpoints)."""
    kept = {p.name for p in checkpoint_root(output_dir).glob("iter-*")}
    for head in (output_dir / "value").glob("iter-*.pt"):
        if head.stem not in kept:
            head.unlink()


PPO = Algorithm("ppo", ppo_steps)


def train_ppo(model, tokenizer, tasks, config: PPOConfig, *configs, **options) -> GRPOResult:
    """Train `model` in place for `config.iterations` PPO iterations; save it to
    output_dir/policy (without the head, which stays in output_dir/value/). grpo.recipe.
    train_grpo with PPO's part: `configs` (rollout, env, sandbox) and `options` (reference,
    resume, generate_fn) are its: `reference` the KL reference (None: a frozen copy of
    `model`, with LoRA the base), `generate_fn` replaces in-process sampling (tests)."""
    return train_grpo(model, tokenizer, tasks, config, *configs, algorithm=PPO, **options)


def main_ppo(argv: Sequence[str] | None = None) -> int:
    """PPO with a value head from a saved policy on a task suite, every setting from the
    preset's sections ppo, rollout, env and sandbox (a missing section means its defaults).
    Under torchrun the ranks share the sampling and the update; rank 0 writes the results."""
    from components.train.grpo.cli import main_episode_trainer

    return main_episode_trainer("ppo", train_ppo, main_ppo.__doc__, argv)
