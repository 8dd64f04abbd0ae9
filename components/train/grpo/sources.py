"""Where a GRPO iteration's episodes come from.

The data order is a pure function of (seed, position), so a resumed run replays it
(train/task_stream.py): iteration i trains on the `tasks_per_iteration` tasks at position
(i - 1) * that count of an endless stream of seeded permutations of the task list, or of
the curriculum's order (GRPOConfig.task_pass_rates, curriculum.py). Each is sampled
G = `group_size` times with the iteration's sampling seed (async_rollouts.sampling_config,
the one place it is derived): in-process with the model being trained (every rank samples
its share of the tasks), or on an inference server when asked (rank 0 alone), or on the
server ahead of time in a rollout process (`async_rollouts`). With dynamic sampling, the
groups without reward variance are replaced where the iteration is sampled
(task_stream.sample_informative), on each of the three.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.env.config import EnvConfig
from components.rollout.completion import GenerateFn
from components.rollout.config import RolloutConfig
from components.rollout.engine import Rollout, sample_episodes
from components.rollout.policy_sync import PROBE_TEXT, version_number
from components.sandbox.config import SandboxConfig
from components.tasks.task import Task
from components.train.async_rollouts import (
    BackgroundRollouts,
    InlineRollouts,
    Sampled,
    ServedSampler,
    sampling_config,
)
from components.train.config import GRPOConfig
from components.train.grpo.curriculum import curriculum_order, read_pass_rates
from components.train.parallel import all_gather_list, world
from components.train.task_stream import TaskStream, sample_informative


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


def task_stream(settings: EpisodeSettings) -> TaskStream:
    """The run's task stream: seeded permutations, or the curriculum's order when the
    config names a screen's pass rates."""
    config = settings.config
    order = None
    if config.task_pass_rates:
        rates = read_pass_rates(config.task_pass_rates)
        order = tuple(curriculum_order([t.id for t in settings.tasks], rates))
    return TaskStream(settings.tasks, config.seed, config.tasks_per_iteration, order)


def probe_prompt(tokenizer) -> list[int]:
    """The token ids of the policy-sync probe (rollout/policy_sync.py: Probe)."""
    from components.policy.chat import prompt_ids

    return prompt_ids(tokenizer, [{"role": "user", "content": PROBE_TEXT}])


def episode_source(settings: EpisodeSettings, stepper, tokenizer, output_dir: Path,
                   fingerprint: str, done: int):  # fmt: skip
    """Where iterations done+1.. get their episodes: sampled in-process when asked, through
    the server when asked, or through the server ahead of time (async_rollouts)."""
    config = settings.config
    stream = task_stream(settings)
    if not settings.served:
        return InlineRollouts(lambda iteration, _version: sample_in_process(
            settings, stream, stepper, tokenizer, iteration))  # fmt: skip
    sample = ServedSampler(
        stream=stream, tokenizer=copy.deepcopy(tokenizer),
        rollout_config=settings.rollout_config, env_config=settings.env_config,
        sandbox_config=settings.sandbox_config, output_dir=output_dir,
        prefix=f"{settings.rollout_config.model}-{fingerprint[:8]}",
        lora=config.lora is not None,
        dynamic_sampling=config.dynamic_sampling,
        max_resample_rounds=config.max_resample_rounds,
        probe_tolerance=config.sync_probe_tolerance,
    )  # fmt: skip
    if not config.async_rollouts:
        return InlineRollouts(sample)
    return BackgroundRollouts(sample, done + 1, config.iterations, config.max_staleness, done)


def sample_in_process(settings: EpisodeSettings, stream: TaskStream, stepper, tokenizer,
                      iteration: int) -> tuple[list[Rollout], dict[str, float]]:  # fmt: skip
    """The iteration's episodes sampled in-process (with dynamic sampling, its extra rounds
    too: every rank holds the same episodes, so every rank takes the same decisions) and
    its sampling numbers."""
    config = settings.config

    def sample_round(tasks: list[Task], round_: int) -> list[Rollout]:
        sampling = sampling_config(settings.rollout_config, config.seed, iteration, round_)
        return sample_tasks(settings, stepper, tokenizer, tasks, sampling)

    return sample_informative(stream.at(iteration), sample_round, stream.replacements(iteration),
                              config.dynamic_sampling, config.max_resample_rounds)  # fmt: skip


def sample_tasks(settings: EpisodeSettings, stepper, tokenizer, tasks: list[Task],
                 sampling: RolloutConfig) -> list[Rollout]:  # fmt: skip
    """`tasks`' episodes sampled in-process, in (task, sample) order, on every rank:
    rank r samples the tasks r, r + world, ... (with the whole weights: ZeRO-3 gathers
    them) and the ranks exchange their episodes."""
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


def gather_episodes(source, iteration: int, served: bool) -> Sampled:
    """An iteration's episodes on every rank. In process every rank samples its share
    (`sample_tasks` exchanges them); on a server rank 0 alone holds a source and its
    episodes are sent to the others."""
    if not served or world()[1] == 1:
        return source.get(iteration)
    got = source.get(iteration) if source is not None else None
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
