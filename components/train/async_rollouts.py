"""Where a GRPO iteration's episodes come from: sampled when asked, or ahead in a thread.

Policy version v = the weights after v updates (v = 0: the starting policy). The
synchronous loop samples iteration i with version i - 1, then updates. With
asynchronous rollouts and a staleness bound s, iteration i is sampled with version
`sampling_version(i, s) = max(0, i - 1 - s)`: a background thread samples iteration i + 1
(through the inference server) while the trainer runs update i, as soon as the version it
needs has been written (`publish`). The version is a fixed function of the iteration, not
of timing, so an asynchronous run is as reproducible as a synchronous one: same seeds,
same versions, same episodes; with s = 0 it *is* the synchronous run (the thread never
gets ahead), and a resumed run replays what an uninterrupted one sampled.

What this simplifies (AReaL and verl's fully asynchronous modes go further): the thread
samples a whole iteration under one version; it does not interrupt generation to pick up
new weights mid-episode. Each episode therefore lags the weights it trains by exactly
min(s, i - 1) versions; the trainer still checks every episode's recorded version and
drops any older than s (grpo.py), so a server that answered under another version than
asked cannot slip in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from components.rollout.engine import Rollout

# sample(iteration, version) -> the iteration's episodes, sampled with that policy version.
SampleFn = Callable[[int, int], list[Rollout]]


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
    """Iterations first..last sampled in a thread, each as soon as its version is published.

    It runs at most s + 1 iterations ahead of the update (it needs version i - 1 - s for
    iteration i). An exception in the thread (a failed policy sync) is raised by `get`.
    """

    def __init__(self, sample: SampleFn, first: int, last: int, max_staleness: int, published: int):
        self._sample = sample
        self._max_staleness = max_staleness
        self._published = published
        self._ready: dict[int, tuple[list[Rollout], float]] = {}
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(
            target=self._run, args=(first, last), name="grpo-rollouts", daemon=True
        )
        self._thread.start()

    def _run(self, first: int, last: int) -> None:
        try:
            for iteration in range(first, last + 1):
                version = sampling_version(iteration, self._max_staleness)
                with self._cond:
                    self._cond.wait_for(lambda v=version: self._stop or self._published >= v)
                    if self._stop:
                        return
                t0 = time.perf_counter()
                rollouts = self._sample(iteration, version)
                with self._cond:
                    self._ready[iteration] = (rollouts, time.perf_counter() - t0)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def get(self, iteration: int) -> tuple[list[Rollout], float, float]:
        """(episodes, seconds the thread spent sampling them, seconds the trainer waited)."""
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: iteration in self._ready or self._error is not None)
            if iteration not in self._ready:
                raise self._error
            rollouts, seconds = self._ready.pop(iteration)
        return rollouts, seconds, time.perf_counter() - t0

    def publish(self, version: int) -> None:
        with self._cond:
            self._published = max(self._published, version)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop after the iteration being sampled (if any) and wait for the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
