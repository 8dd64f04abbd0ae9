"""Presets: one typed YAML file per way of running the pipeline (configs/*.yaml).

A preset has one section per component, each loaded into that component's own config
dataclass, so every key is checked where it is defined (unknown keys are errors naming
the file and the key). Components never see the whole preset: flows hand each stage its
own section.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from components.typed_config import ConfigError, config_from_dict


class PresetError(ConfigError):
    """A preset file is malformed; the message names the file and key."""


@dataclass(frozen=True)
class Preset:
    """All sections of a preset, each a component's own typed config (as plain dicts until
    `section()` builds them, so loading a preset imports no heavy component)."""

    name: str
    path: str
    sections: dict = field(default_factory=dict)

    def section(self, name: str):
        cls = SECTIONS[name]()
        try:
            return config_from_dict(cls, self.sections.get(name), f"{self.path}:{name}")
        except ConfigError as e:
            raise PresetError(str(e)) from e

    def raw(self, name: str) -> dict:
        return dict(self.sections.get(name) or {})

    def config_hash(self) -> str:
        text = json.dumps(self.sections, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _lazy(module: str, name: str):
    def get():
        import importlib

        return getattr(importlib.import_module(module), name)

    return get


SECTIONS = {
    "env": _lazy("components.env.config", "EnvConfig"),
    "sandbox": _lazy("components.env.sandbox", "SandboxConfig"),
    "tasks": _lazy("components.tasks.generate", "GenerateConfig"),
    "policy": _lazy("components.policy.config", "PolicyConfig"),
    "sft": _lazy("components.train.config", "SFTConfig"),
    "rollout": _lazy("components.rollout.config", "RolloutConfig"),
    "rejection_sampling": _lazy("components.train.config", "RejectionSamplingConfig"),
    "dpo": _lazy("components.train.config", "DPOConfig"),
    "grpo": _lazy("components.train.grpo", "GRPOConfig"),
}
# Sections whose schema lives elsewhere (validated by their own loaders).
FREE_SECTIONS = {"pipeline", "data", "evaluate", "promote", "launcher", "tracking"}


def load_preset(path: str | Path) -> Preset:
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise PresetError(f"{path}: cannot read preset ({e})") from e
    if not isinstance(data, dict):
        raise PresetError(f"{path}: top level must be a mapping of sections")
    unknown = sorted(set(data) - set(SECTIONS) - FREE_SECTIONS - {"name"})
    if unknown:
        raise PresetError(f"{path}: unknown section(s) {', '.join(unknown)}")
    for key, value in data.items():
        if key != "name" and value is not None and not isinstance(value, dict):
            raise PresetError(f"{path}: section {key!r} must be a mapping")
    preset = Preset(name=data.get("name", path.stem), path=str(path),
                    sections={k: v for k, v in data.items() if k != "name"})  # fmt: skip
    return preset


def validate_preset(preset: Preset) -> None:
    """Build every typed section once (raises PresetError on the first bad key)."""
    for name in SECTIONS:
        if name in preset.sections:
            preset.section(name)


def stage_config(preset_path: str | Path, name: str, **overrides):
    """Section `name` of the preset at `preset_path` as its typed config, with `overrides`
    (fields a stage sets from its own arguments, e.g. output_dir) replacing those fields;
    overrides whose value is None are left out, so optional flags pass through as they are."""
    import dataclasses

    config = load_preset(preset_path).section(name)
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(config, **changes) if changes else config
