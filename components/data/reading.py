"""Reading input files into raw records, whatever the files hold: the part of ingest that
meets hostile input. Nothing here raises on a record; a record that cannot be read comes
back with the reason, and a file that cannot be read is reported as skipped.

- Folders are walked without following symbolic links: a link (to a file or a folder) is
  reported as skipped, never read, so nothing outside the input folder lands in the data
  or its quarantine. A file named on the command line is read even if it is a link. Only
  regular files are opened (a FIFO or device is skipped).
- Layout: a `.jsonl` file is one JSON value per line, unless its first line is not JSON
  and the whole file is (a pretty-printed document); a `.json` / `.traj` file is one
  document, unless it is JSON lines (it fails with "extra data" and its first line parses).
  A UTF-8 byte order mark at the start is dropped.
- A JSON array (a line or a document) is one record per element, each counted.
- Limits, per record: size (`max_record_bytes`), nesting depth (`max_depth`: deeper input
  would exhaust the recursion of the JSON encoder and the schema's serializer), and
  numbers must be finite (NaN and Infinity are not JSON, and not a reward).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.output_files import MANIFEST as OUTPUTS_MANIFEST

INPUT_SUFFIXES = (".jsonl", ".json", ".traj")
BOM = b"\xef\xbb\xbf"
_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")


@dataclass
class RawRecord:
    """One input record as read: the parsed object, or why it could not be parsed."""

    source_file: str
    source_index: int  # 1-based line for JSONL; position for a JSON array; 0 for a file
    obj: Any = None
    error: str | None = None  # "field <path>: <problem>" when obj could not be read
    raw_text: str | None = None
    # The JSON text has a \\uD8xx-\\uDFxx escape: a lone surrogate may hide in a string.
    maybe_surrogate: bool = False
    item: int | None = None  # position in a JSON array found on one JSONL line

    @property
    def name(self) -> str:
        at = f"{self.source_file}:{self.source_index}"
        return at if self.item is None else f"{at}[{self.item}]"


@dataclass(frozen=True)
class InputFile:
    label: str
    path: Path
    follow_links: bool  # named on the command line (True) or found in a folder (False)


# ------------------------------------------------------------------ finding files


def _walk(folder: Path, files: list[InputFile], skipped: list[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(folder):  # never follows links
        here = Path(dirpath)
        for name in list(dirnames):
            if (here / name).is_symlink():
                dirnames.remove(name)
                skipped.append(f"{here / name}: symbolic link to a folder (not followed)")
        for name in filenames:
            if name == OUTPUTS_MANIFEST:
                continue  # the folder's agentrl bookkeeping (an export's), not a trajectory
            f = here / name
            mode = f.lstat().st_mode
            if stat.S_ISLNK(mode):
                skipped.append(f"{f}: symbolic link (not followed)")
            elif not stat.S_ISREG(mode):
                skipped.append(f"{f}: not a regular file")
            elif name.endswith(INPUT_SUFFIXES):
                files.append(InputFile(str(f), f, follow_links=False))
            elif not name.startswith("."):
                skipped.append(f"{f}: not an input file (expected {', '.join(INPUT_SUFFIXES)})")


def find_input_files(sources: list[str]) -> tuple[list[InputFile], list[str]]:
    """Expand files and folders into input files; list what was skipped and why."""
    found: list[InputFile] = []
    skipped: list[str] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            files: list[InputFile] = []
            _walk(p, files, skipped)
            found += sorted(files, key=lambda f: f.path)
        elif os.path.lexists(p) and p.exists():
            found.append(InputFile(str(p), p, follow_links=True))  # named: any extension
        else:
            raise FileNotFoundError(f"input {src!r} does not exist")
    return found, sorted(skipped)


def open_input(f: InputFile):
    """The file opened for reading; OSError (with the reason) when it cannot be, or when
    it is not a regular file or (found in a folder) has become a link since."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if f.follow_links else os.O_NOFOLLOW)
    fd = os.open(f.path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{f.path}: not a regular file")
    return os.fdopen(fd, "rb")


# ------------------------------------------------------------------ one record


def escaped(data: bytes, limit: int = 4096) -> str:
    text = data[:limit].decode("utf-8", "backslashreplace")
    return text + (f"... [{len(data) - limit} more bytes]" if len(data) > limit else "")


def _path(parts: tuple) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<record>"


def _walk_values(obj: Any) -> Iterator[tuple[tuple, Any, int]]:
    """(path parts, value, depth) of every value, depth first, without recursion."""
    stack = [((), obj, 1)]
    while stack:
        parts, value, depth = stack.pop()
        yield parts, value, depth
        if isinstance(value, dict):
            stack.extend((parts + (k,), v, depth + 1) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((parts + (i,), v, depth + 1) for i, v in reversed(list(enumerate(value))))


def too_deep(obj: Any, max_depth: int) -> str | None:
    """Path of the first value nested deeper than max_depth (shortened), or None."""
    for parts, _, depth in _walk_values(obj):
        if depth > max_depth:
            shown = _path(parts[:6]) + (f"... ({len(parts)} levels)" if len(parts) > 6 else "")
            return shown
    return None


def first_nonfinite(obj: Any) -> tuple[str, float] | None:
    """(path, value) of the first NaN or infinite number, or None."""
    for parts, value, _ in _walk_values(obj):
        if isinstance(value, float) and not math.isfinite(value):
            return _path(parts), value
    return None


def first_bad_utf8(obj: Any) -> str | None:
    """Path of the first string (or key) that cannot be UTF-8 encoded (\\ud800 escapes)."""
    for parts, value, _ in _walk_values(obj):
        texts = (
            [value] if isinstance(value, str) else list(value) if isinstance(value, dict) else []
        )
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return _path(parts + ((text,) if text is not value else ()))
    return None


def _loads(text: str) -> tuple[Any, bool]:
    """json.loads, and whether a non-finite number (NaN, Infinity, 1e999) was seen."""
    seen: list[str] = []

    def constant(name: str) -> float:
        seen.append(name)
        return float(name)

    def number(literal: str) -> float:
        value = float(literal)
        if math.isinf(value):
            seen.append(literal)
        return value

    return json.loads(text, parse_constant=constant, parse_float=number), bool(seen)


def decode(data: bytes, label: str, index: int, max_bytes: int, max_depth: int) -> list[RawRecord]:
    """The records of one JSON value (an array gives one per element), each checked, or
    the reason the bytes are not JSON at all."""

    def bad(problem: str, item: int | None = None) -> RawRecord:
        return RawRecord(label, index, error=problem, raw_text=escaped(data), item=item)

    if len(data) > max_bytes:
        return [bad(f"field <bytes>: record is {len(data)} bytes (max {max_bytes})")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        at = data[e.start : e.start + 4]
        return [bad(f"field <bytes>: invalid UTF-8 at byte {e.start} ({at!r})")]
    try:
        obj, nonfinite = _loads(text)
    except json.JSONDecodeError as e:
        what = "truncated JSON" if e.pos >= len(text.rstrip()) else "invalid JSON"
        return [bad(f"field <json>: {what}: {e.msg} at column {e.colno}")]
    except RecursionError:
        return [bad(f"field <json>: nested too deeply to parse (max {max_depth} levels)")]
    # Cheap bound: a value cannot be nested deeper than its number of brackets.
    maybe_deep = data.count(b"[") + data.count(b"{") > max_depth
    surrogate = _SURROGATE.search(data) is not None
    items = list(enumerate(obj)) if isinstance(obj, list) else [(None, obj)]
    out = []
    for item, value in items:
        problem = _problem(value, maybe_deep, nonfinite, max_depth)
        if problem:
            out.append(bad(problem, item))
        else:
            out.append(RawRecord(label, index, obj=value, maybe_surrogate=surrogate, item=item))
    return out


def _problem(obj: Any, maybe_deep: bool, nonfinite: bool, max_depth: int) -> str | None:
    """Why a parsed record cannot be stored as it is (too deep, a non-finite number)."""
    deep = too_deep(obj, max_depth) if maybe_deep else None
    if deep is not None:
        return f"field {deep}: nested more than {max_depth} levels deep"
    found = first_nonfinite(obj) if nonfinite else None
    if found is not None:
        return f"field {found[0]}: {found[1]} is not a finite number (NaN/Infinity are not JSON)"
    return None


# ------------------------------------------------------------------ one file


def _parses(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _is_json_lines(name: str, f, max_bytes: int) -> bool:
    """Read the file as JSON lines (True) or as one document (False); see module doc."""
    head = f.readline(max_bytes + 1)
    while head and not head.strip():
        head = f.readline(max_bytes + 1)
    head = head.removeprefix(BOM).strip()
    first_line_parses = bool(head) and _parses(head)
    f.seek(0)
    if name.endswith(".jsonl"):
        if first_line_parses or os.fstat(f.fileno()).st_size > max_bytes:
            return True
        whole = f.read(max_bytes + 1).removeprefix(BOM)
        f.seek(0)
        return not _parses(whole)
    if not first_line_parses or os.fstat(f.fileno()).st_size > max_bytes:
        return False
    try:
        json.loads(f.read(max_bytes + 1).removeprefix(BOM))
    except json.JSONDecodeError as e:
        return e.msg == "Extra data"
    except (ValueError, RecursionError):
        return False
    finally:
        f.seek(0)
    return False


def json_lines(f, label: str, max_bytes: int) -> Iterator[tuple[int, bytes]] | None:
    """(1-based line number, line) of every non-blank line when the open file is JSON
    lines, else None (one JSON document: read_records decodes it whole)."""
    if not _is_json_lines(label, f, max_bytes):
        return None

    def lines() -> Iterator[tuple[int, bytes]]:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1:
                line = line.removeprefix(BOM)
            if line.strip():
                yield lineno, line.rstrip(b"\r\n")

    return lines()


def read_records(f, label: str, max_bytes: int, max_depth: int) -> Iterator[RawRecord]:
    """Every record of one open input file, parsed or with the reason it could not be."""
    lines = json_lines(f, label, max_bytes)
    if lines is not None:
        for lineno, line in lines:
            yield from decode(line, label, lineno, max_bytes, max_depth)
        return
    size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
        problem = f"field <bytes>: record is {size} bytes (max {max_bytes})"
        head = f.read(4096)
        more = f"... [{size - len(head)} more bytes]" if size > len(head) else ""
        yield RawRecord(label, 0, error=problem, raw_text=escaped(head) + more)
        return
    data = f.read().removeprefix(BOM)
    for rec in decode(data, label, 0, max_bytes, max_depth):
        if rec.item is not None:  # an element of a JSON document: its position is its index
            rec.source_index, rec.item = rec.item, None
        yield rec
