"""Presets: one typed YAML file per way of running the pipeline (configs/*.yaml).

A preset is the single source of a run's configuration. It has one section per
component, each loaded into that component's own config dataclass, so every key is checked
where it is defined (unknown sections and keys are errors naming the file and the key).
Each stage command takes `--preset FILE` and reads the sections its contract declares
(components/stage_contract.py); flows pass the preset file, never a translation of its
values into flags, and cache a stage on the sections it declares.
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
        """Section `name` as its typed config; a stage command gets only the sections it
        declares."""
        from components.stage_contract import check_read

        check_read(name, self.path)
        config = self._build(name)
        if name == "env" and getattr(config, "remote", "") == "local":
            # The environment server this process may start for it waits this preset's
            # start-up budget (components/env_service/local.py). Read past the stage's
            # declared sections: how long a start may take changes no result to cache on.
            from components.env_service.local import SERVERS

            SERVERS.use_preset(self._build("runtime").startup_timeout_s, self.path)
        return config

    def _build(self, name: str):
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


# Every section a preset may have, as its typed config (which stage reads which: each
# stage command's contract, components/stage_contract.py).
SECTIONS = {
    "pipeline": _lazy("components.pipeline", "PipelineConfig"),
    "tasks": _lazy("components.tasks.generate", "GenerateConfig"),
    "env": _lazy("components.env.config", "EnvConfig"),
    "sandbox": _lazy("components.sandbox.config", "SandboxConfig"),
    "policy": _lazy("components.policy.config", "PolicyConfig"),
    "sft": _lazy("components.train.config", "SFTConfig"),
    "rollout": _lazy("components.rollout.config", "RolloutConfig"),
    "rejection_sampling": _lazy("components.train.config", "RejectionSamplingConfig"),
    "dpo": _lazy("components.train.config", "DPOConfig"),
    "grpo": _lazy("components.train.config", "GRPOConfig"),
    "ppo": _lazy("components.train.config", "PPOConfig"),
    "evaluate": _lazy("components.evaluate.config", "EvaluationConfig"),
    "data": _lazy("components.data.config", "DataConfig"),
    "promote": _lazy("components.promote.config", "PromotionConfig"),
    "launcher": _lazy("components.launch.config", "LauncherConfig"),
    "mine": _lazy("components.mining.config", "MineConfig"),
    "runtime": _lazy("components.runtime", "RuntimeConfig"),  # services' start-up budget
}
# Fields a stage sets from its own arguments (output folders): a preset that sets them
# would be silently overridden, so it is an error.
STAGE_ARGUMENTS = {
    "sft": ("output_dir",),
    "dpo": ("output_dir",),
    "grpo": ("output_dir",),
    "ppo": ("output_dir",),
    "rejection_sampling": ("sft.output_dir",),
}
DEFAULT_PRESET = "configs/cpu-demo.yaml"


# What a preset may be: a few KB of a few levels. Bounds checked on the YAML events, before
# PyYAML builds anything: it builds nesting recursively (10000 levels: RecursionError) and an
# alias is the same object wherever it is used, so a 480-byte "billion laughs" document
# loads at once and then hangs whatever walks it (hashing, validation).
MAX_PRESET_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000


def _read_text(path: Path) -> str:
    if path.exists() and not path.is_file():
        raise PresetError(f"{path}: not a regular file (a preset is a YAML file)")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PRESET_BYTES + 1)
        if len(raw) > MAX_PRESET_BYTES:
            raise PresetError(f"{path}: larger than {MAX_PRESET_BYTES >> 20} MiB (a preset is "
                              "a few KB of settings)")  # fmt: skip
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PresetError(f"{path}: not a text file (a preset is YAML)") from None
    except OSError as e:
        raise PresetError(f"{path}: cannot read preset ({e.strerror or e})") from None


def _check_shape(text: str, path: Path) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or holding more than MAX_NODES values
    once its aliases are expanded (each alias counts as the whole value it names), reading
    PyYAML's events (an iterative parser) with one running count per open collection."""
    import yaml

    expanded: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth) of what it names
    stack: list[list] = [[None, 0, 0]]  # per open collection: [anchor, values, depth]
    # libyaml's parser where PyYAML has it: the pure-Python scanner looks ahead a whole
    # flow collection (10000 "[": half a second) before its first event
    loader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
    for event in yaml.parse(text, Loader=loader):
        at = f"{path}:{event.start_mark.line + 1}"
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 0, 0])
            if len(stack) - 1 > MAX_DEPTH:
                raise PresetError(f"{at}: nested deeper than {MAX_DEPTH} levels (a preset is "
                                  "a few levels of sections and keys)")  # fmt: skip
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, values, depth = stack.pop()
            values, depth = values + 1, depth + 1
        elif isinstance(event, yaml.ScalarEvent):
            anchor, values, depth = event.anchor, 1, 0
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in expanded:  # inside its own anchor, or never defined
                raise PresetError(f"{at}: alias *{event.anchor} names no complete value "
                                  "before it (a recursive or undefined alias)")  # fmt: skip
            anchor, (values, depth) = None, expanded[event.anchor]
        else:
            continue
        if anchor:
            expanded[anchor] = (values, depth)
        parent = stack[-1]
        parent[1], parent[2] = parent[1] + values, max(parent[2], depth)
        if parent[1] > MAX_NODES or len(stack) - 1 + depth > MAX_DEPTH:
            raise PresetError(f"{at}: aliases expand this preset beyond {MAX_NODES} values or "
                              f"{MAX_DEPTH} levels (an alias bomb?); write the values out")  # fmt: skip


def _read_yaml(path: Path):
    """The YAML document at `path`; a duplicate key at any level is an error (PyYAML keeps
    the last one silently), and so is an empty file (it would mean: every default), a file
    over MAX_PRESET_BYTES and a document too deep or too large once aliases expand."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise PresetError(f"{path}:{line}: duplicate key {key!r} (each key once)")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    text = _read_text(path)
    if not text.strip():
        raise PresetError(f"{path}: empty preset (give at least its name and sections)")
    try:
        _check_shape(text, path)
        return yaml.load(text, Loader=UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except PresetError:  # a ValueError too: raised as it is
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise PresetError(f"{at}: YAML syntax error: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise PresetError(f"{path}: YAML error: {' '.join(str(e).split())}") from None
    except ValueError:  # PyYAML's int() of more than 4300 digits (Python's limit)
        raise PresetError(f"{path}: a number longer than Python reads (4300 digits)") from None


def load_preset(path: str | Path) -> Preset:
    path = Path(path)
    data = _read_yaml(path)
    if data is None:  # only comments
        raise PresetError(f"{path}: empty preset (give at least its name and sections)")
    if not isinstance(data, dict):
        raise PresetError(f"{path}: top level must be a mapping of sections")
    unknown = sorted(set(map(str, data)) - set(SECTIONS) - {"name"})
    if unknown:
        raise PresetError(f"{path}: unknown section(s) {', '.join(unknown)} "
                          f"(known: name, {', '.join(SECTIONS)})")  # fmt: skip
    if not isinstance(data.get("name", ""), str) or data.get("name") == "":
        raise PresetError(f"{path}:name: must be a non-empty string, got {data.get('name')!r}")
    for key, value in data.items():
        if key != "name" and value is not None and not isinstance(value, dict):
            raise PresetError(f"{path}:{key}: a section must be a mapping of keys, got "
                              f"{type(value).__name__} {str(value)[:60]!r}")  # fmt: skip
        for dotted in STAGE_ARGUMENTS.get(key, ()):
            *parents, leaf = dotted.split(".")
            node = value or {}
            for part in parents:
                node = node.get(part) if isinstance(node.get(part), dict) else {}
            if leaf in node:
                raise PresetError(
                    f"{path}: {key}.{dotted} is set by the stage from its arguments (--out); "
                    "remove it from the preset"
                )
    preset = Preset(name=data.get("name", path.stem), path=str(path),
                    sections={k: v for k, v in data.items() if k != "name"})  # fmt: skip
    return preset


def validate_preset(preset: Preset) -> None:
    """Build every typed section once (raises PresetError on the first bad key), then
    check what sections must agree on (the expert's tool set is the environment's) and
    the paths a run reads (pipeline.mined_tasks)."""
    for name in SECTIONS:
        if name in preset.sections:
            preset._build(name)
    from components.scripted.registry import check_expert_tool_set

    pipeline = preset._build("pipeline")
    try:
        check_expert_tool_set(pipeline.expert_policy, preset._build("env"))
    except ValueError as e:
        raise PresetError(f"{preset.path}: {e}") from e
    _check_sampling_server(preset, pipeline)
    _check_task_count(preset, pipeline.workdir)
    if pipeline.mined_tasks and not Path(pipeline.mined_tasks).is_dir():
        raise PresetError(f"{preset.path}:pipeline.mined_tasks: no such folder "
                          f"{pipeline.mined_tasks!r} (a folder of task folders)")  # fmt: skip


# A generated task folder takes ~48 KiB of disk (20 tasks: 976 KiB); a suite this machine
# cannot even store is refused before a generator runs for ever.
MIN_TASK_BYTES = 16 * 1024


def _check_task_count(preset: Preset, workdir: str) -> None:
    """`tasks.n_tasks` must fit on the disk of the workdir: at least MIN_TASK_BYTES each."""
    import shutil

    n_tasks = preset._build("tasks").n_tasks
    where = Path(workdir).resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if n_tasks * MIN_TASK_BYTES > free:
        raise PresetError(f"{preset.path}:tasks.n_tasks: {n_tasks} tasks need at least "
                          f"{_size(n_tasks * MIN_TASK_BYTES)} ({MIN_TASK_BYTES >> 10} KiB "
                          f"each); {where} has {_size(free)} free")  # fmt: skip


def _size(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n_bytes < 1024 or unit == "PiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes} B"


def _check_sampling_server(preset: Preset, pipeline) -> None:
    """`rollout.server` is read where episodes are sampled on a server (backend openai) by a
    stage that syncs the policy into it; vLLM reloads LoRA adapters only."""
    rollout = preset._build("rollout")
    at = f"{preset.path}:rollout.server"
    if "server" in preset._build("evaluate").rollout:
        raise PresetError(f"{preset.path}:evaluate.rollout.server: evaluation samples "
                          "in-process or on a running server; only rollout.server starts one")  # fmt: skip
    if not rollout.server:
        return
    if rollout.backend != "openai":
        raise PresetError(f"{at}: {rollout.server} needs rollout.backend: openai (it is "
                          f"{rollout.backend}; nothing would sample on the server)")  # fmt: skip
    if rollout.sync_url:
        raise PresetError(f"{preset.path}:rollout.sync_url: the started server is the only "
                          "replica; leave sync_url out with rollout.server")  # fmt: skip
    for algo in [a for a in pipeline.algorithms if a in ("grpo", "ppo")]:
        if preset._build(algo).lora is None:
            raise PresetError(
                f"{at}: vLLM loads new policy versions as LoRA adapters only; "
                f"set {algo}.lora (it has no full-weight reload)"
            )


def stage_config(preset_path: str | Path, name: str, **overrides):
    """Section `name` of the preset at `preset_path` as its typed config, with `overrides`
    (fields a stage sets from its own arguments, e.g. output_dir) replacing those fields;
    overrides whose value is None are left out, so optional flags pass through as they are."""
    import dataclasses

    config = load_preset(preset_path).section(name)
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(config, **changes) if changes else config
