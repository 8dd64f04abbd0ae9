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
version than asked cannot slip in; and after each sync the sampler checks the server
computes the version's own log-probs on a probe prompt (rollout/policy_sync.py: verify).

Dynamic sampling (GRPOConfig.dynamic_sampling, train/task_stream.py) works on both
sources: its extra rounds are part of sampling an iteration, run where the iteration is
sampled (here, in the rollout process, all under the iteration's version), and which
tasks and seeds they use is a function of the iteration alone.
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
from components.rollout.policy_sync import (
    PolicySync,
    PolicySyncError,
    Probe,
    version_dir,
    version_name,
)
from components.sandbox.config import SandboxConfig
from components.seeding import derive_seed
from components.tasks.task import Task
from components.train.task_stream import TaskStream, sample_informative

# sample(iteration, version) -> (the iteration's episodes, sampled with that policy version,
# and its sampling numbers: task_stream.sample_informative's).
SampleFn = Callable[[int, int], tuple[list[Rollout], dict[str, float]]]


@dataclass
class Sampled:
    """An iteration's episodes as the trainer gets them: the episodes, the sampling
    numbers (groups sampled, dropped, rounds), seconds spent sampling them (overlapping
    earlier updates when asynchronous) and seconds the trainer waited for them."""

    rollouts: list[Rollout]
    numbers: dict[str, float]
    sample_seconds: float
    wait_seconds: float


def sampling_config(rollout_config: RolloutConfig, seed: int, iteration: int,
                    round_: int = 0) -> RolloutConfig:  # fmt: skip
    """The sampler's settings for iteration `iteration` of a run seeded `seed` (GRPOConfig.seed):
    one sampling seed per iteration (and per dynamic-sampling round after the first), so
    each samples afresh and a replay samples the same."""
    parts = ("sample", iteration) if round_ == 0 else ("sample", iteration, "round", round_)
    return dataclasses.replace(rollout_config, seed=derive_seed(seed, *parts))


def sampling_version(iteration: int, max_staleness: int) -> int:
    """The policy version that samples `iteration` (1-based) under staleness bound s."""
    return max(0, iteration - 1 - max_staleness)


class InlineRollouts:
    """Synchronous: each iteration is sampled when the trainer asks for it, with version i - 1."""

    def __init__(self, sample: SampleFn):
        self._sample = sample

    def get(self, iteration: int) -> Sampled:
        t0 = time.perf_counter()
        rollouts, numbers = self._sample(iteration, iteration - 1)
        seconds = time.perf_counter() - t0
        return Sampled(rollouts, numbers, seconds, seconds)

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
        self._ready: dict[int, tuple[list[Rollout], dict, float]] = {}
        self._process = context.Process(
            target=_produce, name="grpo-rollouts", daemon=True,
            args=(sample, first, last, max_staleness, self._published, self._stop,
                  self._results, os.getpid()),
        )  # fmt: skip
        self._process.start()

    def get(self, iteration: int) -> Sampled:
        t0 = time.perf_counter()
        while iteration not in self._ready:
            try:
                done, sampled, seconds, error = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError("the rollout process died") from None
                continue
            if error is not None:
                raise error
            self._ready[done] = (*sampled, seconds)
        rollouts, numbers, seconds = self._ready.pop(iteration)
        return Sampled(rollouts, numbers, seconds, time.perf_counter() - t0)

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
            sampled = sample(iteration, version)
            results.put((iteration, sampled, time.perf_counter() - t0, None))
    except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
        results.put((None, None, 0.0, exc))


@dataclass
class ServedSampler:
    """sample(iteration, version) on an inference server: make it serve policy version
    `version` (rollout/policy_sync.py: LoRA, load the adapter named by version and unload
    this run's others; full weights, reload them), check it computes that version's probe
    log-probs (when the version has a probe and probe_tolerance > 0), then sample the
    iteration's episodes under that name (with dynamic sampling, its extra rounds too).
    Plain data, so it pickles into the rollout process."""

    stream: TaskStream  # which tasks each iteration (and its extra rounds) samples
    tokenizer: object
    rollout_config: RolloutConfig
    env_config: EnvConfig
    sandbox_config: SandboxConfig
    output_dir: Path
    prefix: str  # version names are prefix-v<N>
    lora: bool
    dynamic_sampling: bool = False  # GRPOConfig's: replace groups without reward variance
    max_resample_rounds: int = 0  # GRPOConfig's: extra rounds per iteration at most
    probe_tolerance: float = 0.0  # GRPOConfig.sync_probe_tolerance; 0 = no probe
    loaded: int | None = None  # the version this sampler last made the server serve
    probe: Probe | None = None  # that version's probe

    def __call__(self, iteration: int, version: int) -> tuple[list[Rollout], dict[str, float]]:
        from components.rollout.openai_backend import OpenAICompletionsClient

        config = self.rollout_config
        name = version_name(self.prefix, version)
        if self.loaded != version:
            self._serve(name, version)
        client = OpenAICompletionsClient.from_config(dataclasses.replace(config, model=name))

        def sample_round(tasks: list[Task], round_: int) -> list[Rollout]:
            sampling = sampling_config(config, self.stream.seed, iteration, round_)
            return sample_episodes(tasks, client, self.tokenizer, sampling, self.env_config,
                                   self.sandbox_config, policy_name="grpo")  # fmt: skip

        return sample_informative(self.stream.at(iteration), sample_round,
                                  self.stream.replacements(iteration), self.dynamic_sampling,
                                  self.max_resample_rounds)  # fmt: skip

    def _serve(self, name: str, version: int) -> None:
        """Make the server serve version `version` as `name`, and check it does."""
        config = self.rollout_config
        folder = version_dir(self.output_dir, version)
        if not folder.is_dir():
            raise PolicySyncError(f"policy version {version} is not on disk ({folder})")
        sync = PolicySync(
            config.base_url, "lora" if self.lora else "full", retries=config.sync_retries,
            timeout_s=config.sync_timeout_s, sync_url=config.sync_url,
        )  # fmt: skip
        sync.sync(name, folder)
        probe = Probe.read(folder)
        if probe is not None and self.probe_tolerance > 0:
            sync.verify(name, probe, self.probe_tolerance, previous=self.probe)
        if self.lora:  # this run's other adapters (a killed run's too) free their slots
            for other in sync.served():
                if other != name and other.startswith(f"{self.prefix}-v"):
                    sync.unload(other)
        self.loaded, self.probe = version, probe
