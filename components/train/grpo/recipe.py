"""GRPO as a recipe: `GRPORecipe.setup` builds a run's state from its configs (the stepper,
the frozen reference, the checkpoint it resumes, where its episodes come from), `train`
runs its iterations, each sample -> verify -> update:

1. the iteration's tasks and episodes (sources.py): G = `group_size` sandboxed, verified
   episodes per task, sampled in-process or on an inference server. The tasks walk a seeded
   stream, or a curriculum from a screen's pass rates (`task_pass_rates`, curriculum.py:
   the tasks the starting policy solves sometimes first). With `dynamic_sampling` (DAPO),
   groups whose rewards are all equal are dropped and replaced by groups of further tasks,
   up to `max_resample_rounds` extra rounds (../task_stream.py); an iteration left with no
   group carrying variance does no update. Every iteration logs groups_sampled,
   groups_zero_variance, zero_variance_share and resample_rounds (dropped only when on);
2. group-relative advantages (advantages.py); infra failures (no reward) are left out of
   their group's mean and std *and* dropped from the update batch;
3. `ppo_epochs` passes over the batch in minibatches, one optimizer step each (update.py),
   logging the mean KL to the reference (`kl`, 0 without one) and the policy's mean token
   entropy over the sampled tokens (`entropy`, from the update's own logits).

Why not TRL's GRPOTrainer (trl 1.16): it scores observation tokens of a failed episode in
the KL and the denominators (we drop infra failures whole), has no leave-one-out baseline,
recomputes old log-probs instead of training on the sampler's, and resumes by optimizer
step, while our data position, sampling seed and sandbox live outside it. The loss is
our pure tensor code, tested equal to TRL's on identical inputs (tests/train/test_losses.py).

The recipe is shared by composition, not inheritance: what is GRPO's own, the update of
an iteration (steps 2 and 3) and any state a checkpoint holds beside the stepper's, is an
`Algorithm` record, `GRPO` here; train/ppo.py passes `PPO` (GAE and a value head, saved
with each checkpoint) to `train_grpo`, and the rest of the run is the same code.

Checkpoints (every `checkpoint_every` iterations and at the end; checkpoints.py) hold
everything a resumed run needs: `resume=True` continues from the latest one, and a run
killed and resumed ends with the same weights and metrics as an uninterrupted run. Metrics
of each iteration go to output_dir/metrics.jsonl, and to MLflow when a tracking URI is set.

Sampling on an inference server (rollout.backend "openai"): after each update the trainer
writes the new policy version (checkpoints.save_version) and the server is made to serve it
by name before it samples (rollout/policy_sync.py); the server's log-probs on a probe
prompt are then checked against the trainer's own for that version (`sync_probe_tolerance`),
so a server that took the load request but serves other weights stops the run. With
`async_rollouts` the next
iterations are sampled in a rollout process while this one updates, each at most
`max_staleness` versions behind (async_rollouts.py); 0 reproduces the synchronous run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from components.env.config import EnvConfig
from components.rollout.completion import GenerateFn
from components.rollout.config import RolloutConfig
from components.rollout.engine import Rollout
from components.sandbox.config import SandboxConfig
from components.tasks.task import Task
from components.tracking import start_trainer_run
from components.train.checkpoints import (
    prune_versions,
    read_metrics,
    restore,
    save_checkpoint,
    save_version,
    write_metrics,
)
from components.train.config import GRPOConfig
from components.train.devices import frozen_copy, plain_adamw, training_device
from components.train.grpo.advantages import advantages_of
from components.train.grpo.sources import (
    EpisodeSettings,
    drop_stale,
    episode_source,
    gather_episodes,
    probe_prompt,
)
from components.train.grpo.update import Learner, decouple_stale, update
from components.train.parallel import OptimizerSettings, make_stepper, save_gathered, world


@dataclass
class GRPOResult:
    iterations: int  # the last completed iteration (== config.iterations)
    resumed_from: int | None  # iteration of the checkpoint this call started from
    metrics: list[dict]  # one row per iteration run by this call
    checkpoint_dir: str  # the latest checkpoint
    policy_dir: str  # the final policy (save_policy)
    train_seconds: float


# long: the stage's entry point: the model, its tasks, the four configs it reads, options
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
    algorithm: Algorithm | None = None,
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
    `algorithm`: the learning step and checkpoint state; None is GRPO's (`GRPO` below),
    ppo.train_ppo passes PPO's.
    """
    _check_inputs(tasks, config, rollout_config, generate_fn)
    rollout_config = dataclasses.replace(rollout_config, samples_per_task=config.group_size)
    episodes = EpisodeSettings(
        tasks, config, rollout_config, env_config, sandbox_config, generate_fn
    )
    recipe = GRPORecipe.setup(model, tokenizer, episodes, reference, resume, algorithm or GRPO)
    return recipe.train()


def _nothing(*_args) -> None:
    """A Steps hook for an algorithm with no state of its own."""


@dataclass(frozen=True)
class Steps:
    """One run's algorithm-specific part of the recipe, built by `Algorithm.steps` at the end
    of setup: its update on an iteration's episodes, and what its checkpoints hold beside
    the stepper's state (the recipe calls save and prune on rank 0 only)."""

    learn: Callable[[list[Rollout], int], dict]  # (episodes, iteration) -> the metrics row
    save: Callable[[int], None] = _nothing  # before the checkpoint of an iteration
    prune: Callable[[], None] = _nothing  # after a checkpoint (older ones may be gone)


@dataclass(frozen=True)
class Algorithm:
    """An episode trainer: its name (runs are tracked as NAME-<config hash>) and how a run
    builds its Steps from the learner, output_dir and the restored start (restore's dict).
    Sampling, the stepper, resume and metrics are the recipe's, shared: GRPO is `GRPO`
    below, PPO ppo.PPO."""

    name: str
    steps: Callable[[Learner, Path, dict], Steps]


def grpo_steps(learner: Learner, output_dir: Path, start: dict) -> Steps:
    """GRPO's: group-relative advantages and the clipped update; no state of its own."""
    return Steps(learn=functools.partial(learn_grpo, learner))


def learn_grpo(learner: Learner, rollouts: list[Rollout], iteration: int) -> dict:
    """Advantages and the update on this iteration's episodes. Returns its metrics
    (episodes, rewards, the update's means, its duration)."""
    config = learner.config
    t0 = time.perf_counter()
    if not rollouts:  # dynamic sampling found no group with reward variance
        logging.getLogger(__name__).warning(
            "GRPO iteration %d: no group with reward variance after the resample rounds: no update",
            iteration,
        )
        empty = rollout_metrics([], torch.zeros(0, dtype=torch.bool))
        return {
            **empty,
            "advantage_abs_mean": 0.0,
            "optimizer_steps": 0,
            "update_tokens": 0,
            "update_seconds": time.perf_counter() - t0,
        }
    advantages, episode_advantages, valid, keep = advantages_of(rollouts, config)
    row = rollout_metrics(rollouts, valid)
    row["advantage_abs_mean"] = float(episode_advantages[keep].abs().mean()) if keep else 0.0
    if keep:
        batch, batch_advantages = [rollouts[i] for i in keep], advantages[keep]
        if config.stale_importance_cap > 0:
            batch, batch_advantages, row["decoupled_episodes"] = decouple_stale(
                learner, batch, batch_advantages, iteration
            )
        learner.stepper.model.train()
        row.update(update(learner, batch, batch_advantages, iteration))
    else:
        row.update(optimizer_steps=0, update_tokens=0)
    row["update_seconds"] = time.perf_counter() - t0
    return row


GRPO = Algorithm("grpo", grpo_steps)


@dataclass
class GRPORecipe:
    """One run's state, GRPO's or another `Algorithm`'s: built once by `setup`, advanced by
    `train`."""

    episodes: EpisodeSettings
    tokenizer: object
    learner: Learner
    output_dir: Path
    fingerprint: str
    start: dict  # checkpoints.restore's: iteration, data_position, checkpoint
    history: list[dict]  # metrics.jsonl's rows so far
    mlflow: object = None  # the tracking module with a started run (rank 0), or None
    source: object = None  # where episodes come from (on a server: rank 0's only)
    steps: Steps | None = None  # the algorithm's own part, built last by setup

    @classmethod
    def setup(
        cls,
        model,
        tokenizer,
        episodes: EpisodeSettings,
        reference,
        resume: bool,
        algorithm: Algorithm,
    ) -> GRPORecipe:
        """LoRA adapters if configured (then the KL reference is the base itself, adapters
        off), the model on this rank's device, the optimizer, the checkpoint to resume,
        the metrics so far, tracking, the episode source, and last the algorithm's steps
        (which may restore state of their own from the checkpoint)."""
        from components.policy.lora import add_adapters, without_adapters

        config = episodes.config
        rank, _ = world()
        output_dir = Path(config.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        fingerprint = config_hash(config, episodes.rollout_config, episodes.env_config,
                                  episodes.sandbox_config)  # fmt: skip
        device = training_device(config.use_cpu)
        model = add_adapters(model, config.lora) if config.lora else without_adapters(model)
        model.to(device)
        if config.beta > 0 and (reference is not None or config.lora is None):
            reference = frozen_copy(model, reference, device)
        stepper = make_stepper(model, config.deepspeed, OptimizerSettings(
            learning_rate=config.learning_rate, weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm, micro_batch_size=config.micro_batch_size,
            optimizer=plain_adamw,
        ))  # fmt: skip
        learner = Learner.of(stepper, reference, config, episodes.rollout_config,
                             tokenizer.pad_token_id, device)  # fmt: skip
        start = restore(output_dir, stepper, fingerprint, resume)
        # Rows a killed run logged after its last checkpoint are replayed, so they are dropped.
        history = read_metrics(output_dir / "metrics.jsonl", start["iteration"])
        recipe = cls(episodes, tokenizer, learner, output_dir, fingerprint, start, history)
        if rank == 0:
            write_metrics(output_dir / "metrics.jsonl", history)
            recipe.mlflow = _start_tracking(recipe, algorithm.name, len(episodes.tasks))
        if episodes.served and start["checkpoint"] is None:  # the starting policy, for the server
            save_version(stepper, output_dir, 0, probe_prompt(tokenizer))
        # On a server, rank 0 samples (and syncs) alone and hands the episodes to the others.
        if rank == 0 or not episodes.served:
            recipe.source = episode_source(episodes, stepper, tokenizer, output_dir,
                                           fingerprint, start["iteration"])  # fmt: skip
        recipe.steps = algorithm.steps(learner, output_dir, start)
        return recipe

    @property
    def lag(self) -> int:
        """Versions a resumed run may still sample with: max_staleness back from a checkpoint."""
        config = self.episodes.config
        return config.max_staleness if config.async_rollouts else 0

    def train(self) -> GRPOResult:
        """The iterations from the restored one to config.iterations, then the final policy."""
        config, stepper = self.episodes.config, self.learner.stepper
        iteration, position = self.start["iteration"], self.start["data_position"]
        rows: list[dict] = []
        last_checkpoint = self.start["checkpoint"]
        started = time.perf_counter()
        try:
            while iteration < config.iterations:
                iteration += 1
                position += config.tasks_per_iteration
                rows.append(self._iteration(iteration, position))
                if iteration % config.checkpoint_every == 0 or iteration == config.iterations:
                    last_checkpoint = self._checkpoint(iteration, position)
            policy_dir = save_gathered(stepper, self.tokenizer, self.output_dir / "policy")
        finally:
            if self.source is not None:
                self.source.close()
            if self.mlflow is not None:
                self.mlflow.end_run()
        checkpoint = self.start["checkpoint"]
        return GRPOResult(
            iterations=iteration,
            resumed_from=self.start["iteration"] if checkpoint is not None else None,
            metrics=rows,
            checkpoint_dir=str(last_checkpoint) if last_checkpoint else "",
            policy_dir=str(policy_dir),
            train_seconds=time.perf_counter() - started,
        )

    def _iteration(self, iteration: int, position: int) -> dict:
        """Sample, learn, publish the new version (on a server), log. Returns its row."""
        stepper, served = self.learner.stepper, self.episodes.served
        row = {"iteration": iteration, "data_position": position}
        t0 = time.perf_counter()
        sampled = gather_episodes(self.source, iteration, served)
        row.update(sampled.numbers)
        rollouts, row["stale_dropped"], row["policy_lag"] = drop_stale(sampled.rollouts, iteration,
                                                                       self.lag)  # fmt: skip
        row.update(self.steps.learn(rollouts, iteration))
        if served:  # the new weights, for the server to load when they are needed
            save_version(stepper, self.output_dir, iteration, probe_prompt(self.tokenizer))
            if self.source is not None:
                self.source.publish(iteration)
        row.update(_timings(row, sampled.sample_seconds, sampled.wait_seconds,
                            time.perf_counter() - t0))  # fmt: skip
        if stepper.rank == 0:
            self.history.append(row)
            write_metrics(self.output_dir / "metrics.jsonl", self.history)
            if self.mlflow is not None:
                self.mlflow.log_metrics({k: float(v) for k, v in row.items()}, step=iteration)
        return row

    def _checkpoint(self, iteration: int, position: int) -> Path:
        """Save everything a resumed run needs, the algorithm's state first (a complete
        checkpoint always has it); drop versions no resumed run samples with, and the
        algorithm's state of checkpoints gone."""
        config, stepper = self.episodes.config, self.learner.stepper
        if stepper.rank == 0:
            self.steps.save(iteration)
        state = {"iteration": iteration, "data_position": position,
                 "config_hash": self.fingerprint, "seed": config.seed}  # fmt: skip
        path = save_checkpoint(stepper, self.output_dir, state, config.keep_checkpoints)
        if self.episodes.served and stepper.rank == 0:
            prune_versions(self.output_dir, iteration - self.lag)
        if stepper.rank == 0:
            self.steps.prune()
        return path


def rollout_metrics(rollouts: Sequence[Rollout], valid: torch.Tensor) -> dict:
    """An iteration's episode numbers: counts, mean reward, success, steps, each reward term."""
    ok = [r for r, v in zip(rollouts, valid.tolist(), strict=True) if v]
    infra = sum(r.infra_failure or r.result.reward is None for r in rollouts)
    out = {
        "episodes": len(rollouts),
        "infra_failures": infra,
        # a reward this pipeline's verifier did not sign (advantages.verified_rollout)
        "unverified": len(rollouts) - len(ok) - infra,
        "mean_reward": float(np.mean([r.result.reward for r in ok])) if ok else 0.0,
        "success_rate": float(np.mean([r.result.success for r in ok])) if ok else 0.0,
        "mean_steps": float(np.mean([r.result.steps for r in ok])) if ok else 0.0,
        "generated_tokens": sum(r.num_generated_tokens for r in rollouts),
    }
    terms = sorted({k for r in ok for k in r.result.reward_terms})
    for term in terms:
        out[f"reward/{term}"] = float(np.mean([r.result.reward_terms.get(term, 0.0) for r in ok]))
    return out


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


def _check_inputs(
    tasks: Sequence[Task], config: GRPOConfig, rollout_config: RolloutConfig, generate_fn
) -> None:
    if not tasks:
        raise ValueError("train_grpo: no tasks")
    served = rollout_config.backend == "openai"
    if served and generate_fn is not None:
        raise ValueError("train_grpo: generate_fn samples in-process; the openai backend "
                         "samples on the server")  # fmt: skip
    if config.task_pass_rates and not Path(config.task_pass_rates).is_file():
        raise ValueError(f"GRPOConfig.task_pass_rates: no file at {config.task_pass_rates}")
    if config.async_rollouts and not served:
        raise ValueError("GRPOConfig.async_rollouts samples through an inference server: "
                         "set rollout.backend to openai")  # fmt: skip


def config_hash(
    config: GRPOConfig, rollout_config: RolloutConfig, env_config: EnvConfig,
    sandbox_config: SandboxConfig,
) -> str:  # fmt: skip
    """What must not change between a run and its resumption: everything that shapes the
    episodes, their rewards and the update (run length and where logs go may change)."""
    free = {"iterations", "checkpoint_every", "keep_checkpoints", "output_dir",
            "mlflow_tracking_uri", "mlflow_experiment", "use_cpu", "sync_probe_tolerance"}  # fmt: skip
    shaping = {k: v for k, v in dataclasses.asdict(config).items() if k not in free}
    if config.task_pass_rates:  # the curriculum is the file's content, wherever it lies
        rates = Path(config.task_pass_rates).read_bytes()
        shaping["task_pass_rates"] = hashlib.sha256(rates).hexdigest()
    # Where the server is and how patiently it is called do not shape the episodes.
    server = {"base_url", "request_timeout_s", "max_retries", "sync_retries", "sync_timeout_s",
              "sync_url"}  # fmt: skip
    rollout = {k: v for k, v in dataclasses.asdict(rollout_config).items() if k not in server}
    settings = [shaping, rollout, *map(dataclasses.asdict, (env_config, sandbox_config))]
    payload = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _start_tracking(recipe: GRPORecipe, name: str, num_tasks: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    config, start = recipe.episodes.config, recipe.start
    resumed_from = start["iteration"] if start["checkpoint"] is not None else None
    params = {**dataclasses.asdict(config), "config_hash": recipe.fingerprint,
              "resumed_from": resumed_from, "num_tasks": num_tasks}  # fmt: skip
    return start_trainer_run(config.mlflow_tracking_uri, config.mlflow_experiment,
                             f"{name}-{recipe.fingerprint}", params)  # fmt: skip
