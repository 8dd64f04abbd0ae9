"""Where a GRPO iteration's episodes come from.

The data order is a pure function of (seed, position), so a resumed run replays it:
iteration i trains on the `tasks_per_iteration` tasks at position (i - 1) * that count of
an endless stream of seeded permutations of the task list (`pick_tasks`). Each is sampled
G = `group_size` times with the iteration's sampling seed (async_rollouts.sampling_config,
the one place it is derived): in-process with the model being trained (every rank samples
its share of the tasks), or on an inference server when asked (rank 0 alone), or on the
server ahead of time in a rollout process (`async_rollouts`).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.env.config import EnvConfig
from components.rollout.completion import GenerateFn
from components.rollout.config import RolloutConfig
from components.rollout.engine import Rollout, sample_episodes
from components.rollout.policy_sync import version_number
from components.sandbox.config import SandboxConfig
from components.seeding import derive_seed
from components.tasks.task import Task
from components.train.async_rollouts import (
    BackgroundRollouts,
    InlineRollouts,
    ServedSampler,
    sampling_config,
)
from components.train.config import GRPOConfig
from components.train.parallel import all_gather_list, world


@dataclass(frozen=True)
class EpisodeSettings:
    """What sampling an iteration needs: the tasks, the run's settings, the sampler's, the
    environment's and the sandbox's; `generate_fn` replaces in-process generation (tests,
    benchmarks; it must sample from the model being trained)."""

    tasks: Sequence[Task]
    config: GRPOConfig
    rollout_config: RolloutConfig
    env_config: EnvConfig
    sandbox_config: SandboxConfig
    generate_fn: GenerateFn | None = None

    @property
    def served(self) -> bool:
        """Sampled on an inference server (the openai backend), not in-process."""
        return self.rollout_config.backend == "openai"


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


def tasks_of(settings: EpisodeSettings, iteration: int) -> list[Task]:
    """The tasks iteration `iteration` (1-based) trains on."""
    count = settings.config.tasks_per_iteration
    picked = pick_tasks(len(settings.tasks), (iteration - 1) * count, count, settings.config.seed)
    return [settings.tasks[i] for i in picked]


def episode_source(settings: EpisodeSettings, stepper, tokenizer, output_dir: Path,
                   fingerprint: str, done: int):  # fmt: skip
    """Where iterations done+1.. get their episodes: sampled in-process when asked, through
    the server when asked, or through the server ahead of time (async_rollouts)."""
    config = settings.config
    if not settings.served:
        return InlineRollouts(lambda iteration, _version: sample_in_process(
            settings, stepper, tokenizer, iteration))  # fmt: skip
    sample = ServedSampler(
        tasks={i: tasks_of(settings, i) for i in range(done + 1, config.iterations + 1)},
        tokenizer=copy.deepcopy(tokenizer), rollout_config=settings.rollout_config,
        env_config=settings.env_config, sandbox_config=settings.sandbox_config,
        output_dir=output_dir, prefix=f"{settings.rollout_config.model}-{fingerprint[:8]}",
        lora=config.lora is not None, seed=config.seed,
    )  # fmt: skip
    if not config.async_rollouts:
        return InlineRollouts(sample)
    return BackgroundRollouts(sample, done + 1, config.iterations, config.max_staleness, done)


def sample_in_process(settings: EpisodeSettings, stepper, tokenizer,
                      iteration: int) -> list[Rollout]:  # fmt: skip
    """The iteration's episodes sampled in-process, in (task, sample) order, on every rank:
    rank r samples the tasks r, r + world, ... (with the whole weights: ZeRO-3 gathers
    them) and the ranks exchange their episodes."""
    tasks = tasks_of(settings, iteration)
    sampling = sampling_config(settings.rollout_config, settings.config.seed, iteration)
    stepper.model.eval()
    with stepper.gathered():
        mine = sample_episodes(
            tasks[stepper.rank :: stepper.world], stepper.model, tokenizer, sampling,
            settings.env_config, settings.sandbox_config, policy_name="grpo",
            generate_fn=settings.generate_fn,
        )  # fmt: skip
    if stepper.world == 1:
        return mine
    order = {task.id: i for i, task in reversed(list(enumerate(tasks)))}
    gathered = [r for part in all_gather_list(mine) for r in part]
    return sorted(gathered, key=lambda r: (order[r.group_id], r.sample_index))


def gather_episodes(source, iteration: int, served: bool) -> tuple[list[Rollout], float, float]:
    """(episodes, sampling seconds, waiting seconds) of an iteration on every rank. In
    process every rank samples its share (`sample_in_process` exchanges them); on a server
    rank 0 alone holds a source and its episodes are sent to the others."""
    if not served or world()[1] == 1:
        return source.get(iteration)
    got = source.get(iteration) if source is not None else ([], 0.0, 0.0)
    return all_gather_list(got)[0]


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
