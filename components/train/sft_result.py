"""What an SFT run returns (sft.train_sft, on one process or every DeepSpeed rank)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SFTResult:
    losses: list[float]  # one per optimizer step
    learning_rates: list[float]
    grad_norms: list[float]
    steps: int
    tokens: int  # non-padding tokens seen (prompt + assistant)
    train_seconds: float
    tokens_per_second: float
    checkpoint_dir: str
    num_examples: int
    num_truncated: int
    metrics: dict = field(default_factory=dict)
