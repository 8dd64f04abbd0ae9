"""What every `agentrl` command's parser is built from: a parser whose errors are one line,
argument types that check ranges and paths while parsing, and the errors a command raises
for the boundary in components/cli.py to print (one line, exit 2 or 1, never a traceback).

    from components.cli_args import ArgumentParser, existing_dir, positive_int

    p = ArgumentParser(prog="agentrl tasks check")
    p.add_argument("--tasks", required=True, type=existing_dir)
    p.add_argument("--workers", type=positive_int, default=2)

A new command gets all of it by using `ArgumentParser` from here (tests/test_bad_invocations.py
checks that every command does). Only argparse and pathlib are imported: the CLI starts fast.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit status `code`."""

    code = 1


class UsageError(CommandError):
    """A bad argument or config value (exit 2)."""

    code = 2


class PreflightError(UsageError):
    """What a run needs and this machine lacks, found before its first stage: the boundary
    prints one line per problem (exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with errors raised as UsageError (one line: the argument and what is
    allowed), not a multi-line usage block and SystemExit."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _number(kind, text: str, lo=None, hi=None, lo_open=False):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if isinstance(value, int) and abs(value) > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{text[:40]} is beyond what this machine can count")
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo}, got {text}")
    if hi is not None and value > hi:
        raise argparse.ArgumentTypeError(f"must be <= {hi}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lo=1)


def nonnegative_int(text: str) -> int:
    return _number(int, text, lo=0)


def positive_float(text: str) -> float:
    return _number(float, text, lo=0, lo_open=True)


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    return _number(float, text, lo=0, hi=1)


def port(text: str) -> int:
    return _number(int, text, lo=1, hi=65535)


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def existing_path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or folder: {text}")
    return path


def existing_dir(text: str) -> Path:
    path = existing_path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return path


def existing_file(text: str) -> Path:
    path = existing_path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"not a file: {text}")
    return path


def preset_file(text: str) -> str:
    """A preset that exists and is valid as a whole (every section, components/preset.py),
    checked while parsing: a command never starts on a bad preset."""
    from components.preset import load_preset, validate_preset
    from components.typed_config import ConfigError

    try:
        validate_preset(load_preset(existing_file(text)))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def saved_policy(text: str) -> str:
    """A saved policy folder: config.json (a full checkpoint) or adapter_config.json."""
    folder = existing_dir(text)
    if not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise argparse.ArgumentTypeError(f"{text} is not a saved policy (no config.json)")
    return str(folder)


def tracking_uri(text: str) -> str:
    """An MLflow tracking URI of a scheme MLflow stores runs in: a path, file:, sqlite:
    (or another SQLAlchemy database), http(s): or databricks."""
    scheme = text.split(":", 1)[0].lower() if "://" in text or text.startswith("file:") else ""
    known = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
    if scheme and scheme.split("+")[0] not in known:
        raise argparse.ArgumentTypeError(
            f"unknown scheme {scheme!r} in {text!r}; use a path or one of {', '.join(known)}"
        )
    return text


def output_file(text: str) -> Path:
    """A file the command will write: not a folder, and its folder writable (or creatable),
    checked before any work is done."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"is a folder, expected a file path: {text}")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"not writable: {text}")
    _check_creatable(path.parent, text)
    return path


def output_dir(text: str) -> Path:
    """A folder the command will write into: not a file, writable or creatable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"is a file, expected a folder: {text}")
    _check_creatable(path, text)
    return path


def _check_creatable(folder: Path, shown: str) -> None:
    """`folder` is writable, or its nearest existing parent is a writable folder."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise argparse.ArgumentTypeError(f"{probe} is not a folder (in {shown})")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {probe} (for {shown})")


def choice_list(choices) -> callable:
    """A comma-separated list whose items are each one of `choices`."""
    allowed = tuple(choices)

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in text.split(",") if item.strip())
        unknown = [item for item in items if item not in allowed]
        if not items or unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(allowed)}"
            )
        return items

    return parse
