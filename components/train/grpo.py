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

Checkpoints (every `checkpoint_every` iterations and at the end; components/train/
checkpoints.py) hold everything a resumed run needs: `resume=True` continues from the latest
one, and a run killed and resumed ends with the same weights and metrics as an uninterrupted
run (tests/train/test_grpo.py). Metrics of each iteration go to output_dir/metrics.jsonl,
and to MLflow when a tracking URI is configured.

Sampling on an inference server (rollout.backend "openai": vLLM at scale, `agentrl serve`
on CPU): after each update the trainer writes the new policy version (checkpoints.
save_version: the LoRA adapters, or the full weights) and the server is made to serve it
by name before it samples (rollout/policy_sync.py): LoRA through vLLM's
/v1/load_lora_adapter, full weights through /update_weights_from_disk. The episodes keep
the server's token ids and log-probs as sampled, and each records the version that
sampled it. With `async_rollouts` the next iterations are sampled in a rollout process
while this one updates, each at most `max_staleness` versions behind
(train/async_rollouts.py); 0 reproduces the synchronous run exactly, and resume stays
exact (the versions a resumed run still samples with are kept on disk).

`agentrl train grpo` (main_grpo) takes every setting from a preset: sections grpo, rollout,
env, sandbox and runtime (with `rollout.server: vllm` it starts real vLLM on the policy's
base itself, waiting for it within runtime.startup_timeout_s; serve/vllm_launcher.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from components.env.config import EnvConfig
from components.policy.lora import reference_or_base
from components.rollout.completion import GenerateFn
from components.rollout.config import RolloutConfig
from components.rollout.engine import Rollout, sample_episodes
from components.rollout.policy_sync import PolicySyncError, version_number
from components.sandbox.config import SandboxConfig
from components.seeding import derive_seed
from components.tasks.task import Task
from components.train.async_rollouts import BackgroundRollouts, InlineRollouts, ServedSampler
from components.train.checkpoints import (
    prune_versions,
    read_metrics,
    restore,
    save_checkpoint,
    save_version,
    write_metrics,
)
from components.train.config import GRPOConfig
from components.train.losses import (
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    token_entropy,
    token_logprobs,
    turn_token_advantages,
)
from components.train.parallel import (
    all_gather_list,
    all_sum,
    deal,
    join_process_group,
    make_stepper,
    relaunch_as_ranks,
    save_gathered,
    world,
)

# Loss types that divide by the minibatch's tokens; the others average over sequences.
TOKEN_LOSSES = ("token", "dapo", "bnpo")


@dataclass
class GRPOResult:
    iterations: int  # the last completed iteration (== config.iterations)
    resumed_from: int | None  # iteration of the checkpoint this call started from
    metrics: list[dict]  # one row per iteration run by this call
    checkpoint_dir: str  # the latest checkpoint
    policy_dir: str  # the final policy (save_policy)
    train_seconds: float


# ---------------------------------------------------------------------------------------
# The recipe: setup, then iterations (sample -> advantages -> update), then finish.


# long: the recipe top to bottom: setup, iterations (episodes, update, version, checkpoint)
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
    resume too. With `config.lora`, None means the base with its adapters off (no copy).
    Episodes are sampled in-process with `model` (transformers backend; `generate_fn`
    overrides that: tests, benchmarks, it must sample from `model`), or on the server at
    rollout_config.base_url (openai backend), which must start from the same weights (LoRA:
    the same base) and allow runtime updates.
    `resume=True` continues from the latest checkpoint in output_dir, if any.
    """
    _check_inputs(tasks, config, rollout_config, generate_fn)
    rank, _ = world()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rollout_config = dataclasses.replace(rollout_config, samples_per_task=config.group_size)
    fingerprint = config_hash(config, rollout_config, env_config, sandbox_config)
    stepper, reference, device = _setup(model, reference, config)
    start = restore(output_dir, stepper, fingerprint, resume)
    iteration, position = start["iteration"], start["data_position"]
    resumed_from = iteration if start["checkpoint"] is not None else None
    # Rows a killed run logged after its last checkpoint are replayed, so they are dropped.
    metrics_path = output_dir / "metrics.jsonl"
    history = read_metrics(metrics_path, iteration)
    if rank == 0:
        write_metrics(metrics_path, history)
    mlflow = _start_tracking(config, fingerprint, resumed_from, len(tasks)) if rank == 0 else None

    rows: list[dict] = []
    last_checkpoint = start["checkpoint"]
    served = rollout_config.backend == "openai"
    if served and start["checkpoint"] is None:
        save_version(stepper, output_dir, 0)  # the starting policy, for the server
    # On a server, rank 0 samples (and syncs) alone and hands the episodes to the others.
    rollouts_source = _rollout_source(
        stepper, tokenizer, tasks, config, rollout_config, env_config, sandbox_config,
        generate_fn, output_dir, fingerprint, iteration,
    ) if rank == 0 or not served else None  # fmt: skip
    # Versions a resumed run may still sample with: max_staleness back from a checkpoint.
    lag = config.max_staleness if config.async_rollouts else 0
    started = time.perf_counter()
    try:
        while iteration < config.iterations:
            iteration += 1
            position += config.tasks_per_iteration
            row = {"iteration": iteration, "data_position": position}
            t0 = time.perf_counter()
            rollouts, sample_seconds, wait_seconds = _episodes(rollouts_source, iteration, served)
            rollouts, row["stale_dropped"], row["policy_lag"] = drop_stale(rollouts, iteration, lag)
            row.update(_iteration(stepper, reference, tokenizer, rollouts, iteration, config,
                                  rollout_config, device))  # fmt: skip
            if served:  # the new weights, for the server to load when they are needed
                save_version(stepper, output_dir, iteration)
                if rollouts_source is not None:
                    rollouts_source.publish(iteration)
            row.update(_timings(row, sample_seconds, wait_seconds, time.perf_counter() - t0))
            rows.append(row)
            if rank == 0:
                _log(row, history, metrics_path, mlflow)
            if iteration % config.checkpoint_every == 0 or iteration == config.iterations:
                state = {"iteration": iteration, "data_position": position,
                         "config_hash": fingerprint, "seed": config.seed}  # fmt: skip
                last_checkpoint = save_checkpoint(stepper, output_dir, state,
                                                  config.keep_checkpoints)  # fmt: skip
                if served and rank == 0:
                    prune_versions(output_dir, iteration - lag)
        policy_dir = save_gathered(stepper, tokenizer, output_dir / "policy")
    finally:
        if rollouts_source is not None:
            rollouts_source.close()
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


def _setup(model, reference, config: GRPOConfig):
    """(stepper, frozen reference or None, device): LoRA adapters if configured (then the
    KL reference is the base itself, adapters off), the model on this rank's device, the
    optimizer (DeepSpeed engine or AdamW)."""
    from components.policy.lora import add_adapters, without_adapters

    device = torch.device("cuda" if torch.cuda.is_available() and not config.use_cpu else "cpu")
    model = add_adapters(model, config.lora) if config.lora else without_adapters(model)
    model.to(device)
    if config.beta > 0 and (reference is not None or config.lora is None):
        reference = _frozen_reference(model, reference, device)
    stepper = make_stepper(
        model, config.deepspeed, learning_rate=config.learning_rate,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        micro_batch_size=config.micro_batch_size,
    )  # fmt: skip
    return stepper, reference, device


def _iteration(
    stepper, reference, tokenizer, rollouts: list[Rollout], iteration: int,
    config: GRPOConfig, rollout_config: RolloutConfig, device,
) -> dict:  # fmt: skip
    """Advantages and the update on this iteration's episodes. Returns its metrics
    (episodes, rewards, the update's means, its duration)."""
    t0 = time.perf_counter()
    advantages, episode_advantages, valid, keep = _advantages(rollouts, config)
    row = _rollout_metrics(rollouts, valid)
    row["advantage_abs_mean"] = float(episode_advantages[keep].abs().mean()) if keep else 0.0
    if keep:
        batch, batch_advantages = [rollouts[i] for i in keep], advantages[keep]
        if config.stale_importance_cap > 0:
            batch, batch_advantages, row["decoupled_episodes"] = decouple_stale(
                stepper, batch, batch_advantages, iteration, config,
                rollout_config, tokenizer.pad_token_id, device,
            )  # fmt: skip
        stepper.model.train()
        row.update(_update(
            stepper, reference, batch, batch_advantages,
            config, rollout_config, tokenizer.pad_token_id, device, iteration,
        ))  # fmt: skip
    else:
        row.update(optimizer_steps=0, update_tokens=0)
    row["update_seconds"] = time.perf_counter() - t0
    return row


def _episodes(source, iteration: int, served: bool) -> tuple[list[Rollout], float, float]:
    """(episodes, sampling seconds, waiting seconds) of an iteration on every rank. In
    process every rank samples its share (`_sample` exchanges them); on a server rank 0
    alone holds a source and its episodes are sent to the others."""
    if not served or world()[1] == 1:
        return source.get(iteration)
    got = source.get(iteration) if source is not None else ([], 0.0, 0.0)
    return all_gather_list(got)[0]


def decouple_stale(
    stepper, rollouts: list[Rollout], advantages: torch.Tensor, iteration: int,
    config: GRPOConfig, rollout_config: RolloutConfig, pad_id: int, device,
) -> tuple[list[Rollout], torch.Tensor, int]:  # fmt: skip
    """AReaL's decoupled PPO for the episodes sampled by an older version than the weights
    about to be updated (version iteration - 1): their old log-probs become the current
    weights' (the proximal policy: the clip is around it), and each sampled token's
    advantage is multiplied by min(pi_prox / pi_sampling, cap), the importance ratio from the
    stored sampling log-probs. Returns (rollouts, advantages [B, T], how many were stale)."""
    versions = [version_number(r.policy_version) for r in rollouts]
    stale = [i for i, v in enumerate(versions) if v is not None and v < iteration - 1]
    if not stale:
        return rollouts, advantages, 0
    temperature = rollout_config.temperature or 1.0
    stepper.model.eval()
    prox = _reference_logps(stepper.module, [rollouts[i] for i in stale], config, pad_id,
                            device, temperature)  # fmt: skip
    advantages = per_token(advantages, rollouts).clone()  # [B, T]
    rollouts = list(rollouts)
    for i, logps in zip(stale, prox, strict=True):  # logps[t]: token t + 1, [L - 1]
        r = rollouts[i]
        sampled = torch.tensor(r.assistant_mask[1:], dtype=torch.bool)
        behaviour = torch.tensor(r.sampling_logprobs[1:], dtype=torch.float32)
        weight = torch.exp(logps - behaviour).clamp(max=config.stale_importance_cap)
        advantages[i, 1 : len(r.input_ids)] *= torch.where(sampled, weight, 1.0)
        old = [0.0] + torch.where(sampled, logps, 0.0).tolist()
        rollouts[i] = dataclasses.replace(r, sampling_logprobs=old)
    return rollouts, advantages, len(stale)


def _timings(row: dict, sample_seconds: float, wait_seconds: float, seconds: float) -> dict:
    """Wall-clock metrics of an iteration. sample_seconds: spent sampling its episodes
    (overlapping earlier updates when asynchronous); rollout_wait_seconds: the trainer's
    wait for them; iteration_seconds: the trainer's whole iteration."""
    return {
        "sample_seconds": sample_seconds,
        "rollout_wait_seconds": wait_seconds,
        "iteration_seconds": seconds,
        "tokens_per_s": row["update_tokens"] / max(row["update_seconds"], 1e-9),
        "sample_tokens_per_s": row["generated_tokens"] / max(sample_seconds, 1e-9),
    }


def drop_stale(
    rollouts: list[Rollout], iteration: int, max_staleness: int
) -> tuple[list[Rollout], int, float]:
    """(episodes at most `max_staleness` versions behind the weights iteration `iteration`
    updates (version iteration - 1), how many were dropped, the kept ones' mean lag).
    Episodes sampled in-process record no version and are kept."""
    kept, lags = [], []
    for r in rollouts:
        version = version_number(r.policy_version)
        lag = 0 if version is None else iteration - 1 - version
        if lag <= max_staleness:
            kept.append(r)
            lags.append(lag)
    return kept, len(rollouts) - len(kept), float(np.mean(lags)) if lags else 0.0


def _rollout_source(
    stepper, tokenizer, tasks: Sequence[Task], config: GRPOConfig,
    rollout_config: RolloutConfig, env_config: EnvConfig, sandbox_config: SandboxConfig,
    generate_fn: GenerateFn | None, output_dir: Path, fingerprint: str, done: int,
):  # fmt: skip
    """Where iterations done+1.. get their episodes: sampled in-process when asked, through
    the server when asked, or through the server ahead of time (async_rollouts)."""

    def tasks_of(iteration: int) -> list[Task]:
        position = (iteration - 1) * config.tasks_per_iteration
        picked = pick_tasks(len(tasks), position, config.tasks_per_iteration, config.seed)
        return [tasks[i] for i in picked]

    if rollout_config.backend != "openai":
        return InlineRollouts(lambda iteration, _version: _sample(
            stepper, tokenizer, tasks_of(iteration), iteration, config, rollout_config,
            env_config, sandbox_config, generate_fn,
        ))  # fmt: skip
    sample = _served_sampler(tokenizer, tasks_of, config, rollout_config, env_config,
                             sandbox_config, output_dir, fingerprint, done)  # fmt: skip
    if not config.async_rollouts:
        return InlineRollouts(sample)
    return BackgroundRollouts(sample, done + 1, config.iterations, config.max_staleness, done)


def _served_sampler(
    tokenizer, tasks_of, config: GRPOConfig, rollout_config: RolloutConfig,
    env_config: EnvConfig, sandbox_config: SandboxConfig, output_dir: Path, fingerprint: str,
    done: int,
) -> ServedSampler:  # fmt: skip
    """The sampler of iterations done+1.. on the server (async_rollouts.ServedSampler)."""
    return ServedSampler(
        tasks={i: tasks_of(i) for i in range(done + 1, config.iterations + 1)},
        tokenizer=copy.deepcopy(tokenizer), rollout_config=rollout_config,
        env_config=env_config, sandbox_config=sandbox_config, output_dir=output_dir,
        prefix=f"{rollout_config.model}-{fingerprint[:8]}", lora=config.lora is not None,
        seed=config.seed,
    )  # fmt: skip


def _sample(
    stepper, tokenizer, tasks: Sequence[Task], iteration: int, config: GRPOConfig,
    rollout_config: RolloutConfig, env_config: EnvConfig, sandbox_config: SandboxConfig,
    generate_fn: GenerateFn | None,
) -> list[Rollout]:  # fmt: skip
    """The iteration's episodes sampled in-process, in (task, sample) order, on every rank:
    rank r samples the tasks r, r + world, ... (with the whole weights: ZeRO-3 gathers
    them) and the ranks exchange their episodes."""
    # One sampling seed per iteration: fresh samples each time, the same on a replay.
    sampling = dataclasses.replace(
        rollout_config, seed=derive_seed(config.seed, "sample", iteration)
    )
    stepper.model.eval()
    with stepper.gathered():
        mine = sample_episodes(
            tasks[stepper.rank :: stepper.world], stepper.model, tokenizer, sampling,
            env_config, sandbox_config, policy_name="grpo", generate_fn=generate_fn,
        )  # fmt: skip
    if stepper.world == 1:
        return mine
    order = {task.id: i for i, task in reversed(list(enumerate(tasks)))}
    gathered = [r for part in all_gather_list(mine) for r in part]
    return sorted(gathered, key=lambda r: (order[r.group_id], r.sample_index))


def _log(row: dict, history: list[dict], metrics_path: Path, mlflow) -> None:
    """Add an iteration's row to metrics.jsonl (rewritten whole) and to MLflow, if tracking."""
    history.append(row)
    write_metrics(metrics_path, history)
    if mlflow is not None:
        mlflow.log_metrics({k: float(v) for k, v in row.items()}, step=row["iteration"])


# ---------------------------------------------------------------------------------------
# Setup


def _check_inputs(
    tasks: Sequence[Task], config: GRPOConfig, rollout_config: RolloutConfig, generate_fn
) -> None:
    if not tasks:
        raise ValueError("train_grpo: no tasks")
    served = rollout_config.backend == "openai"
    if served and generate_fn is not None:
        raise ValueError("train_grpo: generate_fn samples in-process; the openai backend "
                         "samples on the server")  # fmt: skip
    if config.async_rollouts and not served:
        raise ValueError("GRPOConfig.async_rollouts samples through an inference server: "
                         "set rollout.backend to openai")  # fmt: skip


def _frozen_reference(model, reference, device):
    """The KL reference on `device`, frozen: `reference`, or a copy of `model` as it is now."""
    reference = copy.deepcopy(model) if reference is None else reference
    return reference.to(device).eval().requires_grad_(False)


def config_hash(
    config: GRPOConfig, rollout_config: RolloutConfig, env_config: EnvConfig,
    sandbox_config: SandboxConfig,
) -> str:  # fmt: skip
    """What must not change between a run and its resumption: everything that shapes the
    episodes, their rewards and the update (run length and where logs go may change)."""
    free = {"iterations", "checkpoint_every", "keep_checkpoints", "output_dir",
            "mlflow_tracking_uri", "mlflow_experiment", "use_cpu"}  # fmt: skip
    shaping = {k: v for k, v in dataclasses.asdict(config).items() if k not in free}
    # Where the server is and how patiently it is called do not shape the episodes.
    server = {"base_url", "request_timeout_s", "max_retries", "sync_retries", "sync_timeout_s",
              "sync_url"}  # fmt: skip
    rollout = {k: v for k, v in dataclasses.asdict(rollout_config).items() if k not in server}
    settings = [shaping, rollout, *map(dataclasses.asdict, (env_config, sandbox_config))]
    payload = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _start_tracking(config: GRPOConfig, fingerprint: str, resumed_from, num_tasks: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    if not config.mlflow_tracking_uri:
        return None
    import mlflow

    mlflow.set_tracking_uri(config.mlflow_tracking_uri)
    mlflow.set_experiment(config.mlflow_experiment)
    mlflow.start_run(run_name=f"grpo-{fingerprint}")
    mlflow.log_params({**dataclasses.asdict(config), "config_hash": fingerprint,
                       "resumed_from": resumed_from, "num_tasks": num_tasks})  # fmt: skip
    return mlflow


# ---------------------------------------------------------------------------------------
# Sample: the data order is a pure function of (seed, position), so a resumed run replays it.


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
# Advantages


def _advantages(rollouts: Sequence[Rollout], config: GRPOConfig):
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


def per_token(advantages: torch.Tensor, rollouts: Sequence[Rollout]) -> torch.Tensor:
    """[B, T] token advantages: per-episode ones [B] repeated over the episode's tokens (a
    view, no copy); [B, T] ones as they are."""
    if advantages.dim() == 2:
        return advantages
    width = max(len(r.input_ids) for r in rollouts)
    return advantages.reshape(-1, 1).expand(-1, width)  # [B, T]


# ---------------------------------------------------------------------------------------
# Update: batches are the stored episodes as sampled, right-padded to [B, T].


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


def _update(
    stepper,
    reference,
    rollouts: list[Rollout],
    advantages: torch.Tensor,
    config: GRPOConfig,
    rollout_config: RolloutConfig,
    pad_id: int,
    device,
    iteration: int,
) -> dict:
    """ppo_epochs passes of minibatch steps over the valid rollouts; returns mean metrics.

    advantages: [B, T] per token, or [B] per episode (repeated over its tokens). Every rank
    holds all rollouts; each step's minibatch is dealt out over the ranks (parallel.py).
    """
    temperature = rollout_config.temperature or 1.0  # greedy log-probs are stored at T = 1
    n = len(rollouts)
    minibatch = config.minibatch_size or n
    advantages = per_token(advantages, rollouts)  # [B, T]
    ref_logps = None
    if config.beta > 0:  # once per iteration: the reference never changes
        with reference_or_base(stepper.model, reference) as frozen:
            ref_logps = _reference_logps(frozen, rollouts, config, pad_id, device, temperature)
    # Minibatch order from (seed, iteration): nothing drawn from the global RNG.
    generator = torch.Generator().manual_seed(derive_seed(config.seed, "minibatch", iteration))
    sums: dict[str, float] = {}
    steps = 0
    for _epoch in range(config.ppo_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, minibatch):
            step_metrics = _optimizer_step(
                stepper, rollouts, advantages, ref_logps, order[start : start + minibatch],
                config, rollout_config, pad_id, device, temperature,
            )  # fmt: skip
            for key, value in step_metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
    out = {key: value / steps for key, value in sums.items()}
    out["optimizer_steps"] = steps
    out["update_tokens"] = sum(len(r.input_ids) for r in rollouts) * config.ppo_epochs
    return out


def _optimizer_step(
    stepper, rollouts: list[Rollout], advantages: torch.Tensor, ref_logps: list | None,
    members: list[int], config: GRPOConfig, rollout_config: RolloutConfig, pad_id: int, device,
    temperature: float,
) -> dict:  # fmt: skip
    """One optimizer step on the minibatch `members` (indices into rollouts), gradients
    accumulated over its micro-batches (this rank's share of them); returns the step's
    metrics, summed over the ranks."""
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
            stepper.module, [rollouts[i] for i in idx], advantages[idx],
            None if ref_logps is None else [ref_logps[i] for i in idx],
            config, rollout_config, pad_id, device, temperature, num_items,
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


def _reference_logps(
    reference, rollouts: Sequence[Rollout], config: GRPOConfig, pad_id: int, device,
    temperature: float,
) -> list[torch.Tensor]:  # fmt: skip
    """Each episode's log-probs under the frozen reference, [len - 1] on the CPU. Each rank
    scores its share of the episodes; the ranks exchange them."""
    rank, size = world()
    mine = deal(list(range(len(rollouts))), rank, size)
    out: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for start in range(0, len(mine), config.micro_batch_size):
            chunk = [rollouts[i] for i, _ in mine[start : start + config.micro_batch_size]]
            lp = _policy_logps(reference, collate_rollouts(chunk, pad_id), device, temperature)
            for (i, weight), row in zip(mine[start : start + len(chunk)], lp, strict=True):
                if weight:
                    out[i] = row[: len(rollouts[i].input_ids) - 1].float().cpu()
    for part in all_gather_list(sorted(out.items())) if size > 1 else []:
        out.update(part)
    return [out[i] for i in range(len(rollouts))]


def _micro_batch_loss(
    model, chunk: list[Rollout], advantages: torch.Tensor, ref_logps: list | None,
    config: GRPOConfig, rollout_config: RolloutConfig, pad_id: int, device,
    temperature: float, num_items: int,
):  # fmt: skip
    """(loss, metrics, scored tokens) of one micro-batch: losses.grpo_loss on the stored
    tokens, advantages [b, T] of its episodes, `ref_logps` their reference log-probs."""
    batch = collate_rollouts(chunk, pad_id)
    mask = batch["assistant_mask"][:, 1:].to(device)  # [b, T-1]; token t+1 scored at t
    old = batch["sampling_logprobs"][:, 1:].to(device)  # [b, T-1]
    policy_mask = None
    if config.top_entropy_quantile < 1.0:
        logps, entropies = _policy_logps(model, batch, device, temperature, True)
        policy_mask = high_entropy_mask(entropies, mask, config.top_entropy_quantile)
    else:
        logps = _policy_logps(model, batch, device, temperature)  # [b, T-1]
    width = logps.shape[1]
    ref = None
    if ref_logps is not None:
        ref = _pad([r.tolist() for r in ref_logps], 0.0, torch.float32)[:, :width].to(device)
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
        max_completion_length=rollout_config.max_episode_tokens,
        num_items=float(num_items),
        policy_mask=policy_mask,
    )
    return loss, metrics, mask.sum().item()


def _add_step_metrics(
    step_metrics: dict, loss: torch.Tensor, metrics: dict, weight: float, token_share: float
) -> None:
    """Add one micro-batch's loss and metrics to its optimizer step's: the loss and
    policy_loss weighted like the loss, token metrics by the micro-batch's share of tokens."""
    step_metrics["loss"] = step_metrics.get("loss", 0.0) + loss.item() * weight
    for key in ("policy_loss", "kl", "clip_region", "clip_low", "clip_high", "ratio"):
        share = weight if key == "policy_loss" else token_share
        step_metrics[key] = step_metrics.get(key, 0.0) + metrics[key].item() * share


# ---------------------------------------------------------------------------------------
# Command line (wired into `agentrl train grpo` by components/train/__main__.py)


def main_grpo(argv: Sequence[str] | None = None) -> int:
    """GRPO from a saved policy on a task suite, every setting from the preset's sections
    grpo, rollout, env and sandbox (a missing section means its defaults). Launched by
    torchrun (`python -m torch.distributed.run --nproc_per_node N -m components.cli train
    grpo ...`), the ranks share the sampling and the update; rank 0 writes the results."""
    from components.cli_args import (
        ArgumentParser,
        existing_dir,
        output_dir,
        preset_file,
        saved_policy,
    )
    from components.preset import DEFAULT_PRESET, load_preset
    from components.tasks.task import SPLITS

    p = ArgumentParser(prog="agentrl train grpo", description=main_grpo.__doc__)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file,
                   help="preset YAML (configs/)")  # fmt: skip
    p.add_argument("--policy", required=True, type=saved_policy,
                   help="policy checkpoint (save_policy output)")  # fmt: skip
    p.add_argument("--tasks", required=True, type=existing_dir, help="task suite folder")
    p.add_argument("--split", default="train", choices=("", *SPLITS),
                   help="task split to train on ('' = all)")  # fmt: skip
    p.add_argument("--out", required=True, type=lambda t: str(output_dir(t)),
                   help="output_dir: checkpoints, metrics, final policy")  # fmt: skip
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring checkpoints")
    args = p.parse_args(argv)

    from components.policy.model import load_policy
    from components.serve.vllm_launcher import sampling_server
    from components.tasks.task import load_tasks

    preset = load_preset(args.preset)
    config = dataclasses.replace(preset.section("grpo"), output_dir=args.out)
    tasks, errors = load_tasks(args.tasks, split=args.split or None)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SystemExit(f"agentrl train grpo: invalid task: {errors[0]}{more}")
    given = list(argv) if argv is not None else sys.argv[1:]
    if (code := relaunch_as_ranks(["train", "grpo", *given])) is not None:
        return code
    rank, _ = join_process_group()
    model, tokenizer = load_policy(args.policy)
    rollout = preset.section("rollout")
    # rollout.server vllm: rank 0 (the one that samples on a server) starts vLLM itself.
    server = (sampling_server(rollout, args.policy, preset.section("runtime").startup_timeout_s,
                              Path(args.out) / "vllm-logs")
              if rank == 0 else contextlib.nullcontext((rollout, None)))  # fmt: skip
    try:
        with server as (rollout, _base):
            result = train_grpo(
                model, tokenizer, tasks, config, rollout, preset.section("env"),
                preset.section("sandbox"), resume=not args.no_resume,
            )  # fmt: skip
    except PolicySyncError as exc:  # the server would sample a stale or missing version
        raise SystemExit(f"agentrl train grpo: {exc}") from None
    if rank == 0:
        _write_result(result, Path(args.out))
    return 0


def _write_result(result: GRPOResult, out: Path) -> None:
    """Print the run's summary; write it with per-iteration curves to out/result.json."""
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({**summary, "curves": curves}, indent=2) + "\n")
