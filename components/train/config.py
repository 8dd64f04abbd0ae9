"""Typed configuration of the training stages: SFT, rejection sampling, DPO, GRPO, PPO,
DeepSpeed.

One dataclass per stage, every field with a help string, checked in `__post_init__` where
it is defined. No torch here: the CLI imports this module to validate a config file.
Paths are checked when they are used (a config written on one machine validates on another),
except the DeepSpeed JSON, whose ZeRO stage must agree with the config's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from components.policy.config import LoRAConfig
from components.typed_config import doc

# Shipped DeepSpeed configs, relative to the repository root.
DEEPSPEED_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"


@dataclass(frozen=True)
class DeepSpeedConfig:
    """Which ZeRO stage, and the shipped JSON it comes from ("auto" values are filled per run)."""

    zero_stage: Literal[0, 2, 3] = field(
        default=2,
        metadata=doc(
            "ZeRO stage: 0 plain data parallel, 2 shards optimizer state and gradients, "
            "3 also shards the parameters"
        ),
    )
    config_path: str = field(
        default="",
        metadata=doc(
            "DeepSpeed JSON; '' = the shipped configs/deepspeed/zero{stage}.json "
            "(stage 0 uses zero2.json with the stage set to 0)"
        ),
    )

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 2, 3):
            raise ValueError(f"DeepSpeedConfig.zero_stage must be 0, 2 or 3, got {self.zero_stage}")

    def resolved_path(self) -> Path:
        if self.config_path:
            return Path(self.config_path)
        return DEEPSPEED_CONFIG_DIR / f"zero{3 if self.zero_stage == 3 else 2}.json"

    def load(
        self,
        micro_batch_size: int,
        grad_accum: int,
        lr: float,
        weight_decay: float,
        max_grad_norm: float,
        bf16: bool,
    ) -> dict:
        """The JSON with every "auto" filled from the training config (as HF's integration does).

        A value the JSON sets explicitly must agree with the training config: two sources
        of truth for the batch size would silently train something else.
        """
        values = json.loads(self.resolved_path().read_text())
        zero = values.setdefault("zero_optimization", {})
        stage = zero.get("stage", self.zero_stage)
        if self.config_path and stage != self.zero_stage:
            raise ValueError(
                f"{self.config_path}: zero_optimization.stage is {stage}, config says "
                f"{self.zero_stage}"
            )
        zero["stage"] = self.zero_stage
        wanted = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": grad_accum,
            "gradient_clipping": max_grad_norm,
        }
        for key, value in wanted.items():
            if values.get(key, "auto") not in ("auto", value):
                raise ValueError(
                    f"DeepSpeed JSON sets {key}={values[key]}, training config {value}"
                )
            values[key] = value
        values.pop("train_batch_size", None)  # derived by DeepSpeed from the two above
        params = values.setdefault("optimizer", {"type": "AdamW"}).setdefault("params", {})
        for key, value in (("lr", lr), ("weight_decay", weight_decay)):
            if params.get(key, "auto") == "auto":
                params[key] = value
        bf16_section = values.setdefault("bf16", {})
        if bf16_section.get("enabled", "auto") == "auto":
            bf16_section["enabled"] = bf16
        return values


# Fields every trainer has (tracking, DeepSpeed, LoRA), declared once.
def _tracking_uri():
    return field(default="", metadata=doc("MLflow tracking URI ('' = do not log to MLflow)"))


def _experiment(stage: str):
    return field(default=f"agentrl-{stage}", metadata=doc("MLflow experiment name of the run"))


def _deepspeed():
    return field(
        default=None,
        metadata=doc(
            "update under DeepSpeed ZeRO (launch with torchrun, train/parallel.py); None = "
            "plain AdamW (gradients all-reduced across torchrun ranks)"
        ),
    )


def _lora(reference: str):
    return field(
        default=None,
        metadata=doc(f"train LoRA adapters on the frozen base{reference}; None = all weights"),
    )


def _typed_sections(config) -> None:
    """The `deepspeed` and `lora` sections as their dataclasses when they came as dicts
    (from YAML / JSON)."""
    if isinstance(config.deepspeed, dict):
        object.__setattr__(config, "deepspeed", DeepSpeedConfig(**config.deepspeed))
    if isinstance(config.lora, dict):
        object.__setattr__(config, "lora", LoRAConfig(**config.lora))


def _check_at_least(config, minimum: int, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(config, name) < minimum:
            raise ValueError(f"{type(config).__name__}.{name} must be >= {minimum}")


def _check_sequence_length(config) -> None:
    """max_seq_len of at least 16 tokens, a multiple of pad_to_multiple_of: a padded batch
    must never exceed the truncation length the model was sized for."""
    name = type(config).__name__
    if config.max_seq_len < 16:
        raise ValueError(f"{name}.max_seq_len must be >= 16")
    if config.pad_to_multiple_of and config.max_seq_len % config.pad_to_multiple_of:
        raise ValueError(f"{name}.max_seq_len must be a multiple of pad_to_multiple_of")


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on trajectories: loss on the assistant's tokens only."""

    learning_rate: float = field(default=2e-4, metadata=doc("peak learning rate (AdamW)"))
    lr_scheduler: Literal["constant", "linear", "cosine"] = field(
        default="cosine", metadata=doc("learning-rate schedule after warmup")
    )
    warmup_steps: int = field(default=0, metadata=doc("linear warmup optimizer steps"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    max_grad_norm: float = field(
        default=1.0, metadata=doc("clip the gradient norm to this (0 = no clipping)")
    )
    epochs: float = field(default=1.0, metadata=doc("passes over the examples (if max_steps <= 0)"))
    max_steps: int = field(
        default=-1,
        metadata=doc(
            "optimizer steps; > 0 overrides epochs (the examples repeat), -1: epochs", ge=-1
        ),
    )
    eval_fraction: float = field(
        default=0.0,
        metadata=doc(
            "share of the records' tasks held out (whole tasks, by a seeded hash of the "
            "task id); their loss decides early stopping and the saved weights are those "
            "of the best held-out loss. 0 = off: train the whole budget on every record"
        ),
    )
    eval_every: int = field(
        default=50,
        metadata=doc("optimizer steps between held-out evaluations (and one at the last step)"),
    )
    early_stopping_patience: int = field(
        default=3,
        metadata=doc(
            "stop after this many held-out evaluations in a row without an improvement of at "
            "least early_stopping_min_delta; epochs / max_steps stay the upper bound"
        ),
    )
    early_stopping_min_delta: float = field(
        default=0.0,
        metadata=doc("smallest fall of the held-out loss per token that counts as improvement"),
    )
    batch_size: int = field(default=4, metadata=doc("sequences per micro-batch (per device)"))
    grad_accum: int = field(
        default=1, metadata=doc("micro-batches accumulated into one optimizer step")
    )
    max_seq_len: int = field(
        default=2048,
        metadata=doc("longest training sequence; longer transcripts keep their beginning"),
    )
    pad_to_multiple_of: int = field(
        default=32,
        metadata=doc(
            "pad each batch to a multiple of this many tokens: measured, it keeps memory ~flat "
            "and throughput 2x (fewer distinct shapes for the kernels/allocator); 0 = off"
        ),
    )
    bf16: bool = field(
        default=False,
        metadata=doc("bfloat16 autocast; works on CPU too (slower than fp32 on most CPUs)"),
    )
    use_cpu: bool = field(
        default=False,
        metadata=doc("train on CPU even where a GPU is visible (tests and golden values)"),
    )
    seed: int = field(default=0, metadata=doc("seed of the data order and any sampling"))
    log_every: int = field(default=1, metadata=doc("log loss / lr / tokens/s every N steps"))
    output_dir: str = field(
        default="runs/sft", metadata=doc("where the trained policy (save_policy) is written")
    )
    mlflow_tracking_uri: str = _tracking_uri()
    mlflow_experiment: str = _experiment("sft")
    deepspeed: DeepSpeedConfig | None = _deepspeed()
    lora: LoRAConfig | None = _lora(" (policy/lora.py)")

    def __post_init__(self) -> None:
        _typed_sections(self)
        if self.learning_rate <= 0:
            raise ValueError("SFTConfig.learning_rate must be positive")
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            raise ValueError(f"SFTConfig.lr_scheduler: unknown {self.lr_scheduler!r}")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ValueError("SFTConfig: set epochs > 0 or max_steps > 0")
        _check_at_least(self, 1, ("batch_size", "grad_accum", "log_every", "eval_every",
                                  "early_stopping_patience"))  # fmt: skip
        _check_at_least(self, 0, ("warmup_steps", "pad_to_multiple_of", "weight_decay",
                                  "max_grad_norm", "early_stopping_min_delta"))  # fmt: skip
        _check_sequence_length(self)
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError("SFTConfig.eval_fraction must be in [0, 1) (0 = no held-out split)")
        # The best weights are kept as a copy of this process's parameters (sft.py); under
        # ZeRO they are sharded or shadowed by the engine's own master weights.
        if self.eval_fraction > 0 and self.deepspeed is not None:
            raise ValueError(
                "SFTConfig.eval_fraction > 0 (early stopping) is not supported with deepspeed: "
                "set one of them off"
            )


@dataclass(frozen=True)
class RejectionSamplingConfig:
    """Rejection sampling (RFT / STaR): keep the verified successes among the episodes the
    rollout stage sampled (K = rollout.samples_per_task per task), SFT on them."""

    successes_only: bool = field(
        default=True,
        metadata=doc("keep verified successes only (False: keep every scored, non-infra episode)"),
    )
    dedupe: bool = field(
        default=True,
        metadata=doc("drop identical transcripts of the same task (same events, same text)"),
    )
    max_per_task: int = field(
        default=0,
        metadata=doc("keep at most this many per task, so easy tasks do not dominate (0 = all)"),
    )
    prefer_fewest_steps: bool = field(
        default=False,
        metadata=doc(
            "when max_per_task trims, keep the successes with the fewest actions (the right "
            "fix tried soonest) instead of a seeded random choice"
        ),
    )
    seed: int = field(default=0, metadata=doc("seed of the choice when max_per_task trims"))
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(output_dir="runs/rejection_sampling"),
        metadata=doc("fine-tuning settings applied to the kept trajectories"),
    )

    def __post_init__(self) -> None:
        if isinstance(self.sft, dict):
            object.__setattr__(self, "sft", SFTConfig(**self.sft))
        if self.max_per_task < 0:
            raise ValueError("RejectionSamplingConfig.max_per_task must be >= 0")


@dataclass(frozen=True)
class DPOConfig:
    """DPO on whole multi-turn trajectories: success vs failure of the same task."""

    beta: float = field(
        default=0.1, metadata=doc("strength of the implicit KL to the reference policy")
    )
    loss_type: Literal["sigmoid", "hinge", "ipo", "robust"] = field(
        default="sigmoid", metadata=doc("DPO loss variant (losses.dpo_loss)")
    )
    label_smoothing: float = field(
        default=0.0, metadata=doc("conservative DPO: assumed share of flipped preferences")
    )
    learning_rate: float = field(default=5e-5, metadata=doc("peak learning rate (AdamW)"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    max_grad_norm: float = field(
        default=1.0, metadata=doc("clip the gradient norm to this (0 = no clipping)")
    )
    warmup_steps: int = field(default=0, metadata=doc("linear warmup optimizer steps"))
    max_steps: int = field(default=100, metadata=doc("optimizer steps (the pairs repeat)"))
    batch_size: int = field(default=2, metadata=doc("preference pairs per micro-batch"))
    grad_accum: int = field(default=1, metadata=doc("micro-batches per optimizer step"))
    pairs_per_task: int = field(
        default=4, metadata=doc("at most this many (success, failure) pairs per task")
    )
    max_seq_len: int = field(
        default=2048, metadata=doc("longest trajectory; longer ones keep their beginning")
    )
    pad_to_multiple_of: int = field(
        default=32, metadata=doc("pad each batch to a multiple of this many tokens (0 = off)")
    )
    reference_path: str = field(
        default="",
        metadata=doc(
            "checkpoint of the frozen reference policy; '' = a frozen copy of the start policy"
        ),
    )
    bf16: bool = field(default=False, metadata=doc("bfloat16 autocast (CPU or GPU)"))
    use_cpu: bool = field(default=False, metadata=doc("train on CPU even where a GPU is visible"))
    seed: int = field(default=0, metadata=doc("seed of the pair choice and the data order"))
    log_every: int = field(default=1, metadata=doc("log metrics every N steps"))
    output_dir: str = field(
        default="runs/dpo", metadata=doc("where the trained policy (save_policy) is written")
    )
    mlflow_tracking_uri: str = _tracking_uri()
    mlflow_experiment: str = _experiment("dpo")
    deepspeed: DeepSpeedConfig | None = _deepspeed()
    lora: LoRAConfig | None = _lora(", reference = the base")

    def __post_init__(self) -> None:
        _typed_sections(self)
        if self.beta <= 0:
            raise ValueError("DPOConfig.beta must be positive")
        if self.loss_type not in ("sigmoid", "hinge", "ipo", "robust"):
            raise ValueError(f"DPOConfig.loss_type: unknown {self.loss_type!r}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError("DPOConfig.label_smoothing must be in [0, 0.5)")
        if self.learning_rate <= 0:
            raise ValueError("DPOConfig.learning_rate must be positive")
        _check_at_least(self, 1, ("max_steps", "batch_size", "grad_accum", "pairs_per_task",
                                  "log_every"))  # fmt: skip
        _check_at_least(self, 0, ("warmup_steps", "pad_to_multiple_of", "weight_decay",
                                  "max_grad_norm"))  # fmt: skip
        _check_sequence_length(self)


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO on multi-turn episodes: run length, groups, objective, optimizer, checkpoints."""

    iterations: int = field(
        default=10, metadata=doc("total iterations (sample -> verify -> update) of the run")
    )
    tasks_per_iteration: int = field(
        default=4, metadata=doc("tasks (groups) sampled per iteration, from a seeded permutation")
    )
    group_size: int = field(
        default=4,
        metadata=doc("G: episodes per task; overrides RolloutConfig.samples_per_task"),
    )
    learning_rate: float = field(default=1e-6, metadata=doc("AdamW learning rate (constant)"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    epsilon_low: float = field(
        default=0.2, metadata=doc("lower clip: the ratio is clipped below at 1 - epsilon_low")
    )
    epsilon_high: float = field(
        default=0.2,
        metadata=doc("upper clip: the ratio is clipped above at 1 + epsilon_high (DAPO: 0.28)"),
    )
    beta: float = field(
        default=0.0,
        metadata=doc("weight of the k3 KL to the frozen reference; 0 = no reference model"),
    )
    loss_type: Literal["grpo", "token", "dapo", "bnpo", "dr_grpo"] = field(
        default="grpo",
        metadata=doc(
            "reduction of the per-token loss (losses.grpo_loss): grpo = per-sequence mean; "
            "token/dapo/bnpo = over all tokens; dr_grpo = sum / (B * max_episode_tokens)"
        ),
    )
    scale_by_std: bool = field(
        default=True,
        metadata=doc("divide advantages by the group's reward std (GRPO); off = Dr. GRPO"),
    )
    leave_one_out: bool = field(
        default=False,
        metadata=doc("baseline = mean reward of the *other* samples of the group (RLOO)"),
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata=doc(
            "policy term only on this top fraction of each micro-batch's assistant tokens by "
            "entropy (Wang et al. 2025: 0.2; TRL's top_entropy_quantile); 1.0 = all tokens"
        ),
    )
    turn_credit: bool = field(
        default=False,
        metadata=doc(
            "add each turn's own process reward (EpisodeResult.step_rewards), normalised over "
            "the group's turns, to the advantage of that turn's tokens"
        ),
    )
    ppo_epochs: int = field(
        default=1,
        metadata=doc(
            "mu: passes over each iteration's batch; > 1 reuses the samples and the clip matters"
        ),
    )
    minibatch_size: int = field(
        default=0,
        metadata=doc("episodes per optimizer step; 0 = the whole batch (one step per epoch)"),
    )
    micro_batch_size: int = field(
        default=4,
        metadata=doc("episodes per forward/backward (gradient accumulation inside a minibatch)"),
    )
    max_grad_norm: float = field(
        default=1.0, metadata=doc("clip the gradient norm to this (0 = no clipping)")
    )
    seed: int = field(
        default=0, metadata=doc("seed of the task order, the sampling seeds and minibatch order")
    )
    checkpoint_every: int = field(
        default=1,
        metadata=doc("write a resumable checkpoint every N iterations (and at the end)"),
    )
    keep_checkpoints: int = field(
        default=2, metadata=doc("most recent checkpoints kept on disk (>= 1)")
    )
    use_cpu: bool = field(default=False, metadata=doc("train on CPU even where a GPU is visible"))
    output_dir: str = field(
        default="runs/grpo",
        metadata=doc("checkpoints/, metrics.jsonl and the final policy/ are written here"),
    )
    mlflow_tracking_uri: str = _tracking_uri()
    mlflow_experiment: str = _experiment("grpo")
    deepspeed: DeepSpeedConfig | None = _deepspeed()
    lora: LoRAConfig | None = _lora(", KL reference = the base")
    async_rollouts: bool = field(
        default=False,
        metadata=doc(
            "sample the next iterations in a rollout process through the inference server "
            "(rollout.backend openai) while this one updates (train/async_rollouts.py)"
        ),
    )
    max_staleness: int = field(
        default=1,
        metadata=doc(
            "async_rollouts: iteration i is sampled with policy version max(0, i-1-s), i.e. "
            "at most s updates behind the weights it trains; older episodes are dropped. "
            "0 = the synchronous run exactly"
        ),
    )
    stale_importance_cap: float = field(
        default=0.0,
        metadata=doc(
            "async_rollouts: 0 = a stale episode's PPO ratio is taken against its sampling "
            "log-probs (the clip bounds it); > 0 = AReaL's decoupled objective for stale "
            "episodes: the clip around the pre-update weights' log-probs, each token's "
            "advantage weighted by pi_pre-update / pi_sampling (the stored log-probs), "
            "truncated at this cap"
        ),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=doc(
            "DAPO's dynamic sampling: a group whose rewards are all equal (no variance, no "
            "advantage) is dropped and replaced by a group of a further task, up to "
            "max_resample_rounds extra sampling rounds per iteration (train/dynamic_sampling.py)"
        ),
    )
    max_resample_rounds: int = field(
        default=2,
        metadata=doc(
            "dynamic_sampling: extra sampling rounds per iteration at most; an iteration "
            "with no group carrying variance after them does no update"
        ),
    )
    task_pass_rates: str = field(
        default="",
        metadata=doc(
            "curriculum: a JSON {task_id: pass rate} of a screen of the starting policy "
            "(grpo/curriculum.py); the task stream then walks the tasks solved sometimes "
            "(closest to 0.5 first), then never, then always. '' = seeded permutations"
        ),
    )
    sync_probe_tolerance: float = field(
        default=0.1,
        metadata=doc(
            "served sampling: after each policy sync, the server's log-probs of its top "
            "tokens on a fixed probe prompt must be within this many nats (mean) of the "
            "trainer's own for that version, or the run stops (rollout/policy_sync.py); "
            "0 = check the served name only"
        ),
    )

    def __post_init__(self) -> None:
        _typed_sections(self)
        if self.max_staleness < 0 or self.stale_importance_cap < 0:
            raise ValueError("GRPOConfig: max_staleness and stale_importance_cap must be >= 0")
        if self.max_resample_rounds < 0 or self.sync_probe_tolerance < 0:
            raise ValueError(
                "GRPOConfig: max_resample_rounds and sync_probe_tolerance must be >= 0"
            )
        _check_at_least(self, 1, ("iterations", "tasks_per_iteration", "ppo_epochs",
                                  "micro_batch_size", "checkpoint_every", "keep_checkpoints"))  # fmt: skip
        if self.group_size < 2:
            raise ValueError("GRPOConfig.group_size must be >= 2 (a group needs a baseline)")
        if self.learning_rate <= 0:
            raise ValueError("GRPOConfig.learning_rate must be positive")
        _check_at_least(self, 0, ("weight_decay", "max_grad_norm", "beta", "minibatch_size"))
        if not 0.0 <= self.epsilon_low < 1.0:
            raise ValueError("GRPOConfig.epsilon_low must be in [0, 1)")
        if self.epsilon_high < 0:
            raise ValueError("GRPOConfig.epsilon_high must be >= 0")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError("GRPOConfig.top_entropy_quantile must be in [0, 1]")
        if self.loss_type not in ("grpo", "token", "dapo", "bnpo", "dr_grpo"):
            raise ValueError(f"GRPOConfig.loss_type: unknown {self.loss_type!r}")


# GRPO settings PPO does not read: its advantages are GAE's, from the value head.
_GRPO_ONLY = ("scale_by_std", "leave_one_out", "turn_credit", "top_entropy_quantile",
              "stale_importance_cap")  # fmt: skip


@dataclass(frozen=True)
class PPOConfig(GRPOConfig):
    """PPO with a learned value function (train/ppo.py) on GRPO's episodes: every GRPO
    setting of the run, sampling, clip, KL and optimizer, plus GAE's and the value head's."""

    loss_type: Literal["grpo", "token", "dapo", "bnpo", "dr_grpo"] = field(
        default="token",
        metadata=doc("reduction of the policy loss (losses.grpo_loss); token = over all tokens"),
    )
    output_dir: str = field(
        default="runs/ppo", metadata=doc("checkpoints/, value/, metrics.jsonl and policy/")
    )
    mlflow_experiment: str = _experiment("ppo")
    gamma: float = field(default=1.0, metadata=doc("GAE's discount per sampled token"))
    gae_lambda: float = field(
        default=1.0,
        metadata=doc(
            "GAE's lambda: 1.0 = the episode's return minus the value baseline (verl's "
            "default); < 1 trusts the value head more, less variance, more bias"
        ),
    )
    value_coef: float = field(default=0.5, metadata=doc("weight of the value loss in the loss"))
    value_clip: float = field(
        default=0.2,
        metadata=doc("a new value is clipped to old +/- this (cleanrl, OpenRLHF); 0 = unclipped"),
    )
    value_learning_rate: float = field(
        default=1e-4, metadata=doc("AdamW learning rate of the value head (constant)")
    )
    normalize_advantages: bool = field(
        default=True, metadata=doc("whiten the advantages over the iteration's sampled tokens")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in dataclasses.fields(GRPOConfig):
            if f.name in _GRPO_ONLY and getattr(self, f.name) != f.default:
                raise ValueError(f"PPOConfig.{f.name}: a GRPO setting PPO does not read")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError("PPOConfig.gamma and gae_lambda must be in [0, 1]")
        _check_at_least(self, 0, ("value_coef", "value_clip"))
        if self.value_learning_rate <= 0:
            raise ValueError("PPOConfig.value_learning_rate must be positive")
