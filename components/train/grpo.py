"""GRPO on multi-turn sandboxed episodes: a plain torch loop, top to bottom.

One iteration = sample -> verify -> update:
1. pick `tasks_per_iteration` tasks from a seeded permutation of the task list (the data
   position is an integer into that endless stream, so it is saved and resumed exactly);
2. sample G = `group_size` episodes per task with `rollout.engine.sample_episodes` (the
   model in eval mode); each episode is verified in the sandbox and scored;
3. group-relative advantages with `losses.group_advantages`; infra failures (no reward)
   are left out of their group's mean and std *and* dropped from the update batch;
4. `ppo_epochs` passes over the batch in minibatches (one optimizer step each), the loss
   `losses.grpo_loss` on EXACTLY the stored token ids and assistant mask, with
   old_logps = the stored sampling log-probs (never re-tokenized, never recomputed), and
   an optional k3 KL to a frozen reference (beta > 0). Two options shape which tokens
   learn what: `turn_credit` adds each turn's own process reward to its tokens'
   advantage, and `top_entropy_quantile` < 1 keeps the policy term only on the
   highest-entropy tokens (the decisions), the KL on all of them (the format).

Why not TRL's GRPOTrainer (checked in trl 1.16's grpo_trainer.py): it does take a custom
`rollout_func` (experimental) returning prompt_ids / completion_ids / logprobs plus an
`env_mask` that marks observation tokens, so our token-exact episodes *could* be fed to
it. What does not fit:
- Infra failures: a reward of None becomes NaN and is excluded from the group baseline
  (advantage 0), but the episode stays in the batch: its tokens still enter the KL term,
  it still counts in the "grpo" mean over sequences and in the token denominators. We
  drop it entirely, so a broken sandbox cannot change the update.
- No leave-one-out baseline: RLOO lives in a separate trainer (RLOOTrainer), GRPOTrainer
  only has the group mean with scale_rewards group/batch/none.
- old_logps: the rollout's log-probs are used only for vLLM importance-sampling
  correction (`use_vllm`); otherwise TRL recomputes them with a forward pass (or detaches
  the current ones when num_iterations == 1). We train with the sampling log-probs as
  old_logps, whichever backend (in-process, vLLM, any OpenAI server) sampled them.
- Resume: Trainer resumes by optimizer step and skips dataloader batches; our data
  position, the per-iteration sampling seed and the episode sandbox live outside it, so
  an interrupted run would not provably end where an uninterrupted one ends.
So the loss is our pure tensor code, already tested equal to TRL's GRPO loss on
identical single-turn inputs (tests/train/test_losses.py), and this loop is ~one file.

Checkpoints (every `checkpoint_every` iterations and at the end) hold the weights
(save_pretrained), the optimizer state, torch / CUDA / python / numpy RNG states, the
iteration, the data position and a hash of the settings that shape the run; each is
written to a temporary folder and renamed into place, so a kill leaves the previous
checkpoint intact. `resume=True` continues from the latest one: a run killed and resumed
ends with the same weights and metrics as an uninterrupted run (tests/train/test_grpo.py).

Metrics of each iteration go to output_dir/metrics.jsonl, and to MLflow when a tracking
URI is configured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from components.env.config import EnvConfig
from components.env.sandbox import SandboxConfig
from components.rollout.config import RolloutConfig
from components.seeding import derive_seed
from components.rollout.engine import GenerateFn, Rollout, sample_episodes
from components.tasks.task import Task
from components.train.losses import (
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    token_entropy,
    token_logprobs,
    turn_token_advantages,
)
from components.typed_config import doc



@dataclass(frozen=True)
class GRPOConfig:
    """GRPO on multi-turn episodes: run length, groups, objective, optimizer, checkpoints."""

    iterations: int = field(
        default=10, metadata=doc("total iterations (sample -> verify -> update) of the run")
    )
    tasks_per_iteration: int = field(
        default=4, metadata=doc("tasks (groups) sampled per iteration, from a seeded permutation")
    )
    group_size: int = field(
        default=4,
        metadata=doc("G: episodes per task; overrides RolloutConfig.samples_per_task"),
    )
    learning_rate: float = field(default=1e-6, metadata=doc("AdamW learning rate (constant)"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    epsilon_low: float = field(
        default=0.2, metadata=doc("lower clip: the ratio is clipped below at 1 - epsilon_low")
    )
    epsilon_high: float = field(
        default=0.2,
        metadata=doc("upper clip: the ratio is clipped above at 1 + epsilon_high (DAPO: 0.28)"),
    )
    beta: float = field(
        default=0.0,
        metadata=doc("weight of the k3 KL to the frozen reference; 0 = no reference model"),
    )
    loss_type: Literal["grpo", "token", "dapo", "bnpo", "dr_grpo"] = field(
        default="grpo",
        metadata=doc(
            "reduction of the per-token loss (losses.grpo_loss): grpo = per-sequence mean; "
            "token/dapo/bnpo = over all tokens; dr_grpo = sum / (B * max_episode_tokens)"
        ),
    )
    scale_by_std: bool = field(
        default=True,
        metadata=doc("divide advantages by the group's reward std (GRPO); off = Dr. GRPO"),
    )
    leave_one_out: bool = field(
        default=False,
        metadata=doc("baseline = mean reward of the *other* samples of the group (RLOO)"),
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata=doc(
            "policy term only on this top fraction of each micro-batch's assistant tokens by "
            "entropy (Wang et al. 2025: 0.2; TRL's top_entropy_quantile); 1.0 = all tokens"
        ),
    )
    turn_credit: bool = field(
        default=False,
        metadata=doc(
            "add each turn's own process reward (EpisodeResult.step_rewards), normalised over "
            "the group's turns, to the advantage of that turn's tokens"
        ),
    )
    ppo_epochs: int = field(
        default=1,
        metadata=doc(
            "mu: passes over each iteration's batch; > 1 reuses the samples and the clip matters"
        ),
    )
    minibatch_size: int = field(
        default=0,
        metadata=doc("episodes per optimizer step; 0 = the whole batch (one step per epoch)"),
    )
    micro_batch_size: int = field(
        default=4,
        metadata=doc("episodes per forward/backward (gradient accumulation inside a minibatch)"),
    )
    max_grad_norm: float = field(
        default=1.0, metadata=doc("clip the gradient norm to this (0 = no clipping)")
    )
    seed: int = field(
        default=0, metadata=doc("seed of the task order, the sampling seeds and minibatch order")
    )
    checkpoint_every: int = field(
        default=1,
        metadata=doc("write a resumable checkpoint every N iterations (and at the end)"),
    )
    keep_checkpoints: int = field(
        default=2, metadata=doc("most recent checkpoints kept on disk (>= 1)")
    )
    use_cpu: bool = field(default=False, metadata=doc("train on CPU even where a GPU is visible"))
    output_dir: str = field(
        default="runs/grpo",
        metadata=doc("checkpoints/, metrics.jsonl and the final policy/ are written here"),
    )
    mlflow_tracking_uri: str = field(
        default="", metadata=doc("MLflow tracking URI ('' = do not log to MLflow)")
    )
    mlflow_experiment: str = field(
        default="agentrl-grpo", metadata=doc("MLflow experiment name of the run")
    )

    def __post_init__(self) -> None:
        for name in ("iterations", "tasks_per_iteration", "ppo_epochs", "micro_batch_size",
                     "checkpoint_every", "keep_checkpoints"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1")
        if self.group_size < 2:
            raise ValueError("GRPOConfig.group_size must be >= 2 (a group needs a baseline)")
        if self.learning_rate <= 0:
            raise ValueError("GRPOConfig.learning_rate must be positive")
        for name in ("weight_decay", "max_grad_norm", "beta", "minibatch_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"GRPOConfig.{name} must be >= 0")
        if not 0.0 <= self.epsilon_low < 1.0:
            raise ValueError("GRPOConfig.epsilon_low must be in [0, 1)")
        if self.epsilon_high < 0:
            raise ValueError("GRPOConfig.epsilon_high must be >= 0")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError("GRPOConfig.top_entropy_quantile must be in [0, 1]")
        if self.loss_type not in ("grpo", "token", "dapo", "bnpo", "dr_grpo"):
            raise ValueError(f"GRPOConfig.loss_type: unknown {self.loss_type!r}")


@dataclass
class GRPOResult:
    iterations: int  # the last completed iteration (== config.iterations)
    resumed_from: int | None  # iteration of the checkpoint this call started from
    metrics: list[dict]  # one row per iteration run by this call
    checkpoint_dir: str  # the latest checkpoint
    policy_dir: str  # the final policy (save_policy)
    train_seconds: float


# ---------------------------------------------------------------------------------------
# Data order and seeds: pure functions of (seed, position), so a resumed run replays them.


def pick_tasks(num_tasks: int, position: int, count: int, seed: int) -> list[int]:
    """Indices of the `count` tasks at `position` of the endless stream of seeded
    permutations (epoch e = position // num_tasks uses permutation (seed, e))."""
    picked = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, num_tasks)
        order = list(range(num_tasks))
        random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
        picked.append(order[offset])
    return picked


def config_hash(config: GRPOConfig, rollout_config: RolloutConfig) -> str:
    """What must not change between a run and its resumption (run length and where logs
    go may)."""
    free = {"iterations", "checkpoint_every", "keep_checkpoints", "output_dir",
            "mlflow_tracking_uri", "mlflow_experiment", "use_cpu"}  # fmt: skip
    shaping = {k: v for k, v in dataclasses.asdict(config).items() if k not in free}
    payload = json.dumps([shaping, dataclasses.asdict(rollout_config)], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------
# Batch: rollouts -> padded tensors, exactly as sampled.


def rollout_rewards(rollouts: Sequence[Rollout]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards [B] with NaN for infra failures, group ids [B], valid mask [B] bool)."""
    groups: dict[str, int] = {}
    rewards, group_ids, valid = [], [], []
    for r in rollouts:
        ok = not r.infra_failure and r.result.reward is not None
        rewards.append(float(r.result.reward) if ok else float("nan"))
        group_ids.append(groups.setdefault(r.group_id, len(groups)))
        valid.append(ok)
    return (
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(group_ids, dtype=torch.long),
        torch.tensor(valid, dtype=torch.bool),
    )


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
    turns = _pad([token_turns(r.assistant_mask) for r in rollouts], -1, torch.long)  # [B, T]
    return turn_token_advantages(
        advantages, turn_rewards, turns, group_ids, scale_by_std=scale_by_std
    )


def _pad(rows: Sequence[Sequence], fill, dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)


def collate_rollouts(rollouts: Sequence[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [B, T] tensors of the stored episodes; the mask is 0 on padding."""
    return {
        "input_ids": _pad([r.input_ids for r in rollouts], pad_id, torch.long),  # [B, T]
        "attention_mask": _pad([[1] * len(r.input_ids) for r in rollouts], 0, torch.long),
        "assistant_mask": _pad([r.assistant_mask for r in rollouts], 0, torch.long),  # [B, T]
        "sampling_logprobs": _pad([r.sampling_logprobs for r in rollouts], 0.0, torch.float32),
    }


def _policy_logps(model, batch: dict, device, temperature: float, entropy: bool = False):
    """log p(input_ids[:, t+1]) under `model` at the sampling temperature: [B, T-1]; with
    `entropy`, also the (detached) entropy of each of those distributions, [B, T-1]."""
    ids = batch["input_ids"].to(device)
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"].to(device)).logits
    logps = token_logprobs(logits, ids, temperature=temperature)
    if not entropy:
        return logps
    with torch.no_grad():
        return logps, token_entropy(logits, temperature)


# ---------------------------------------------------------------------------------------
# Checkpoints


def _rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def _checkpoint_root(config: GRPOConfig) -> Path:
    return Path(config.output_dir) / "checkpoints"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest iteration (temporary folders never count)."""
    root = Path(output_dir) / "checkpoints"
    done = sorted(p for p in root.glob("iter-*") if (p / "state.json").is_file())
    return done[-1] if done else None


def save_checkpoint(model, optimizer, config: GRPOConfig, state: dict) -> Path:
    """Write weights, optimizer, RNG and `state` to a temporary folder, then rename it."""
    root = _checkpoint_root(config)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{state['iteration']:06d}"
    for stale in root.glob(".tmp-*"):  # left by a run killed while writing (one writer)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{final.name}"
    model.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / "trainer_state.pt")
    # state.json last: its presence marks the folder complete.
    (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    if final.exists():  # a rerun of the same iteration after a resume replaces it
        shutil.rmtree(final)
    os.replace(tmp, final)
    kept = sorted(p for p in root.glob("iter-*") if (p / "state.json").is_file())
    for old in kept[: -config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer) -> dict:
    """Restore weights, optimizer and RNG in place; returns the saved state."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, dtype=next(model.parameters()).dtype
    )
    model.load_state_dict(loaded.state_dict())
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)  # our own file
    optimizer.load_state_dict(trainer_state["optimizer"])
    _set_rng_state(trainer_state["rng"])
    return json.loads((path / "state.json").read_text())


# ---------------------------------------------------------------------------------------
# Metrics


def _read_metrics(path: Path, up_to: int) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["iteration"] <= up_to]


def _write_metrics(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    os.replace(tmp, path)


def _rollout_metrics(rollouts: Sequence[Rollout], valid: torch.Tensor) -> dict:
    ok = [r for r, v in zip(rollouts, valid.tolist(), strict=True) if v]
    out = {
        "episodes": len(rollouts),
        "infra_failures": len(rollouts) - len(ok),
        "mean_reward": float(np.mean([r.result.reward for r in ok])) if ok else 0.0,
        "success_rate": float(np.mean([r.result.success for r in ok])) if ok else 0.0,
        "mean_steps": float(np.mean([r.result.steps for r in ok])) if ok else 0.0,
        "generated_tokens": sum(r.num_generated_tokens for r in rollouts),
    }
    terms = sorted({k for r in ok for k in r.result.reward_terms})
    for term in terms:
        out[f"reward/{term}"] = float(np.mean([r.result.reward_terms.get(term, 0.0) for r in ok]))
    return out


# ---------------------------------------------------------------------------------------
# The update


def _update(
    model,
    reference,
    optimizer,
    rollouts: list[Rollout],
    advantages: torch.Tensor,
    config: GRPOConfig,
    rollout_config: RolloutConfig,
    pad_id: int,
    device,
    iteration: int,
) -> dict:
    """ppo_epochs passes of minibatch steps over the valid rollouts; returns mean metrics."""
    temperature = rollout_config.temperature or 1.0  # greedy log-probs are stored at T = 1
    n = len(rollouts)
    minibatch = config.minibatch_size or n
    total_tokens = sum(len(r.input_ids) for r in rollouts)

    # Reference log-probs once per iteration: the reference never changes.
    ref_logps: list[torch.Tensor | None] = [None] * n
    if config.beta > 0:
        with torch.no_grad():
            for start in range(0, n, config.micro_batch_size):
                chunk = rollouts[start : start + config.micro_batch_size]
                lp = _policy_logps(reference, collate_rollouts(chunk, pad_id), device, temperature)
                for i, r in enumerate(chunk):
                    ref_logps[start + i] = lp[i, : len(r.input_ids) - 1].float().cpu()

    # Minibatch order from (seed, iteration): nothing drawn from the global RNG.
    generator = torch.Generator().manual_seed(derive_seed(config.seed, "minibatch", iteration))
    sums: dict[str, float] = {}
    steps = 0
    for _epoch in range(config.ppo_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, minibatch):
            members = order[start : start + minibatch]
            # Token-level reductions normalise by the minibatch's tokens, not the micro-batch's.
            num_items = sum(sum(rollouts[i].assistant_mask[1:]) for i in members)
            step_metrics: dict[str, float] = {}
            for micro in range(0, len(members), config.micro_batch_size):
                idx = members[micro : micro + config.micro_batch_size]
                chunk = [rollouts[i] for i in idx]
                batch = collate_rollouts(chunk, pad_id)
                mask = batch["assistant_mask"][:, 1:].to(device)  # [b, T-1]; token t+1 scored at t
                old = batch["sampling_logprobs"][:, 1:].to(device)  # [b, T-1]
                policy_mask = None
                if config.top_entropy_quantile < 1.0:
                    logps, entropies = _policy_logps(model, batch, device, temperature, True)
                    policy_mask = high_entropy_mask(entropies, mask, config.top_entropy_quantile)
                else:
                    logps = _policy_logps(model, batch, device, temperature)  # [b, T-1]
                ref = None
                if config.beta > 0:
                    ref = _pad([ref_logps[i].tolist() for i in idx], 0.0, torch.float32)
                    ref = ref[:, : logps.shape[1]].to(device)
                loss, metrics = grpo_loss(
                    logps,
                    old,
                    # [b] per episode, or [b, T-1] per token (turn_credit), shifted like mask
                    (
                        advantages[idx][:, 1 : logps.shape[1] + 1]
                        if advantages.dim() == 2
                        else advantages[idx]
                    ).to(device),
                    mask,
                    epsilon_low=config.epsilon_low,
                    epsilon_high=config.epsilon_high,
                    ref_logps=ref,
                    beta=config.beta,
                    loss_type=config.loss_type,
                    max_completion_length=rollout_config.max_episode_tokens,
                    num_items=float(max(num_items, 1)),
                    policy_mask=policy_mask,
                )
                # "grpo" and "dr_grpo" average over sequences: weight each micro-batch by its
                # share of the minibatch. "token" already divides by the minibatch's tokens.
                weight = (
                    1.0
                    if config.loss_type in ("token", "dapo", "bnpo")
                    else len(idx) / len(members)
                )
                (loss * weight).backward()
                step_metrics["loss"] = step_metrics.get("loss", 0.0) + loss.item() * weight
                for key in ("policy_loss", "kl", "clip_region", "clip_low", "clip_high", "ratio"):
                    # Token metrics weighted by the micro-batch's share of the tokens.
                    share = (
                        mask.sum().item() / max(num_items, 1) if key != "policy_loss" else weight
                    )
                    step_metrics[key] = step_metrics.get(key, 0.0) + metrics[key].item() * share
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), config.max_grad_norm or float("inf")
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_metrics["grad_norm"] = float(grad_norm)
            for key, value in step_metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
    out = {key: value / steps for key, value in sums.items()}
    out["optimizer_steps"] = steps
    out["update_tokens"] = total_tokens * config.ppo_epochs
    return out


# ---------------------------------------------------------------------------------------
# The loop


def train_grpo(
    model,
    tokenizer,
    tasks: Sequence[Task],
    config: GRPOConfig,
    rollout_config: RolloutConfig,
    env_config: EnvConfig,
    sandbox_config: SandboxConfig,
    *,
    reference=None,
    resume: bool = True,
    generate_fn: GenerateFn | None = None,
) -> GRPOResult:
    """Train `model` in place for `config.iterations` iterations; save it to output_dir/policy.

    `reference`: the frozen KL reference (beta > 0), or None for a frozen copy of `model`
    as passed in, i.e. before a checkpoint is restored: pass the *starting* policy on
    resume too. Episodes are sampled in-process with `model` (transformers backend);
    `generate_fn` overrides that (tests, benchmarks; it must sample from `model`).
    `resume=True` continues from the latest checkpoint in output_dir, if any.
    """
    from components.policy.model import save_policy

    if not tasks:
        raise ValueError("train_grpo: no tasks")
    if rollout_config.backend != "transformers" and generate_fn is None:
        # A server samples with its own copy of the weights; without a weight sync after
        # each update the episodes would silently come from a stale policy.
        raise ValueError("train_grpo samples in-process: use the transformers backend")
    use_cuda = torch.cuda.is_available() and not config.use_cpu
    device = torch.device("cuda" if use_cuda else "cpu")
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = output_dir / "metrics.jsonl"
    rollout_config = dataclasses.replace(rollout_config, samples_per_task=config.group_size)
    fingerprint = config_hash(config, rollout_config)
    pad_id = tokenizer.pad_token_id

    model.to(device)
    if config.beta > 0:
        reference = copy.deepcopy(model) if reference is None else reference
        reference.to(device).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )

    iteration, position, resumed_from = 0, 0, None
    checkpoint = latest_checkpoint(output_dir) if resume else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, model, optimizer)
        if state["config_hash"] != fingerprint:
            raise ValueError(
                f"{checkpoint}: written by a run with other settings (config hash "
                f"{state['config_hash']} != {fingerprint}); use another output_dir or resume=False"
            )
        iteration, position, resumed_from = (
            state["iteration"],
            state["data_position"],
            state["iteration"],
        )
    elif not resume:
        shutil.rmtree(_checkpoint_root(config), ignore_errors=True)
    # Rows a killed run logged after its last checkpoint are replayed, so they are dropped.
    history = _read_metrics(metrics_path, iteration)
    _write_metrics(metrics_path, history)

    mlflow = None
    if config.mlflow_tracking_uri:
        import mlflow

        mlflow.set_tracking_uri(config.mlflow_tracking_uri)
        mlflow.set_experiment(config.mlflow_experiment)
        mlflow.start_run(run_name=f"grpo-{fingerprint}")
        mlflow.log_params({**dataclasses.asdict(config), "config_hash": fingerprint,
                           "resumed_from": resumed_from, "num_tasks": len(tasks)})  # fmt: skip

    rows: list[dict] = []
    last_checkpoint = checkpoint
    started = time.perf_counter()
    try:
        while iteration < config.iterations:
            iteration += 1
            t0 = time.perf_counter()
            picked = [
                tasks[i]
                for i in pick_tasks(len(tasks), position, config.tasks_per_iteration, config.seed)
            ]
            position += config.tasks_per_iteration
            # One sampling seed per iteration: fresh samples each time, the same on a replay.
            sampling = dataclasses.replace(
                rollout_config, seed=derive_seed(config.seed, "sample", iteration)
            )
            model.eval()
            rollouts = sample_episodes(
                picked, model, tokenizer, sampling, env_config, sandbox_config,
                policy_name="grpo", generate_fn=generate_fn,
            )  # fmt: skip
            t1 = time.perf_counter()

            rewards, group_ids, valid = rollout_rewards(rollouts)
            # [B]; infra failures are out of their group's mean and std, and get 0.
            advantages = group_advantages(
                rewards, group_ids, scale_by_std=config.scale_by_std,
                leave_one_out=config.leave_one_out, valid_mask=valid,
            )  # fmt: skip
            episode_advantages = advantages  # [B]
            if config.turn_credit:  # [B, T]: each turn's tokens also get their turn's reward
                advantages = rollout_turn_advantages(
                    rollouts, advantages, valid, group_ids, config.scale_by_std
                )
            # Infra failures leave the batch: no tokens in the loss, the KL or a denominator
            # (an episode with no sampled token has nothing to train on either).
            keep = [
                i for i, v in enumerate(valid.tolist()) if v and any(rollouts[i].assistant_mask)
            ]
            row = {"iteration": iteration, "data_position": position}
            row.update(_rollout_metrics(rollouts, valid))
            row["advantage_abs_mean"] = (
                float(episode_advantages[keep].abs().mean()) if keep else 0.0
            )
            if keep:
                model.train()
                row.update(_update(
                    model, reference, optimizer, [rollouts[i] for i in keep], advantages[keep],
                    config, rollout_config, pad_id, device, iteration,
                ))  # fmt: skip
            else:
                row.update(optimizer_steps=0, update_tokens=0)
            t2 = time.perf_counter()
            row["sample_seconds"] = t1 - t0
            row["update_seconds"] = t2 - t1
            row["iteration_seconds"] = t2 - t0
            row["tokens_per_s"] = row["update_tokens"] / max(t2 - t1, 1e-9)
            row["sample_tokens_per_s"] = row["generated_tokens"] / max(t1 - t0, 1e-9)
            rows.append(row)
            history.append(row)
            _write_metrics(metrics_path, history)
            if mlflow is not None:
                mlflow.log_metrics({k: float(v) for k, v in row.items()}, step=iteration)
            if iteration % config.checkpoint_every == 0 or iteration == config.iterations:
                state = {"iteration": iteration, "data_position": position,
                         "config_hash": fingerprint, "seed": config.seed}  # fmt: skip
                last_checkpoint = save_checkpoint(model, optimizer, config, state)
        policy_dir = save_policy(model, tokenizer, output_dir / "policy")
    finally:
        if mlflow is not None:
            mlflow.end_run()
    return GRPOResult(
        iterations=iteration,
        resumed_from=resumed_from,
        metrics=rows,
        checkpoint_dir=str(last_checkpoint) if last_checkpoint else "",
        policy_dir=str(policy_dir),
        train_seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------------------
# Command line (wired into `agentrl train grpo` by components/train/__main__.py)


def main_grpo(argv: Sequence[str] | None = None) -> int:
    """`--policy DIR --tasks DIR --out DIR [...]`: GRPO from a saved policy on a task suite."""
    p = argparse.ArgumentParser(prog="agentrl train grpo", description=main_grpo.__doc__)
    p.add_argument("--policy", required=True, help="policy checkpoint (save_policy output)")
    p.add_argument("--tasks", required=True, help="task suite folder")
    p.add_argument("--split", default="train", help="task split to train on ('' = all)")
    p.add_argument("--out", required=True, help="output_dir: checkpoints, metrics, final policy")
    p.add_argument("--iterations", type=int, default=GRPOConfig.iterations)
    p.add_argument("--group-size", type=int, default=GRPOConfig.group_size)
    p.add_argument("--tasks-per-iteration", type=int, default=GRPOConfig.tasks_per_iteration)
    p.add_argument("--lr", type=float, default=GRPOConfig.learning_rate)
    p.add_argument("--beta", type=float, default=GRPOConfig.beta)
    p.add_argument("--loss-type", default=GRPOConfig.loss_type)
    p.add_argument("--no-scale-by-std", action="store_true", help="Dr. GRPO advantages")
    p.add_argument("--leave-one-out", action="store_true", help="RLOO baseline")
    p.add_argument("--turn-credit", action="store_true", help="per-turn process credit")
    p.add_argument("--top-entropy-quantile", type=float, default=1.0,
                   help="policy term on the top fraction of tokens by entropy (1 = all)")  # fmt: skip
    p.add_argument("--ppo-epochs", type=int, default=GRPOConfig.ppo_epochs)
    p.add_argument("--minibatch-size", type=int, default=GRPOConfig.minibatch_size)
    p.add_argument("--seed", type=int, default=GRPOConfig.seed)
    p.add_argument("--checkpoint-every", type=int, default=GRPOConfig.checkpoint_every)
    p.add_argument("--max-new-tokens", type=int, default=RolloutConfig.max_new_tokens)
    p.add_argument("--max-steps", type=int, default=RolloutConfig.max_steps)
    p.add_argument("--max-episode-tokens", type=int, default=RolloutConfig.max_episode_tokens)
    p.add_argument("--temperature", type=float, default=RolloutConfig.temperature)
    p.add_argument("--workers", type=int, default=RolloutConfig.workers)
    p.add_argument("--constrain-fix-ids", action="store_true",
                   help="try_fix ids drawn only among listed untried candidates")  # fmt: skip
    p.add_argument("--mlflow-uri", default="", help="MLflow tracking URI ('' = off)")
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring checkpoints")
    args = p.parse_args(argv)

    from components.policy.model import load_policy
    from components.tasks.task import load_tasks

    tasks, errors = load_tasks(args.tasks, split=args.split or None)
    if errors:
        raise SystemExit(f"task errors: {errors[:5]}")
    config = GRPOConfig(
        iterations=args.iterations, tasks_per_iteration=args.tasks_per_iteration,
        group_size=args.group_size, learning_rate=args.lr, beta=args.beta,
        loss_type=args.loss_type, scale_by_std=not args.no_scale_by_std,
        leave_one_out=args.leave_one_out, turn_credit=args.turn_credit,
        top_entropy_quantile=args.top_entropy_quantile,
        ppo_epochs=args.ppo_epochs,
        minibatch_size=args.minibatch_size, seed=args.seed,
        checkpoint_every=args.checkpoint_every, output_dir=args.out,
        mlflow_tracking_uri=args.mlflow_uri,
    )  # fmt: skip
    rollout_config = RolloutConfig(
        max_new_tokens=args.max_new_tokens, max_steps=args.max_steps,
        max_episode_tokens=args.max_episode_tokens, temperature=args.temperature,
        workers=args.workers, samples_per_task=args.group_size,
        constrain_fix_ids=args.constrain_fix_ids,
    )  # fmt: skip
    model, tokenizer = load_policy(args.policy)
    result = train_grpo(
        model, tokenizer, tasks, config, rollout_config, EnvConfig(), SandboxConfig(),
        resume=not args.no_resume,
    )  # fmt: skip
    last = result.metrics[-1] if result.metrics else {}
    summary = {"iterations": result.iterations, "resumed_from": result.resumed_from,
               "policy_dir": result.policy_dir, "checkpoint_dir": result.checkpoint_dir,
               "last": last}  # fmt: skip
    print(json.dumps(summary, indent=2))
    # Per-iteration curves as lists (one value per iteration) for the pipeline's tracking.
    curves = {
        k: [m.get(k) for m in result.metrics]
        for k in sorted({k for m in result.metrics for k in m})
        if all(isinstance(m.get(k), int | float) and not isinstance(m.get(k), bool)
               for m in result.metrics)
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({**summary, "curves": curves}, indent=2) + "\n")
    return 0
