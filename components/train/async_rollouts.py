"""Where a GRPO iteration's episodes come from: sampled when asked, or ahead in a process.

Policy version v = the weights after v updates (v = 0: the starting policy). The
synchronous loop samples iteration i with version i - 1, then updates. With
asynchronous rollouts and a staleness bound s, iteration i is sampled with version
`sampling_version(i, s) = max(0, i - 1 - s)`: a rollout process samples iteration i + 1
(through the inference server) while the trainer runs update i, as soon as the version
it needs has been written (`publish`). The version is a fixed function of the iteration,
not of timing, so an asynchronous run is as reproducible as a synchronous one: same
seeds, same versions, same episodes; with s = 0 it *is* the synchronous run (the
process never gets ahead), and a resumed run replays what an uninterrupted one sampled.

What this simplifies (AReaL and verl's fully asynchronous modes go further): the process
samples a whole iteration under one version; it does not interrupt generation to pick up
new weights mid-episode. Each episode therefore lags the weights it trains by exactly
min(s, i - 1) versions; the trainer still checks every episode's recorded version and
drops any older than s (grpo/sources.py: drop_stale), so a server that answered under another
version than asked cannot slip in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.env.config import EnvConfig
from components.rollout.config import RolloutConfig
from components.rollout.engine import Rollout, sample_episodes
from components.rollout.policy_sync import PolicySync, PolicySyncError, version_dir, version_name
from components.sandbox.config import SandboxConfig
from components.seeding import derive_seed
from components.tasks.task import Task

# sample(iteration, version) -> the iteration's episodes, sampled with that policy version.
SampleFn = Callable[[int, int], list[Rollout]]


def sampling_config(rollout_config: RolloutConfig, seed: int, iteration: int) -> RolloutConfig:
    """The sampler's settings for iteration `iteration` of a run seeded `seed` (GRPOConfig.seed):
    one sampling seed per iteration, so each samples afresh and a replay samples the same."""
    return dataclasses.replace(rollout_config, seed=derive_seed(seed, "sample", iteration))


def sampling_version(iteration: int, max_staleness: int) -> int:
    """The policy version that samples `iteration` (1-based) under staleness bound s."""
    return max(0, iteration - 1 - max_staleness)


class InlineRollouts:
    """Synchronous: each iteration is sampled when the trainer asks for it, with version i - 1."""

    def __init__(self, sample: SampleFn):
        self._sample = sample

    def get(self, iteration: int) -> tuple[list[Rollout], float, float]:
        """(episodes, seconds spent sampling, seconds the trainer waited)."""
        t0 = time.perf_counter()
        rollouts = self._sample(iteration, iteration - 1)
        seconds = time.perf_counter() - t0
        return rollouts, seconds, seconds

    def publish(self, version: int) -> None:
        """Version `version` is written and may be synced (nothing waits for it here)."""

    def close(self) -> None:
        pass


class BackgroundRollouts:
    """Iterations first..last sampled in another process, each as soon as its version is
    published.

    A process, not a thread: the sampler's Python work (HTTP, JSON, tokenizer, episode
    bookkeeping) would otherwise take turns with the update's for the interpreter lock.
    It runs at most s + 1 iterations ahead of the update (it needs version i - 1 - s for
    iteration i). An exception there (a failed policy sync) is raised by `get`. `sample`
    must pickle (ServedSampler does); the process is spawned, so it imports no torch.
    """

    def __init__(self, sample: SampleFn, first: int, last: int, max_staleness: int, published: int):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._published = context.Value("i", published)
        self._stop = context.Event()
        self._results = context.Queue()
        self._ready: dict[int, tuple[list[Rollout], float]] = {}
        self._process = context.Process(
            target=_produce, name="grpo-rollouts", daemon=True,
            args=(sample, first, last, max_staleness, self._published, self._stop,
                  self._results, os.getpid()),
        )  # fmt: skip
        self._process.start()

    def get(self, iteration: int) -> tuple[list[Rollout], float, float]:
        """(episodes, seconds the process spent sampling them, seconds the trainer waited)."""
        t0 = time.perf_counter()
        while iteration not in self._ready:
            try:
                done, rollouts, seconds, error = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError("the rollout process died") from None
                continue
            if error is not None:
                raise error
            self._ready[done] = (rollouts, seconds)
        rollouts, seconds = self._ready.pop(iteration)
        return rollouts, seconds, time.perf_counter() - t0

    def publish(self, version: int) -> None:
        with self._published.get_lock():
            self._published.value = max(self._published.value, version)

    def close(self) -> None:
        """Stop after the iteration being sampled (if any) and wait for the process."""
        self._stop.set()
        deadline = time.monotonic() + 600
        while self._process.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):  # what it sends must be read, or it hangs
                self._results.get(timeout=0.5)
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()


def _produce(sample: SampleFn, first: int, last: int, max_staleness: int, published, stop,
             results, parent: int) -> None:  # fmt: skip
    """The rollout process: sample each iteration once its version is published; stop when
    told or when the trainer is gone."""
    try:
        for iteration in range(first, last + 1):
            version = sampling_version(iteration, max_staleness)
            while published.value < version:
                if stop.is_set() or os.getppid() != parent:
                    return
                time.sleep(0.02)
            if stop.is_set():
                return
            t0 = time.perf_counter()
            rollouts = sample(iteration, version)
            results.put((iteration, rollouts, time.perf_counter() - t0, None))
    except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
        results.put((None, None, 0.0, exc))


@dataclass
class ServedSampler:
    """sample(iteration, version) on an inference server: make it serve policy version
    `version` (rollout/policy_sync.py: LoRA, load the adapter named by version and unload
    this run's others; full weights, reload them), then sample the iteration's episodes
    under that name. Plain data, so it pickles into the rollout process."""

    tasks: dict[int, list[Task]]  # iteration -> its tasks (grpo/sources.py: tasks_of)
    tokenizer: object
    rollout_config: RolloutConfig
    env_config: EnvConfig
    sandbox_config: SandboxConfig
    output_dir: Path
    prefix: str  # version names are prefix-v<N>
    lora: bool
    seed: int  # GRPOConfig.seed: the per-iteration sampling seeds derive from it
    loaded: int | None = None  # the version this sampler last made the server serve

    def __call__(self, iteration: int, version: int) -> list[Rollout]:
        from components.rollout.openai_backend import OpenAICompletionsClient

        config = self.rollout_config
        name = version_name(self.prefix, version)
        if self.loaded != version:
            folder = version_dir(self.output_dir, version)
            if not folder.is_dir():
                raise PolicySyncError(f"policy version {version} is not on disk ({folder})")
            sync = PolicySync(
                config.base_url, "lora" if self.lora else "full", retries=config.sync_retries,
                timeout_s=config.sync_timeout_s, sync_url=config.sync_url,
            )  # fmt: skip
            sync.sync(name, folder)
            if self.lora:  # this run's other adapters (a killed run's too) free their slots
                for other in sync.served():
                    if other != name and other.startswith(f"{self.prefix}-v"):
                        sync.unload(other)
            self.loaded = version
        client = OpenAICompletionsClient.from_config(dataclasses.replace(config, model=name))
        sampling = sampling_config(config, self.seed, iteration)
        return sample_episodes(self.tasks[iteration], client, self.tokenizer, sampling,
                               self.env_config, self.sandbox_config, policy_name="grpo")  # fmt: skip
