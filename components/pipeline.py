"""Typed `pipeline` section of a preset: which stages the retrain flow runs, on which
splits, and where their artefacts go (every other setting of a run lives in the section of
the stage that reads it). A component, not a flow, so presets load it without importing
`flows`."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.typed_config import doc

ALGORITHMS = ("rs", "dpo", "grpo", "ppo")


@dataclass(frozen=True)
class PipelineConfig:
    """Which stages the retrain flow runs and on what."""

    workdir: str = field(
        default="runs/pipeline", metadata=doc("folder of the run's artefacts (tasks, policies)")
    )
    algorithms: tuple[str, ...] = field(
        default=("grpo",),
        metadata=doc("RL stages after SFT, each from the SFT policy: any of rs, dpo, grpo, ppo"),
    )
    train_split: str = field(
        default="train", metadata=doc("task split of the expert data and of RL")
    )
    expert_policy: str = field(
        default="oracle",
        metadata=doc(
            "scripted policy whose trajectories SFT learns from (components/scripted/registry.py)"
        ),
    )
    sample_tasks: int = field(
        default=8, metadata=doc("train tasks sampled for rs / dpo (rollout.samples_per_task each)")
    )
    mined_tasks: str = field(
        default="",
        metadata=doc(
            "folder of mined (or imported) task folders mixed into the generated suite, each "
            "keeping its own split (`agentrl tasks mine`); their environments are prepared first"
        ),
    )

    def __post_init__(self) -> None:
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if not self.algorithms or unknown:
            raise ValueError(f"PipelineConfig.algorithms: need some of {ALGORITHMS}, got {unknown}")
        if self.sample_tasks < 1:
            raise ValueError("PipelineConfig.sample_tasks must be >= 1")
        from components.tasks.task import SPLITS

        if self.train_split not in SPLITS:
            raise ValueError(f"PipelineConfig.train_split must be one of {SPLITS}")
        from components.scripted.registry import SCRIPTED_POLICIES

        if self.expert_policy not in SCRIPTED_POLICIES:
            raise ValueError(
                f"PipelineConfig.expert_policy: unknown {self.expert_policy!r}; "
                f"choose one of {', '.join(SCRIPTED_POLICIES)}"
            )
