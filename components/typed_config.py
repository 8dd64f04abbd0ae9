"""The one way a typed config is declared and loaded.

Every component's config is a frozen dataclass (stdlib: no import cost for the CLI, and the
shape TRL and torchtune use), each field carrying its help text in `metadata`, values
checked in `__post_init__` where they are defined. Untrusted *records* (components/data/
schema.py) are pydantic models instead: that is input validation with error paths per
record, not configuration.

`config_from_dict` builds any such dataclass from a YAML/JSON mapping, recursing into nested
dataclasses; an unknown key is an error naming where it was found.
"""

from __future__ import annotations

import dataclasses
import types
import typing


class ConfigError(ValueError):
    """A config mapping is malformed; the message names the place and the key."""


def doc(text: str) -> dict:
    """A field's help text, as dataclass metadata: `field(default=1, metadata=doc("..."))`."""
    return {"help": text}


def field_help(cls, name: str) -> str:
    """The help text of field `name` of config dataclass `cls`."""
    return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == name)


def config_from_dict(cls, values: dict | None, where: str = ""):
    """Build dataclass `cls` from a plain mapping, recursing into nested dataclasses.

    Lists become tuples (configs are frozen). Unknown keys and values the dataclass rejects
    raise ConfigError naming `where` (e.g. "configs/cpu-demo.yaml:grpo")."""
    where = where or cls.__name__
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {values!r}")
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)} for {cls.__name__} "
            f"(known: {', '.join(sorted(known))})"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        nested = next((o for o in options if dataclasses.is_dataclass(o)), None)
        if nested is not None and isinstance(value, dict):
            value = config_from_dict(nested, value, f"{where}.{name}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: {e}") from e
