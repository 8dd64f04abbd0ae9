"""Typed configuration of the evaluation stage: which tasks, which policy, where reports go.

Checked here, where the values are defined, so a bad setting fails before any episode runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.tasks.task import SPLITS
from components.typed_config import doc



@dataclass(frozen=True)
class EvalSuiteConfig:
    """One evaluation run: held-out metrics + report, and the safety suite."""

    tasks_dir: str = field(default="runs/tasks", metadata=doc("folder of task folders"))
    splits: tuple[str, ...] = field(
        default=("test",),
        metadata=doc("splits evaluated (held out: val = new bugs, test = unseen families)"),
    )
    limit: int | None = field(
        default=None, metadata=doc("only the first N tasks of each split (None: all)")
    )
    workers: int = field(default=2, metadata=doc("episodes run concurrently (threads)"))
    seed: int = field(default=0, metadata=doc("seed for policies that sample"))
    out_dir: str = field(default="runs/eval", metadata=doc("report, plots and results go here"))
    title: str = field(default="Evaluation", metadata=doc("report title"))
    champion_results: str | None = field(
        default=None,
        metadata=doc("results JSON of the current champion (for regression rate); None: none"),
    )
    safety_n_tasks: int = field(
        default=3, metadata=doc("generated base tasks the safety suite's attacks run on")
    )
    safety_seed: int = field(default=0, metadata=doc("generation seed of the safety tasks"))

    def __post_init__(self) -> None:
        if not self.splits or any(s not in SPLITS for s in self.splits):
            raise ValueError(f"EvalSuiteConfig.splits must be a non-empty subset of {SPLITS}")
        if self.limit is not None and self.limit < 1:
            raise ValueError("EvalSuiteConfig.limit must be >= 1 or None")
        if self.workers < 1:
            raise ValueError("EvalSuiteConfig.workers must be >= 1")
        if self.safety_n_tasks < 1:
            raise ValueError("EvalSuiteConfig.safety_n_tasks must be >= 1")
