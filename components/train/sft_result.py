"""What an SFT run returns (sft.train_sft, on one process or every DeepSpeed rank)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SFTResult:
    losses: list[float]  # training loss per token, one per optimizer step taken
    learning_rates: list[float]
    grad_norms: list[float]
    steps: int  # optimizer steps taken (fewer than the budget when stopped early)
    tokens: int  # non-padding tokens seen (prompt + assistant)
    train_seconds: float
    tokens_per_second: float
    checkpoint_dir: str
    num_examples: int  # training examples (the held-out ones not included)
    num_truncated: int
    metrics: dict = field(default_factory=dict)
    # The held-out split (config.eval_fraction > 0); empty / None / False without one.
    num_eval_examples: int = 0
    eval_steps: list[int] = field(default_factory=list)  # the step of each evaluation
    eval_losses: list[float] = field(default_factory=list)  # held-out loss per token
    best_step: int | None = None  # the step whose weights were saved
    best_eval_loss: float | None = None
    stopped_early: bool = False  # patience ran out before the step budget
