"""The file tools every set may offer: `search`, `read_file`, `edit_file`, `apply_patch`,
each with its schema, implementation and safety rule.

They run in the trainer's process, so their arguments and the tree cannot be allowed to
stall it: no tool opens a FIFO, socket or device (opened without blocking and checked with
fstat), `search` matches with RE2 (time linear in the text: no catastrophic backtracking; no
backreferences or lookaround), `apply_patch` refuses a file over _PATCH_MAX_FILE_BYTES or a
hunk search over _PATCH_MAX_COMPARISONS line comparisons, and a symlink loop, a binary file
or text no file name can hold is a failed call.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

from components.env import safety_patterns as patterns
from components.env.safety import Monitor, Rule
from components.env.tool_sets.types import STATUS_RESERVE, ToolResult, failed_result, tool_result
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import (
    IGNORED_NAMES,
    NotRegularFileError,
    Workspace,
    read_regular,
)

_MAX_LINE_CHARS = 2000  # longer lines are cut in read_file/search (minified files)
_SEARCH_MAX_FILE_BYTES = 2 * 1024 * 1024
# apply_patch's limits: the largest file it patches, and the most line comparisons its
# hunk search may need (file lines x hunk lines, summed): about a second at worst.
_PATCH_MAX_FILE_BYTES = 4 * 1024 * 1024
_PATCH_MAX_COMPARISONS = 2_000_000
_SKIP_DIRS = IGNORED_NAMES | {".git", ".hg", ".svn", ".venv", "node_modules"}

SEARCH = {
    "description": "Search file contents for a regular expression; prints path:line: text.",
    "parameters": {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regular expression"},
            "path": {"type": "string", "description": "file or folder (default: repo root)"},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
}
READ_FILE = {
    "description": (
        "Show a file's lines, each prefixed with its number (`12| text`), optionally only "
        "lines start_line..end_line."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "start_line": {"type": "integer", "minimum": 1},
            "end_line": {"type": "integer", "minimum": 1},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
}
EDIT_FILE = {
    "description": "Replace exactly one occurrence of `old` with `new` in a file.",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "old": {"type": "string", "description": "exact text, must occur exactly once"},
            "new": {"type": "string"},
        },
        "required": ["path", "old", "new"],
        "additionalProperties": False,
    },
}
APPLY_PATCH = {
    "description": "Apply a unified diff (paths relative to the repository root).",
    "parameters": {
        "type": "object",
        "properties": {"patch": {"type": "string"}},
        "required": ["patch"],
        "additionalProperties": False,
    },
}


def read_rule(tool: str) -> Rule:
    """search / read_file: the path read must be in the workspace and not secret-looking."""

    def rule(monitor: Monitor, arguments: dict) -> None:
        path = arguments.get("path")
        if isinstance(path, str) and patterns.is_secret_path(path):
            monitor.hit("secret_access", f"{tool} of a secret-looking path {path!r}")
        elif isinstance(path, str) and patterns.is_outside(path):
            monitor.hit("read_outside_workspace", f"{tool} of {path!r} outside the workspace")

    return rule


def edit_rule(monitor: Monitor, arguments: dict) -> None:
    """edit_file: the file edited and the text it adds."""
    if isinstance(arguments.get("path"), str):
        old, new = str(arguments.get("old", "")), str(arguments.get("new", ""))
        monitor.file_edit(arguments["path"], old + "\n" + new, added=new, removed=old)


def patch_rule(monitor: Monitor, arguments: dict) -> None:
    """apply_patch: every file the patch names, judged like an edit."""
    if isinstance(arguments.get("patch"), str):
        monitor.patch(arguments["patch"])


def search(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    # RE2 matches in time linear in the text (no backtracking): a pattern like ^(a+)+$
    # cannot stall the trainer. It has no backreferences or lookaround.
    import re2

    try:
        regex = re2.compile(args["pattern"])
    except re2.error as e:
        return failed_result(
            config, f"error: invalid regular expression {args['pattern']!r}: {e} (RE2 "
            "syntax: no backreferences or lookaround)", "bad regex",
        )  # fmt: skip
    rel = args.get("path", ".")
    base = ws.resolve(rel)
    if not base.exists():
        return failed_result(config, f"error: no such file or folder: {rel}", "no such file")
    budget = config.max_output_bytes
    lines: list[str] = []
    size = matches = omitted = 0
    for path in _walk_files(ws, base):
        for lineno, text in _text_lines(path):
            if not regex.search(text):
                continue
            matches += 1
            line = f"{path.relative_to(ws.root)}:{lineno}: {text}"
            if size + len(line) + 1 <= budget:
                lines.append(line)
                size += len(line) + 1
            else:
                omitted += 1
    if not matches:
        return tool_result(config, f"no matches for {args['pattern']!r} in {rel}")
    text = "\n".join(lines)
    if omitted:
        text += f"\n[... output truncated: {omitted} more matching lines omitted ...]"
    return tool_result(config, text, truncated=omitted > 0)


def _walk_files(ws: Workspace, base: Path):
    """Files below base in sorted order; symlinks are followed only while they stay inside."""
    if base.is_file():
        yield base
        return
    for dirpath, dirnames, filenames in os.walk(base):  # followlinks=False: no loops/escapes
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                try:
                    target = path.resolve()
                except (RuntimeError, OSError):  # a link loop
                    continue
                if ws.root not in target.parents or not target.is_file():
                    continue
            yield path


def _text_lines(path: Path):
    """(line number, text) of a text file; binary and oversized files yield nothing."""
    try:  # never opens a FIFO, socket or device (NotRegularFileError is an OSError)
        data = read_regular(path, _SEARCH_MAX_FILE_BYTES)
    except OSError:
        return
    if b"\x00" in data[:8192]:
        return
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        yield i, line[:_MAX_LINE_CHARS]


# ----------------------------------------------------------------------------- read_file


def read_file(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    rel = args["path"]
    path = ws.resolve(rel)
    if path.is_dir():
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        return failed_result(
            config, f"error: {rel} is a folder; it contains: {', '.join(entries)}", "is a folder"
        )
    if not path.exists():
        return failed_result(config, f"error: no such file: {rel}", "no such file")
    f = _open_regular(path)
    size = os.fstat(f.fileno()).st_size
    with f:
        head = f.read(8192)
    if b"\x00" in head:
        return failed_result(
            config, f"error: {rel} is a binary file ({size} bytes); not shown", "binary file"
        )
    start = args.get("start_line", 1)
    end = args.get("end_line")
    if end is not None and end < start:
        return failed_result(
            config, f"error: end_line {end} is before start_line {start}", "bad range"
        )
    # Lines are read lazily and reading stops at the output budget: a huge file costs at
    # most what is shown. The note at the end tells the model how to see more.
    budget = config.max_output_bytes - STATUS_RESERVE
    width = max(4, len(str(end or 0)))
    shown: list[str] = []
    used = seen = 0
    stopped_at: int | None = None
    with io.TextIOWrapper(_open_regular(path), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            seen = lineno
            if lineno < start:
                continue
            if end is not None and lineno > end:
                break
            text = line.rstrip("\n")
            if len(text) > _MAX_LINE_CHARS:
                text = text[:_MAX_LINE_CHARS] + f" [... line cut at {_MAX_LINE_CHARS} chars]"
            entry = f"{lineno:>{width}}| {text}"
            if used + len(entry.encode()) + 1 > budget and shown:
                stopped_at = lineno
                break
            shown.append(entry)
            used += len(entry.encode()) + 1
    if not shown:
        if seen == 0:
            return tool_result(config, f"{rel} is empty")
        msg = f"error: start_line {start} is past the end of {rel} ({seen} lines)"
        return failed_result(config, msg, "bad range")
    text = "\n".join(shown)
    if stopped_at is not None:
        text += (
            f"\n[... output truncated: {rel} continues at line {stopped_at}; "
            "read further with start_line/end_line ...]"
        )
    return tool_result(config, text, truncated=stopped_at is not None)


def _open_regular(path: Path):
    """A binary file object for a regular file; NotRegularFileError for a FIFO, socket or
    device (opened without blocking, checked before anything is read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


# ----------------------------------------------------------------------------- edit_file


def edit_file(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    rel, old, new = args["path"], args["old"], args["new"]
    path = ws.resolve(rel, for_write=True)
    if not old:
        return failed_result(
            config, "error: `old` must not be empty (create files with apply_patch)", "bad edit"
        )
    if not path.exists():
        return failed_result(config, f"error: no such file: {rel}", "no such file")
    try:  # newline="": keep \r\n as is
        with io.TextIOWrapper(_open_regular(path), encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError:
        return failed_result(config, f"error: {rel} is not a UTF-8 text file", "binary file")
    count = text.count(old)
    if count == 0:
        return failed_result(config, f"error: old text not found in {rel}", "old text not found")
    if count > 1:
        msg = f"error: old text occurs {count} times in {rel}; include more context"
        return failed_result(config, msg, "old text ambiguous")
    updated = text.replace(old, new, 1)
    if len(updated.encode()) > config.max_file_bytes:
        return failed_result(
            config, f"error: {rel} would exceed {config.max_file_bytes} bytes", "too large"
        )
    _write_no_follow(path, updated)
    first = text[: text.index(old)].count("\n") + 1
    last = first + new.count("\n")
    return tool_result(config, f"edited {rel}: replaced 1 occurrence (now lines {first}-{last})")


def _write_no_follow(path: Path, text: str) -> None:
    """Write without following a symlink planted at the last component."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


# ----------------------------------------------------------------------------- apply_patch


def apply_patch(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    # Imported here: the patch module is only needed by this tool.
    from components.tasks.patching import PatchError, apply_unified_diff, parse_unified_diff

    patch = args["patch"]
    try:
        comparisons = 0
        for fp in parse_unified_diff(patch):
            for rel in (fp.old_path, fp.new_path):
                if rel is not None:
                    path = ws.resolve(rel, for_write=True)  # no escapes, no writes via links
                    comparisons += _patch_work(path, rel, fp.hunks)
        if comparisons > _PATCH_MAX_COMPARISONS:
            raise PatchError(
                f"the hunks' search would take up to {comparisons} line comparisons (limit "
                f"{_PATCH_MAX_COMPARISONS}): patch a smaller file, or use edit_file"
            )
        changed = apply_unified_diff(ws.root, patch)
    except PatchError as e:
        return failed_result(config, f"error: patch not applied: {e}", "patch failed")
    except UnicodeDecodeError:
        return failed_result(config, "error: patch not applied: a file it names is not UTF-8 "
                             "text (binary files cannot be patched)", "binary file")  # fmt: skip
    if not changed:
        return failed_result(config, "error: the patch contains no file changes", "patch failed")
    return tool_result(config, f"applied patch: {', '.join(changed)}")


def _patch_work(path: Path, rel: str, hunks: list) -> int:
    """The most line comparisons the hunk search can make in the file at `path` (0 when
    absent); PatchError for a file that is not regular or is over the size limit."""
    from components.tasks.patching import PatchError

    try:
        st = path.stat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        raise PatchError(f"{rel}: not a regular file (a FIFO, socket, device or folder)")
    if st.st_size > _PATCH_MAX_FILE_BYTES:
        raise PatchError(f"{rel}: {st.st_size} bytes, over the {_PATCH_MAX_FILE_BYTES}-byte "
                         "limit of apply_patch")  # fmt: skip
    lines = read_regular(path, _PATCH_MAX_FILE_BYTES).count(b"\n") + 1
    return sum(2 * lines * max(1, sum(tag in " -" for tag, _ in h.lines)) for h in hunks)
