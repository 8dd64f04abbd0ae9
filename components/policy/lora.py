"""LoRA adapters on the policy (PEFT): add, use the base as the reference, save, load, merge.

A stage with `lora` set trains adapters on the frozen base (`add_adapters`); the KL / DPO
reference is the same model with its adapters switched off (`frozen_base`): no second copy
of the weights. A saved adapter policy is a folder like any checkpoint (`save_policy`
writes it; `load_policy` reads it back), holding PEFT's adapter files, the tokenizer, and
`agentrl_adapter.json`, which names the base it belongs to:

    {"base_path": "<the base checkpoint folder>", "base_sha256": "<its tensors' sha256>",
     "r": 16, "alpha": 32, "target_modules": [...], "trainable_parameters": ...}

`base_sha256` is components/lineage.py's `weights_sha256`, the digest `agentrl policy fetch`
checks and the run's fingerprints record, so a registered version's tag names the base
checkpoint a user fetched (a digest of the files' bytes differs: safetensors metadata).

A base that cannot be loaded back as it was trained against (built in memory, or its
embeddings grown by our chat tokens on load) is saved next to the adapters, in `base/`, and
`base_path` is "base". `merge_adapters` folds the adapters into the base weights for
serving (vLLM, `agentrl serve`): `agentrl policy merge --policy DIR --out DIR`. This module
never imports policy/model.py (which imports it).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

from components.lineage import weights_sha256
from components.policy.config import LoRAConfig

ADAPTER_META = "agentrl_adapter.json"


def is_adapter_model(model) -> bool:
    if "peft" not in sys.modules:  # nothing can be a PeftModel before peft is imported
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def is_adapter_dir(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_META).is_file()


def add_adapters(model, config: LoRAConfig):
    """`model` with fresh LoRA adapters (seeded A, zero B: the output is unchanged), the base
    frozen. A model that already has adapters (a loaded adapter policy) keeps training them."""
    import torch
    from peft import LoraConfig, get_peft_model

    if is_adapter_model(model):
        return model
    peft_config = LoraConfig(
        r=config.r, lora_alpha=config.alpha, lora_dropout=config.dropout,
        target_modules=list(config.target_modules), task_type="CAUSAL_LM",
    )  # fmt: skip
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(config.init_seed)
        return get_peft_model(model, peft_config)


def without_adapters(model):
    """A model to fine-tune in full: an adapter model's adapters merged into its base."""
    return merge_adapters(model) if is_adapter_model(model) else model


@contextmanager
def frozen_base(model):
    """The adapter model as its base (adapters off, eval mode): the LoRA reference policy."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        model.train(was_training)


def _base_on_disk(model) -> str:
    """The folder the base was loaded from, if loading it again gives the same base."""
    base = model.get_base_model()
    path = Path(base.name_or_path or "")
    if not base.name_or_path or not (path / "config.json").is_file():
        return ""
    saved = json.loads((path / "config.json").read_text())
    rows = base.get_input_embeddings().weight.shape[0]
    return str(path.resolve()) if saved.get("vocab_size") == rows else ""


def save_adapters(model, tokenizer, directory: Path) -> Path:
    """Write the adapters, the tokenizer and ADAPTER_META (with the base, saved in `base/`
    when it is not on disk as trained against)."""
    directory.mkdir(parents=True, exist_ok=True)
    base_path = _base_on_disk(model)
    if not base_path:
        base = model.get_base_model()  # its linear layers wrap the base ones: base_layer.*
        state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items()
                 if "lora_" not in k}  # fmt: skip
        base.save_pretrained(directory / "base", state_dict=state)
        tokenizer.save_pretrained(directory / "base")
        base_path = "base"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    peft_config = model.peft_config["default"]
    meta = {
        "base_path": base_path,
        "base_sha256": weights_sha256(directory / base_path if base_path == "base" else base_path),
        "r": peft_config.r,
        "alpha": peft_config.lora_alpha,
        "target_modules": sorted(peft_config.target_modules),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    (directory / ADAPTER_META).write_text(json.dumps(meta, indent=1) + "\n")
    return directory


def base_directory(directory: str | Path) -> Path:
    """The base checkpoint an adapter folder belongs to (ADAPTER_META's base_path)."""
    directory = Path(directory)
    base = json.loads((directory / ADAPTER_META).read_text())["base_path"]
    return directory / base if base == "base" else Path(base)


def load_adapters(base_model, directory: str | Path):
    """`base_model` with the trainable adapters saved in `directory`."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, str(directory), is_trainable=True)


def merge_adapters(model):
    """An adapter model's adapters folded into its base weights: a plain model (for serving;
    `agentrl policy merge` loads an adapter folder, merges and saves)."""
    return model.merge_and_unload()


@contextmanager
def reference_or_base(model, reference):
    """The frozen reference to score with: `reference`, or (None) `model`'s base."""
    if reference is not None:
        yield reference
        return
    with frozen_base(model) as base:
        yield base


def load_adapter_weights(model, directory: str | Path) -> None:
    """Restore the adapter weights saved in `directory` into adapter model `model`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise ValueError(
            f"{directory}: adapter weights of another model: {result.unexpected_keys[:3]}"
        )
