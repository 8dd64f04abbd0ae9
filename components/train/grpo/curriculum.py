"""A curriculum from a screen of the starting policy: train first on the tasks it solves
*sometimes*.

GRPO learns only from groups whose rewards differ. A task the policy always fails (or
always solves) gives G equal rewards and no advantage; a task solved about half the time
gives the most variance. So a screen (k episodes per task of the SFT policy, e.g.
`agentrl evaluate run` with samples_per_task k) is turned into pass rates
(`pass_rates`, written by `write_pass_rates`), and GRPOConfig.task_pass_rates names that
file: the task stream (train/task_stream.py) then walks `curriculum_order`:

1. tasks with 0 < p < 1, closest to 0.5 first;
2. tasks the screen did not see (unknown: maybe informative);
3. never solved (p = 0);
4. always solved (p = 1).

Ties keep the task list's order, so the order is a pure function of the file and the
tasks, and a resumed run replays it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from components.env.episode import EpisodeResult


def pass_rates(episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    """{task_id: share of its episodes that succeeded} of a pass@k screen. Infra failures
    are no evidence either way: they are left out, and a task with nothing else is absent."""
    counts: dict[str, list[int]] = {}
    for e in episodes:
        if e.status != "ok":
            continue
        solved = counts.setdefault(e.task_id, [0, 0])
        solved[0] += int(bool(e.success))
        solved[1] += 1
    return {task: won / total for task, (won, total) in sorted(counts.items())}


def write_pass_rates(path: str | Path, episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    """Write `pass_rates(episodes)` as JSON to `path` (what task_pass_rates reads); returns it."""
    rates = pass_rates(episodes)
    Path(path).write_text(json.dumps(rates, indent=1, sort_keys=True) + "\n")
    return rates


def read_pass_rates(path: str | Path) -> dict[str, float]:
    """The {task_id: pass rate} JSON at `path`; a rate outside [0, 1] is an error."""
    rates = json.loads(Path(path).read_text())
    if not isinstance(rates, dict):
        raise ValueError(f"{path}: expected a JSON object {{task_id: pass_rate}}")
    for task, rate in rates.items():
        if not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"{path}: pass rate of {task!r} must be a number in [0, 1]")
    return {str(k): float(v) for k, v in rates.items()}


def curriculum_order(task_ids: Sequence[str], rates: dict[str, float]) -> list[int]:
    """Indices into `task_ids`: sometimes solved (closest to 0.5 first), unknown, never
    solved, always solved; ties in list order."""

    def key(index: int) -> tuple[int, float, int]:
        rate = rates.get(task_ids[index])
        if rate is None:
            return (1, 0.0, index)
        if rate <= 0.0:
            return (2, 0.0, index)
        if rate >= 1.0:
            return (3, 0.0, index)
        return (0, abs(rate - 0.5), index)

    return sorted(range(len(task_ids)), key=key)
