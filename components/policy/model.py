"""Build, save and load the policy: a tiny causal LM from a config, or a local checkpoint.

The tiny model is a real transformers architecture (Qwen2 or Llama) with tied embeddings,
so every engine downstream (vLLM, DeepSpeed, PEFT) takes it unchanged; only its size is
small. A local checkpoint (`pretrained_path`) keeps its own tokenizer and its own chat
template (chat.chat_format follows it: its own tool-call syntax, or plain-text calls when
it renders no tools), and so its vocabulary and embeddings. Only a checkpoint with no
usable template gets ours, and only when its preset says so (`policy.add_chat_tokens`:
the chat tokens are added as single ids with new embedding rows). Either way the tokenizer
leaves here with a pad token, and generation stops at the format's end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from components.cli_args import CommandError
from components.policy.chat import CHAT_TEMPLATE, IM_END, PAD, chat_format, end_of_turn_id
from components.policy.config import PolicyConfig
from components.policy.lora import is_adapter_dir, is_adapter_model
from components.policy.tokenizer import (
    SPECIAL_TOKENS,
    TOOL_TAG_TOKENS,
    build_corpus,
    load_tokenizer,
    train_tokenizer,
)


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def tiny_model_config(config: PolicyConfig, tokenizer):
    """The transformers config of the tiny model, sized to the tokenizer."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[config.architecture]
    return cls(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
    )


def build_policy(
    config: PolicyConfig, records: Sequence[dict] = (), texts: Sequence[str] = ()
) -> tuple:
    """(model, tokenizer) for `config`.

    With `pretrained_path`, both are loaded from that local checkpoint. Otherwise the
    tokenizer is loaded from `tokenizer_path` or trained on `records` (canonical trajectories,
    rendered through the chat format), `texts` and a standard-library sample, and the tiny
    model is initialised from `config.seed` (the global torch RNG is left untouched).
    """
    import torch
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    if config.pretrained_path:
        return load_policy(config.pretrained_path, config.dtype, config.add_chat_tokens)
    if config.tokenizer_path:
        tokenizer = load_tokenizer(config.tokenizer_path)
    else:
        corpus = build_corpus(
            records, texts, config.tokenizer_stdlib_bytes, config.seed, config.compact_prompt
        )
        tokenizer = train_tokenizer(corpus, config.vocab_size, config.tokenizer_min_frequency)
    model_config = tiny_model_config(config, tokenizer)
    model_config._attn_implementation = config.attn_implementation
    cls = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}[config.architecture]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = cls(model_config)
    model.to(_torch_dtype(config.dtype))
    _set_generation_tokens(model, tokenizer)
    return model, tokenizer


def ensure_chat_tokens(model, tokenizer) -> None:
    """Give a loaded (model, tokenizer) our chat format: template, chat tokens, eos and pad.

    A checkpoint of another family may lack `<|im_start|>` and friends; they are added (the
    embedding matrix grows, new rows are the model's default init), so the transcript
    format is the same for every policy.
    """
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab()
    missing_special = [t for t in SPECIAL_TOKENS if t not in vocab]
    missing_tags = [t for t in TOOL_TAG_TOKENS if t not in vocab]
    if missing_special:
        tokenizer.add_special_tokens(
            {"extra_special_tokens": [AddedToken(t, special=True) for t in missing_special]},
            replace_extra_special_tokens=False,
        )
    if missing_tags:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in missing_tags])
    tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = PAD
    tokenizer.chat_template = CHAT_TEMPLATE
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    _set_generation_tokens(model, tokenizer)


def own_format_tokens(model, tokenizer) -> None:
    """A checkpoint that keeps its own template: a pad token (its own, else its document
    end, else the end of turn: padding is masked everywhere) and generation settings."""
    if tokenizer.pad_token is None:
        end_of_turn = chat_format(tokenizer).end_of_turn
        tokenizer.pad_token = tokenizer.eos_token or end_of_turn
    _set_generation_tokens(model, tokenizer)


def _set_generation_tokens(model, tokenizer) -> None:
    # Generation stops at the end of the assistant turn, not at the document end token.
    eos = end_of_turn_id(tokenizer)
    model.config.eos_token_id = eos
    model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = None


def save_policy(model, tokenizer, directory: str | Path) -> Path:
    """Write model weights/config and tokenizer (with its chat template) to `directory`; a
    model with LoRA adapters writes the adapters and the base they belong to (policy/lora.py)."""
    directory = Path(directory)
    if is_adapter_model(model):
        from components.policy.lora import save_adapters

        return save_adapters(model, tokenizer, directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class CheckpointError(CommandError, ValueError):
    """A checkpoint folder whose files cannot be read as one (truncated or damaged weights,
    a config that is not JSON): one line naming the folder and what failed (exit 1)."""


@contextmanager
def _reading(directory: Path, what: str) -> Iterator[None]:
    """Errors of the libraries reading a checkpoint's files, as CheckpointError."""
    from safetensors import SafetensorError

    try:
        yield
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:
        text = " ".join(str(e).split())[:300]
        raise CheckpointError(
            f"{directory}: cannot load {what} ({type(e).__name__}: {text})"
        ) from e


def load_policy(
    directory: str | Path, dtype: str | None = None, add_chat_tokens: bool = False
) -> tuple:
    """(model, tokenizer) from a local checkpoint directory; never touches the network. An
    adapter folder (policy/lora.py) gives its base with the adapters, trainable.
    `add_chat_tokens`: see PolicyConfig; without it, a checkpoint that would need new
    tokens is refused (ValueError naming the folder)."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    if is_adapter_dir(directory):
        from components.policy.lora import base_directory, load_adapters

        with _reading(directory, "its adapter metadata"):
            base_dir = base_directory(directory)
        # The base as it was trained: if it got our chat tokens then, it gets them again
        # (a base that keeps its own format is untouched either way).
        base, _ = load_policy(base_dir, dtype, add_chat_tokens=True)
        with _reading(directory, "the LoRA adapter"):
            return load_adapters(base, directory), load_tokenizer(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a Hugging Face checkpoint (no config.json)")
    kwargs = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = _torch_dtype(dtype)
    with _reading(directory, "the checkpoint"):
        model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
        tokenizer = load_tokenizer(directory)
    if tokenizer.chat_template == CHAT_TEMPLATE:
        vocab = tokenizer.get_vocab()
        missing = [t for t in (*SPECIAL_TOKENS, *TOOL_TAG_TOKENS) if t not in vocab]
        if missing and not add_chat_tokens:
            raise ValueError(
                f"{directory}: no chat template that can carry tool calls, and the tokenizer "
                f"lacks {', '.join(missing)}; set policy.add_chat_tokens: true to add them "
                "(new, untrained embedding rows) or bring a checkpoint with a chat template"
            )
        ensure_chat_tokens(model, tokenizer)
    else:
        own_format_tokens(model, tokenizer)
    return model, tokenizer
