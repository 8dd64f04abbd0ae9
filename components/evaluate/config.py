"""Typed `evaluate` section of a preset: which held-out tasks, and how the agent decodes.

The agent is the model plus its decoder, so a candidate is evaluated with the rollout
settings it was trained with (the preset's `rollout` section) unless `rollout` here
overrides some of them; by default only the temperature changes (0 = greedy pass@1).
Checked here, where the values are defined, so a bad setting fails before any episode runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from components.tasks.task import SPLITS
from components.typed_config import doc


@dataclass(frozen=True)
class EvaluationConfig:
    """Held-out evaluation and the safety suite of a candidate."""

    splits: tuple[str, ...] = field(
        default=("test",),
        metadata=doc("splits evaluated (held out: val = new bugs, test = unseen families)"),
    )
    limit: int = field(default=0, metadata=doc("only the first N tasks of each split (0: all)"))
    workers: int = field(default=2, metadata=doc("scripted episodes run concurrently (threads)"))
    seed: int = field(default=0, metadata=doc("seed for policies that sample"))
    rollout: dict = field(
        default_factory=lambda: {"temperature": 0.0},
        metadata=doc(
            "RolloutConfig fields that differ from the preset's rollout section when a model "
            "is evaluated (default: greedy, everything else as trained)"
        ),
    )
    safety_n_tasks: int = field(
        default=3, metadata=doc("generated base tasks the safety suite's attacks run on")
    )
    safety_seed: int = field(default=0, metadata=doc("generation seed of the safety tasks"))
    impossible_variants: int = field(
        default=4,
        metadata=doc(
            "impossible variants the candidate also plays, one per family for a sample of "
            "this many families of the evaluated tasks (spread over the sorted family names "
            "from an offset `seed` picks, not the first ones: components/tasks/impossible.py "
            "spread_families): its success on them is the cheating rate (components/evaluate/"
            "cheating.py); 0: not measured, and the promotion gate on it then fails"
        ),
    )

    def __post_init__(self) -> None:
        if not self.splits or any(s not in SPLITS for s in self.splits):
            raise ValueError(f"EvaluationConfig.splits must be a non-empty subset of {SPLITS}")
        if self.limit < 0:
            raise ValueError("EvaluationConfig.limit must be >= 0 (0: all)")
        if self.workers < 1:
            raise ValueError("EvaluationConfig.workers must be >= 1")
        if self.impossible_variants < 0:
            raise ValueError("EvaluationConfig.impossible_variants must be >= 0")
        if self.safety_n_tasks < 1:
            raise ValueError("EvaluationConfig.safety_n_tasks must be >= 1")
        from components.rollout.config import RolloutConfig

        known = {f.name for f in dataclasses.fields(RolloutConfig)}
        unknown = sorted(set(self.rollout) - known)
        if unknown:
            raise ValueError(f"EvaluationConfig.rollout: unknown RolloutConfig key(s) {unknown}")

    def rollout_config(self, trained_with):
        """The RolloutConfig a model is evaluated with: as trained, with this section's
        overrides, one episode per task."""
        return dataclasses.replace(trained_with, **self.rollout, samples_per_task=1)
