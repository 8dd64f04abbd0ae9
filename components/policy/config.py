"""Typed configuration of the policy model: a tiny model built from a config, or a local checkpoint.

The default is laptop-sized (4 layers, 256 wide, a 3k-token vocabulary trained locally);
tests use 2 layers, 64 wide. `pretrained_path` swaps in any local Hugging Face causal-LM
checkpoint directory, in which case the architecture and tokenizer fields are ignored.
Values are checked here, where they are defined; paths are checked when they are used, so
a config written on one machine can be validated on another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from components.typed_config import doc

# Byte-level BPE needs the 256 byte symbols plus the chat special tokens before any merge.
MIN_VOCAB_SIZE = 256 + 7 + 1


@dataclass(frozen=True)
class PolicyConfig:
    """How to build (or where to load) the policy model and its tokenizer."""

    architecture: Literal["qwen2", "llama"] = field(
        default="qwen2", metadata=doc("decoder family of the tiny model (transformers class)")
    )
    hidden_size: int = field(default=256, metadata=doc("model width"))
    num_layers: int = field(default=4, metadata=doc("decoder layers"))
    num_heads: int = field(default=4, metadata=doc("attention heads; must divide hidden_size"))
    num_kv_heads: int = field(
        default=2,
        metadata=doc("key/value heads (grouped-query attention); must divide num_heads"),
    )
    intermediate_size: int = field(default=704, metadata=doc("MLP inner width"))
    max_position_embeddings: int = field(
        default=4096, metadata=doc("longest sequence (prompt + transcript) the model sees")
    )
    rope_theta: float = field(default=10000.0, metadata=doc("rotary embedding base"))
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata=doc("parameter dtype; float32 on CPU, bfloat16 on GPUs")
    )
    attn_implementation: Literal["sdpa", "eager"] = field(
        default="sdpa", metadata=doc("attention kernel (transformers attn_implementation)")
    )
    seed: int = field(
        default=0, metadata=doc("seed of the weight init and of the tokenizer corpus sample")
    )
    vocab_size: int = field(
        default=3072,
        metadata=doc(
            "target tokenizer size including special tokens; modest on purpose so unseen "
            "identifiers decompose into common pieces a tiny model can copy"
        ),
    )
    tokenizer_min_frequency: int = field(
        default=2, metadata=doc("a merge must occur this often in the corpus to be learned")
    )
    tokenizer_stdlib_bytes: int = field(
        default=2_000_000,
        metadata=doc("bytes of Python standard-library source added to the tokenizer corpus"),
    )
    tokenizer_path: str = field(
        default="", metadata=doc("load this saved tokenizer instead of training one ('' = train)")
    )
    compact_prompt: bool = field(
        default=True,
        metadata=doc("short system prompt (one line per tool) instead of the full JSON schemas"),
    )
    pretrained_path: str = field(
        default="",
        metadata=doc(
            "local Hugging Face checkpoint directory; replaces the tiny model and its tokenizer"
        ),
    )

    add_chat_tokens: bool = field(
        default=False,
        metadata=doc(
            "give a pretrained checkpoint without a usable chat template our chat tokens: "
            "new, untrained embedding rows; off, such a checkpoint is refused, and every other "
            "pretrained checkpoint keeps its vocabulary and embeddings as they are"
        ),
    )

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError("PolicyConfig: num_heads must divide hidden_size")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("PolicyConfig: num_kv_heads must divide num_heads")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("PolicyConfig: the head size must be even (rotary embeddings)")
        if self.max_position_embeddings < 16:
            raise ValueError("PolicyConfig.max_position_embeddings must be >= 16")
        if self.rope_theta <= 0:
            raise ValueError("PolicyConfig.rope_theta must be positive")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"PolicyConfig.vocab_size must be >= {MIN_VOCAB_SIZE}")
        if self.tokenizer_min_frequency < 1:
            raise ValueError("PolicyConfig.tokenizer_min_frequency must be >= 1")
        if self.tokenizer_stdlib_bytes < 0:
            raise ValueError("PolicyConfig.tokenizer_stdlib_bytes must be >= 0")
        if self.architecture not in ("qwen2", "llama"):
            raise ValueError(f"PolicyConfig.architecture: unknown {self.architecture!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"PolicyConfig.dtype: unknown {self.dtype!r}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"PolicyConfig.attn_implementation: unknown {self.attn_implementation!r}"
            )


# Every linear layer of a Qwen2 / Llama decoder block: attention and MLP.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (PEFT LoRA) instead of full fine-tuning: the base weights stay
    frozen, only r x (in + out) numbers per targeted layer train. A training stage with
    `lora` set saves the adapters (plus the name of their base) instead of a full copy."""

    r: int = field(default=16, metadata=doc("adapter rank"))
    alpha: int = field(default=32, metadata=doc("scaling numerator: updates are alpha / r x BA"))
    dropout: float = field(default=0.0, metadata=doc("dropout on the adapter input (0 = none)"))
    target_modules: tuple[str, ...] = field(
        default=LORA_TARGETS,
        metadata=doc("names of the linear layers that get adapters (module name suffixes)"),
    )
    init_seed: int = field(
        default=0, metadata=doc("seed of the adapters' A matrices (B starts at zero)")
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))  # JSON lists
        if self.r < 1 or self.alpha < 1:
            raise ValueError("LoRAConfig.r and LoRAConfig.alpha must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("LoRAConfig.dropout must be in [0, 1)")
        if not self.target_modules:
            raise ValueError("LoRAConfig.target_modules must name at least one layer")
