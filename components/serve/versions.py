"""The policy versions `agentrl serve` answers under, and their atomic replacement.

What it mirrors, so that the trainer's policy sync drives the production code path on CPU:
- LoRA: vLLM's runtime adapter endpoints (vLLM with `--enable-lora` and
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): `POST /v1/load_lora_adapter {lora_name,
  lora_path}` adds an adapter that requests then name as their `model`; loading a name
  that is already loaded is a 400 unless `load_inplace: true`, a folder with no adapter a
  404, a broken adapter (a tensor missing, a truncated file) a 500, as vLLM answers; `POST
  /v1/unload_lora_adapter {lora_name}`; `/v1/models` lists the base and every adapter
  (with `parent`).
- Full weights: vLLM has no stable HTTP endpoint that reloads weights from a checkpoint on
  disk (vllm-project/vllm#12774; its RL endpoints, `/init_weight_transfer_engine` +
  `/update_weights` over NCCL/IPC and `/collective_rpc` "reload_weights", live behind
  VLLM_SERVER_DEV_MODE). SGLang's is stable: `POST /update_weights_from_disk
  {model_path, weight_version}`, answering {success, message} and keeping the old weights
  when loading fails. This server implements that one, and names the new weights by
  `weight_version`, which becomes the served model name (the old name stops answering:
  a request for it is a 404, never silently the new weights).

Atomic: a version is registered only after it is completely loaded and checked (every
adapter tensor present, every weight of the architecture present, all finite); a failed
or partial load leaves what was served before, untouched. Loads and generation hold the
same lock, so no request ever runs on a half-replaced model.
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


class VersionError(Exception):
    """A load/unload request that cannot be honoured; `status` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class ServedPolicies:
    """A base model served under `base_name`, plus LoRA adapters by served name.

    `adapters` maps a served name to (PEFT adapter name, path): the PEFT names are private
    ("a0", "a1", ...) so an in-place load can stage the new weights under a fresh name and
    swap the mapping in one step.
    """

    model: object
    base_name: str
    adapters: dict[str, tuple[str, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: itertools.count = field(default_factory=itertools.count)

    def names(self) -> list[str]:
        return [self.base_name, *self.adapters]

    @contextmanager
    def selected(self, name: str | None):
        """Under the lock: the model with `name`'s weights active, and the name answered
        under (None = the base). An unknown name is a 404, as in vLLM."""
        with self.lock:
            if name in (None, "", self.base_name):
                if self.adapters:
                    with self.model.disable_adapter():
                        yield self.model, self.base_name
                else:
                    yield self.model, self.base_name
                return
            if name not in self.adapters:
                raise VersionError(404, f"The model `{name}` does not exist.")
            self.model.set_adapter(self.adapters[name][0])
            yield self.model, name

    def load_adapter(self, name: str, path: str, inplace: bool = False) -> None:
        """Load the PEFT adapter folder `path` as served model `name` (vLLM's semantics)."""
        if not name or name == self.base_name:
            raise VersionError(400, f"invalid lora_name {name!r}")
        if name in self.adapters and not inplace:
            raise VersionError(400, f"The lora adapter '{name}' has already been loaded.")
        if not (Path(path) / "adapter_config.json").is_file():  # vLLM: a 404
            raise VersionError(404, f"Loading lora {name} failed: No adapter found for {path}")
        with self.lock:
            internal = f"a{next(self._counter)}"
            try:
                self._load_checked(internal, path)
            except Exception as exc:  # noqa: BLE001 - any failure leaves the old versions
                self._drop(internal)
                self._unwrap_if_empty()
                # vLLM answers a broken adapter folder with a 500 (its worker's error).
                raise VersionError(500, f"loading adapter '{name}' failed: {exc}") from exc
            old = self.adapters.get(name)
            self.adapters[name] = (internal, str(path))
            if old is not None:
                self._drop(old[0])
            self.model.eval()

    def _load_checked(self, internal: str, path: str) -> None:
        """Load adapter `internal` from `path`; raise if any of its tensors was missing (PEFT
        would leave the missing ones at their initial values: a mix of old and new)."""
        from peft import PeftModel

        if not hasattr(self.model, "peft_config"):
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=internal)
            # from_pretrained reports nothing: check against the file ourselves.
            missing = _missing_adapter_keys(self.model, internal, path)
        else:
            result = self.model.load_adapter(path, adapter_name=internal)
            missing = [k for k in result.missing_keys if f".{internal}." in k]
        if missing:
            raise ValueError(f"{len(missing)} adapter tensors missing, e.g. {missing[0]}")

    def _drop(self, internal: str) -> None:
        if hasattr(self.model, "peft_config") and internal in self.model.peft_config:
            self.model.delete_adapter(internal)

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise VersionError(404, f"The lora adapter '{name}' cannot be found.")
        with self.lock:
            internal, _ = self.adapters.pop(name)
            self._drop(internal)
            self._unwrap_if_empty()

    def _unwrap_if_empty(self) -> None:
        """With no adapter left, back to the plain model (LoRA layers gone, base unchanged):
        a later full-weight reload compares it with a plain checkpoint."""
        if not self.adapters and hasattr(self.model, "peft_config"):
            self.model = self.model.unload()

    def reload_weights(self, path: str, version: str | None) -> str:
        """Replace the base weights with the checkpoint at `path`, served as `version` (or
        the current name). Loaded and checked beside the serving model; swapped under the
        lock only when complete. Returns the name now served."""
        if self.adapters:
            raise VersionError(
                409, "unload the LoRA adapters first: they were trained on the old weights"
            )
        try:
            new = _load_full(path, self.model)
        except Exception as exc:  # noqa: BLE001 - the old weights keep serving
            raise VersionError(400, f"reloading weights from {path} failed: {exc}") from exc
        with self.lock:
            self.model = new
            self.base_name = version or self.base_name
        return self.base_name


def _missing_adapter_keys(model, internal: str, path: str) -> list[str]:
    """Adapter tensors of `internal` that the file at `path` does not hold."""
    from peft import get_peft_model_state_dict
    from safetensors import safe_open

    with safe_open(str(Path(path) / "adapter_model.safetensors"), "pt") as f:
        saved = set(f.keys())
    expected = get_peft_model_state_dict(model, adapter_name=internal)
    return sorted(k for k in expected if k not in saved)


def _load_full(path: str, current):
    """A complete, finite model from checkpoint `path` with `current`'s architecture and
    dtype, in eval mode on its device."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    model, info = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, output_loading_info=True,
        dtype=next(current.parameters()).dtype,
    )  # fmt: skip
    if info["missing_keys"] or info["mismatched_keys"]:
        bad = [*info["missing_keys"], *info["mismatched_keys"]]
        raise ValueError(f"incomplete checkpoint: {len(bad)} weights missing, e.g. {bad[0]}")
    old = {k: v.shape for k, v in current.state_dict().items()}
    new = {k: v.shape for k, v in model.state_dict().items()}
    if old != new:
        raise ValueError("another architecture than the one being served")
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise ValueError("non-finite weights")
    _copy_generation_tokens(current, model)
    return model.to(current.device).eval()


def _copy_generation_tokens(current, model) -> None:
    """The serving model's eos/pad ids (set from the tokenizer when it was loaded) carry over:
    a bare weights snapshot may not hold them."""
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(current.generation_config, key, None)
        if value is not None:
            setattr(model.generation_config, key, value)
