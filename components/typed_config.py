"""The one way a typed config is declared and loaded.

Every component's config is a frozen dataclass (stdlib: no import cost for the CLI, and the
shape TRL and torchtune use), each field carrying its help text in `metadata`, and, where a
value has a range, pydantic's constraint names beside it (`doc("...", gt=0)`: pydantic
reads `gt`, `ge`, `lt`, `le` from a stdlib dataclass field's metadata). Checks that relate
fields stay in `__post_init__`. Untrusted *records* (components/data/schema.py) are pydantic
models: input validation with error paths per record, not configuration.

`config_from_dict` builds any such dataclass from a YAML/JSON mapping with pydantic's
`TypeAdapter` in strict JSON mode: types exactly as declared (no "3" for 3, no "yes" for
true), floats finite, no unknown keys, nested dataclasses and lists (as tuples) included;
every problem is reported as `WHERE.key: what is wrong (allowed ...)`.
"""

from __future__ import annotations

import dataclasses
import json
import typing


class ConfigError(ValueError):
    """A config mapping is malformed; the message names the place and the key."""


def doc(text: str, **constraints) -> dict:
    """A field's help text (and pydantic range constraints such as gt=0, ge=1, le=1.0), as
    dataclass metadata: `field(default=1, metadata=doc("...", ge=1))`."""
    return {"help": text, **constraints}


def _strict(cls, seen: set) -> None:
    """Give `cls` and every dataclass nested in its fields pydantic's config (the documented
    `__pydantic_config__` of a stdlib dataclass): strict types, no extra keys, finite floats."""
    from pydantic import ConfigDict

    if cls in seen:
        return
    seen.add(cls)
    cls.__pydantic_config__ = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    for hint in typing.get_type_hints(cls).values():
        for option in (*typing.get_args(hint), hint):
            if dataclasses.is_dataclass(option):
                _strict(option, seen)


_ADAPTERS: dict = {}

# The largest integer a config may hold: every count, size, step and seed ends up in a
# machine integer (torch, numpy, file offsets); pydantic alone accepts any Python int.
MAX_INT = 2**63 - 1


def _check_int_range(values, where: str) -> None:
    """Raise ConfigError naming a key (dotted, from `where`) whose integer is beyond
    MAX_INT; `values` is a YAML/JSON mapping, nested mappings and lists included (each
    container once: a YAML alias may name one twice, or inside itself)."""
    pending, seen = [(where, values)], set()
    while pending:
        at, value = pending.pop()
        if isinstance(value, dict | list | tuple):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, dict):
            pending += [(f"{at}.{k}", v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            pending += [(at, v) for v in value]
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            digits = len(str(abs(value)))  # YAML and JSON readers cap ints at 4300 digits
            shown = str(value) if digits <= 40 else f"a {digits}-digit number"
            raise ConfigError(f"{at}: {shown} is beyond what this machine can count "
                              f"(at most {MAX_INT}, 2**63-1)")  # fmt: skip


def _adapter(cls):
    if cls not in _ADAPTERS:
        from pydantic import TypeAdapter

        _strict(cls, set())
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _nested(cls, loc: tuple):
    """The dataclass at `loc` (a path of field names into `cls`), or None."""
    for name in loc:
        hints = typing.get_type_hints(cls)
        nested = [o for o in (*typing.get_args(hints.get(name)), hints.get(name))
                  if dataclasses.is_dataclass(o)]  # fmt: skip
        if not nested:
            return None
        cls = nested[0]
    return cls


def _post_init_message(owner, at: str, msg: str) -> str:
    """A `__post_init__` check's message at `at` (the file and section of dataclass `owner`):
    its subject `Owner.key ...` becomes `at.key: ...`, `Owner: ...` becomes `at: ...`, and
    `Owner.` is dropped from keys elsewhere in it."""
    msg = msg.removeprefix("Value error, ")
    if owner is not None:
        name = owner.__name__
        head, _, rest = msg.partition(" ")
        key = head.removeprefix(f"{name}.").rstrip(":")
        if (head.startswith(f"{name}.") and f"{name}." not in rest
                and key in {f.name for f in dataclasses.fields(owner)}):  # fmt: skip
            return f"{at}.{key}: {rest}"
        msg = msg.removeprefix(f"{name}: ").replace(f"{name}.", "")  # "A.r and A.alpha ..."
    return f"{at}: {msg}"


def _message(cls, where: str, error: dict) -> str:
    loc = tuple(str(part) for part in error["loc"] if not str(part).isdigit())
    at = ".".join((where, *loc)) if loc else where
    owner = _nested(cls, loc[:-1])
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden") and owner:
        known = ", ".join(f.name for f in dataclasses.fields(owner))
        parent = ".".join((where, *loc[:-1]))
        return f"{parent}: unknown key(s) {loc[-1]} for {owner.__name__} (known: {known})"
    if error["type"] == "value_error":  # a __post_init__ check: its message names the field
        return _post_init_message(_nested(cls, loc), at, error["msg"])
    shown = json.dumps(error.get("input"), default=str)
    return f"{at}: {error['msg'].lower()} (got {shown[:60]})"


def config_from_dict(cls, values: dict | None, where: str = ""):
    """Build dataclass `cls` from a plain mapping, recursing into nested dataclasses.

    Lists become tuples (configs are frozen). Unknown keys, values of the wrong type or out
    of range, and values the dataclass rejects raise ConfigError naming `where` (e.g.
    "configs/cpu-demo.yaml:grpo") and the key."""
    from pydantic import ValidationError

    where = where or cls.__name__
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {values!r}")
    _check_int_range(values, where)
    try:
        # JSON mode: the shape YAML and JSON give (lists for tuples, mappings for nested
        # configs) is what strict validation accepts there.
        text = json.dumps(values or {}, default=str, allow_nan=True)
        return _adapter(cls).validate_json(text)
    except ValidationError as e:
        problems = [_message(cls, where, err) for err in e.errors()]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more) from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: {e}") from e
