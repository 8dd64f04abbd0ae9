"""Which tasks a GRPO iteration samples: the task stream, and DAPO's dynamic sampling.

The stream (`TaskStream`): iteration i samples the `tasks_per_iteration` tasks at
position (i - 1) * that count of an endless stream, a pure function of (seed, position)
so a resumed run replays it: seeded permutations of the task list, one per pass
(`pick_tasks`), or, with a curriculum (GRPOConfig.task_pass_rates, grpo/curriculum.py),
one fixed order walked again and again.

Dynamic sampling (`sample_informative`, GRPOConfig.dynamic_sampling): a group whose valid
episodes all got the same reward has zero group-relative advantage everywhere; it adds
nothing to the policy gradient, only tokens to the denominators and the KL. Such groups
are dropped and replaced by groups of further tasks, sampled in up to
`max_resample_rounds` extra rounds, until the iteration has `tasks_per_iteration`
informative groups or the rounds are spent (then it trains on what it has; with none it
does no update).

Which tasks replace them is a pure function of (seed, iteration) too: the tasks at the
positions that follow the iteration's own in the stream, *peeked at, not consumed* (the
next iteration still starts where it would have, so checkpoints keep one data position),
skipping tasks this iteration already sampled. Round r samples with its own seed
(async_rollouts.sampling_config). Nothing depends on timing or on where the episodes are
sampled, so the same loop runs in-process, on a server and in the asynchronous rollout
process (async_rollouts.py), and a killed run resumed replays every round.

What this simplifies: DAPO keeps over-sampling into a buffer across generation steps;
here each round samples exactly the missing number of groups, all under one policy
version. No torch here: the rollout process imports this module.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from components.rollout.engine import Rollout
from components.seeding import derive_seed
from components.tasks.task import Task

# Rewards whose population std is below this count as equal (float noise of reward sums).
EQUAL_REWARDS_STD = 1e-6

# sample_round(tasks, round) -> their episodes, G per task (round 0: the iteration's own).
SampleRound = Callable[[list[Task], int], list[Rollout]]
# replacements(drawn task ids, count) -> up to `count` further tasks, none of them drawn.
Replacements = Callable[[set[str], int], list[Task]]


def pick_tasks(num_tasks: int, position: int, count: int, seed: int,
               order: Sequence[int] | None = None) -> list[int]:  # fmt: skip
    """Indices of the `count` tasks at `position` of the endless stream: seeded permutations
    (pass e = position // num_tasks uses permutation (seed, e)), or `order` walked again and
    again when given (a curriculum)."""
    picked = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, num_tasks)
        if order is not None:
            picked.append(order[offset])
            continue
        permutation = list(range(num_tasks))
        random.Random(derive_seed(seed, "epoch", epoch)).shuffle(permutation)
        picked.append(permutation[offset])
    return picked


@dataclass(frozen=True)
class TaskStream:
    """The run's task stream: its tasks, seed, tasks per iteration and curriculum order
    (None: seeded permutations). Plain data, so it pickles into the rollout process."""

    tasks: Sequence[Task]
    seed: int
    per_iteration: int
    order: tuple[int, ...] | None = None

    def at(self, iteration: int) -> list[Task]:
        """The tasks iteration `iteration` (1-based) samples first."""
        start = (iteration - 1) * self.per_iteration
        picked = pick_tasks(len(self.tasks), start, self.per_iteration, self.seed, self.order)
        return [self.tasks[i] for i in picked]

    def replacements(self, iteration: int) -> Replacements:
        """Dynamic sampling's further tasks of `iteration`: the stream after its own
        positions, peeked at (two passes of it hold every task), skipping drawn ones."""
        n = len(self.tasks)
        ahead = pick_tasks(n, iteration * self.per_iteration, 2 * n, self.seed, self.order)

        def further(drawn: set[str], count: int) -> list[Task]:
            out: list[Task] = []
            for i in ahead:
                task = self.tasks[i]
                if task.id not in drawn and all(t.id != task.id for t in out):
                    out.append(task)
                if len(out) == count:
                    break
            return out

        return further


def informative_groups(rollouts: Sequence[Rollout]) -> tuple[list[int], list[str]]:
    """(indices of the episodes of groups whose rewards vary, ids of the other groups).

    A group is its episodes with one group_id. Its infra failures (no reward) are left out
    of the comparison, as advantages.py leaves them out of the group statistics; a group
    with fewer than two valid episodes has no variance either. Kept indices include the
    informative groups' infra failures (the update drops those itself), in input order;
    dropped ids are in order of first appearance.
    """
    rewards: dict[str, list[float]] = {}
    for r in rollouts:
        valid = not r.infra_failure and r.result.reward is not None
        rewards.setdefault(r.group_id, [])
        if valid:
            rewards[r.group_id].append(float(r.result.reward))
    varying = {g for g, values in rewards.items() if _std(values) > EQUAL_REWARDS_STD}
    kept = [i for i, r in enumerate(rollouts) if r.group_id in varying]
    return kept, [g for g in rewards if g not in varying]


def _std(values: list[float]) -> float:
    """Population std; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def group_count(rollouts: Sequence[Rollout]) -> int:
    return len({r.group_id for r in rollouts})


# long: the iteration's tasks, its two samplers and the two settings of the loop
def sample_informative(
    tasks: list[Task],
    sample_round: SampleRound,
    replacements: Replacements,
    enabled: bool,
    max_rounds: int,
) -> tuple[list[Rollout], dict[str, float]]:
    """The iteration's episodes and its sampling numbers.

    Disabled: round 0's episodes as sampled (every group kept). Enabled: round 0, then
    while fewer than len(tasks) groups carry variance and rounds are left, one more round
    on as many replacement tasks as groups are missing; returns the informative groups'
    episodes only (round by round, each round in its sampled order).
    Numbers: groups_sampled, groups_zero_variance (of those sampled), zero_variance_share
    (their share; dropped when enabled), resample_rounds, and what the policy did on every
    episode sampled, dropped groups included (sampled_episodes, sampled_success_rate,
    sampled_mean_reward, sampled_tokens): the kept groups' success is biased towards 0.5.
    """
    sampled = sample_round(tasks, 0)
    kept_indices, dropped = informative_groups(sampled)
    groups, zero = group_count(sampled), len(dropped)
    every = list(sampled)
    if not enabled:
        return sampled, _numbers(groups, zero, 0, every)
    kept = [sampled[i] for i in kept_indices]
    drawn = {t.id for t in tasks}
    rounds = 0
    while group_count(kept) < len(tasks) and rounds < max_rounds:
        extra = replacements(drawn, len(tasks) - group_count(kept))
        if not extra:  # every task was drawn this iteration
            break
        rounds += 1
        drawn |= {t.id for t in extra}
        more = sample_round(extra, rounds)
        every += more
        more_kept, more_dropped = informative_groups(more)
        groups, zero = groups + group_count(more), zero + len(more_dropped)
        kept += [more[i] for i in more_kept]
    return kept, _numbers(groups, zero, rounds, every)


def _numbers(groups: int, zero: int, rounds: int, every: list[Rollout]) -> dict[str, float]:
    valid = [r for r in every if not r.infra_failure and r.result.reward is not None]
    return {
        "groups_sampled": groups,
        "groups_zero_variance": zero,
        "zero_variance_share": zero / groups if groups else 0.0,
        "resample_rounds": rounds,
        "sampled_episodes": len(every),
        "sampled_success_rate": sum(bool(r.result.success) for r in valid) / max(len(valid), 1),
        "sampled_mean_reward": sum(float(r.result.reward) for r in valid) / max(len(valid), 1),
        "sampled_tokens": sum(r.num_generated_tokens for r in every),
    }
