"""The file tools every set may offer: `search`, `read_file`, `edit_file`, `edit_lines`,
`apply_patch`, each with its schema, implementation and safety rule. An edit of a Python file
that parsed and would no longer parse is refused, the file left as it was; `edit_file`
falls back to a unique match without read_file's line-number prefixes, then ignoring
whitespace (components/env/tool_sets/text_edits.py).

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
from components.env.tool_sets.text_edits import (
    numbered_view,
    parse_refusal,
    reindented,
    replace_lines,
    strip_numbers_if_all,
    whitespace_matches,
    without_line_numbers,
)
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
EDIT_LINES = {
    "description": (
        "Replace lines start..end of a file (the numbers read_file shows) with `text`; "
        "end = start - 1 inserts `text` before line start. Shows the edited lines after."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "start": {"type": "integer", "minimum": 1},
            "end": {"type": "integer", "minimum": 0},
            "text": {"type": "string", "description": "the new lines"},
        },
        "required": ["path", "start", "end", "text"],
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


def edit_lines_rule(monitor: Monitor, arguments: dict) -> None:
    """edit_lines: the file edited and the text it writes (the lines it replaces are not in
    the call, so every line written is judged as added)."""
    if isinstance(arguments.get("path"), str):
        text = str(arguments.get("text", ""))
        monitor.file_edit(arguments["path"], text, added=text, removed="")


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
    try:
        text = _read_text(path)
    except UnicodeDecodeError:
        return failed_result(config, f"error: {rel} is not a UTF-8 text file", "binary file")
    count = text.count(old)
    if count > 1:
        msg = f"error: old text occurs {count} times in {rel}; include more context"
        return failed_result(config, msg, "old text ambiguous")
    if count == 1:
        first = text[: text.index(old)].count("\n")
        updated, shown, how = text.replace(old, new, 1), (first, new.count("\n") + 1), ""
    else:
        found = _fuzzy_edit(text, old, new)
        if isinstance(found, str):
            return failed_result(config, found.format(rel=rel), _fuzzy_error(found))
        updated, shown, how = found
    refusal = parse_refusal(rel, text, updated)
    if refusal is not None:
        return failed_result(config, refusal, "edit breaks parsing")
    if len(updated.encode()) > config.max_file_bytes:
        return failed_result(
            config, f"error: {rel} would exceed {config.max_file_bytes} bytes", "too large"
        )
    _write_no_follow(path, updated)
    first, count = shown[0] + 1, shown[1]
    note = f"; {how}" if how else ""
    return tool_result(config, f"edited {rel}: replaced 1 occurrence (now lines {first}-"
                       f"{first + count - 1}){note}")  # fmt: skip


# The fallbacks' refusals: {rel} is filled in by edit_file.
_NOT_FOUND = "error: old text not found in {rel}"
_AMBIGUOUS = "error: old text matches {n} places in {{rel}} {how}; include more context"


def _fuzzy_error(message: str) -> str:
    return "old text not found" if message == _NOT_FOUND else "old text ambiguous"


def _fuzzy_edit(text: str, old: str, new: str) -> tuple[str, tuple[int, int], str] | str:
    """edit_file's fallbacks where `old` does not occur exactly, in order: (a) read_file's
    line-number prefixes taken off `old` (and off `new`, where it has them), (b) a line-wise
    match ignoring each line's leading and trailing whitespace, `new` re-indented by the
    match's indentation delta. Each is accepted only where its match is unique. Returns
    (new text, (first line 0-based, lines shown), which fallback matched) or the refusal."""
    unnumbered = without_line_numbers(old)
    how = "matched after removing line-number prefixes"
    if unnumbered is not None:
        old, new = unnumbered, strip_numbers_if_all(new)
        count = text.count(old) if old else 0
        if count > 1:
            return _AMBIGUOUS.format(n=count, how="after removing line-number prefixes")
        if count == 1:
            first = text[: text.index(old)].count("\n")
            return text.replace(old, new, 1), (first, new.count("\n") + 1), how
    matches = whitespace_matches(text, old)
    if len(matches) > 1:
        return _AMBIGUOUS.format(n=len(matches), how="ignoring whitespace")
    if not matches:
        return _NOT_FOUND
    (first, count), lines = matches[0], text.splitlines()
    new = reindented(new, old, lines[first : first + count])
    # Only the matched lines are replaced: `old`'s blank edge lines did not take part.
    new = new.strip("\n") if new.strip() else ""
    updated = replace_lines(text, first, count, new)
    how = ("matched after removing line-number prefixes and ignoring whitespace"
           if unnumbered is not None else "matched ignoring whitespace")  # fmt: skip
    return updated, (first, max(1, new.count("\n") + 1)), how


def _read_text(path: Path) -> str:
    """A regular file's UTF-8 text, line endings kept as they are (newline="")."""
    with io.TextIOWrapper(_open_regular(path), encoding="utf-8", newline="") as f:
        return f.read()


# ----------------------------------------------------------------------------- edit_lines


def edit_lines(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    rel, start, end, new = args["path"], args["start"], args["end"], args["text"]
    path = ws.resolve(rel, for_write=True)
    if not path.exists():
        return failed_result(config, f"error: no such file: {rel}", "no such file")
    try:
        text = _read_text(path)
    except UnicodeDecodeError:
        return failed_result(config, f"error: {rel} is not a UTF-8 text file", "binary file")
    n = len(text.splitlines())
    bad = _line_range_error(rel, start, end, n)
    if bad is not None:
        return failed_result(config, bad, "bad range")
    new = strip_numbers_if_all(new)
    if new and not new.endswith("\n"):
        new += "\n"
    lines = text.splitlines(keepends=True)
    if start > n and lines and not lines[-1].endswith("\n"):  # appending after a last line
        lines[-1] += "\n"  # that had no line ending
    if lines and lines[0].endswith("\r\n"):
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    updated = "".join(lines[: start - 1]) + new + "".join(lines[end:])
    refusal = parse_refusal(rel, text, updated)
    shifted = _reindented_to_range(new, lines, start, end) if refusal is not None else None
    if shifted is not None and parse_refusal(rel, text, shifted[1]) is None:
        new, updated, refusal = shifted[0], shifted[1], None
        how = f" (re-indented to line {min(start, n)}'s indentation: as written it would not parse)"
    else:
        how = ""
    if refusal is not None:
        return failed_result(config, refusal, "edit breaks parsing")
    if len(updated.encode()) > config.max_file_bytes:
        return failed_result(
            config, f"error: {rel} would exceed {config.max_file_bytes} bytes", "too large"
        )
    _write_no_follow(path, updated)
    written = new.count("\n")
    last = start + written - 1
    now = f"now lines {start}-{last}" if written else "deleted"
    what = (f"inserted before line {start} ({now})" if end < start
            else f"replaced lines {start}-{end} ({now})") + how  # fmt: skip
    view = numbered_view(updated, start, max(last, start))
    if not view:
        return tool_result(config, f"edited {rel}: {what}; it is now empty")
    return tool_result(config, f"edited {rel}: {what}:\n{view}")


def _reindented_to_range(
    new: str, lines: list[str], start: int, end: int
) -> tuple[str, str] | None:
    """`new` shifted so that its first non-blank line is indented as the first replaced
    line (for an insert: the line it goes before), and the file's text with it; None where
    there is nothing to shift. A small model copies a line's text but not its depth; only
    an edit that would not parse as written gets this (edit_file's whitespace fallback does
    the same for `old`)."""
    target = next((ln for ln in lines[start - 1 : max(end, start)] if ln.strip()), None)
    first = next((ln for ln in new.split("\n") if ln.strip()), None)
    if target is None or first is None:
        return None
    shifted = reindented(new, first, [target.rstrip("\r\n")])
    if shifted == new:
        return None
    return shifted, "".join(lines[: start - 1]) + shifted + "".join(lines[end:])


def _line_range_error(rel: str, start: int, end: int, n: int) -> str | None:
    """Why lines start..end of a file of n lines cannot be replaced (None: they can)."""
    if start > n + 1:
        return (f"error: start {start} is past the end of {rel} ({n} lines; start {n + 1} "
                f"with end {n} appends)")  # fmt: skip
    if end < start - 1:
        return (f"error: end {end} is before start {start} (end = start - 1 inserts before "
                "line start)")  # fmt: skip
    if end > n:
        return f"error: end {end} is past the end of {rel} ({n} lines)"
    return None


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
    before: dict[str, bytes | None] = {}  # every file the patch names, as it was
    try:
        comparisons = 0
        for fp in parse_unified_diff(patch):
            for rel in (fp.old_path, fp.new_path):
                if rel is not None:
                    path = ws.resolve(rel, for_write=True)  # no escapes, no writes via links
                    comparisons += _patch_work(path, rel, fp.hunks)
                    before[rel] = _patch_limited_bytes(path)
        if comparisons > _PATCH_MAX_COMPARISONS:
            raise PatchError(
                f"the hunks' search would take up to {comparisons} line comparisons (limit "
                f"{_PATCH_MAX_COMPARISONS}): patch a smaller file, or use edit_file"
            )
        changed = apply_unified_diff(ws.root, patch, max_file_bytes=config.max_file_bytes)
    except PatchError as e:
        return failed_result(config, f"error: patch not applied: {e}", "patch failed")
    except UnicodeDecodeError:
        return failed_result(config, "error: patch not applied: a file it names is not UTF-8 "
                             "text (binary files cannot be patched)", "binary file")  # fmt: skip
    if not changed:
        return failed_result(config, "error: the patch contains no file changes", "patch failed")
    refusal = _patch_parse_refusal(ws, before)
    if refusal is not None:
        return failed_result(config, refusal, "edit breaks parsing")
    return tool_result(config, f"applied patch: {', '.join(changed)}")


def _patch_limited_bytes(path: Path) -> bytes | None:
    """A regular file's bytes before a patch (None: absent; _patch_work has checked it is
    regular and within apply_patch's size limit)."""
    try:
        return read_regular(path, _PATCH_MAX_FILE_BYTES)
    except FileNotFoundError:
        return None


def _patch_parse_refusal(ws: Workspace, before: dict[str, bytes | None]) -> str | None:
    """After a patch: the refusal (every named file put back byte for byte) when a Python
    file it changed parsed before and no longer does; None when the patch stands."""
    for rel, old in before.items():
        path = ws.resolve(rel, for_write=True)
        if old is None or not path.is_file():
            continue  # a new file, or one the patch deleted: nothing that parsed is broken
        refusal = parse_refusal(
            rel, old.decode("utf-8", "replace"), read_regular(path, _PATCH_MAX_FILE_BYTES * 2)
            .decode("utf-8", "replace"))  # fmt: skip
        if refusal is not None:
            for name, data in before.items():
                _restore(ws.resolve(name, for_write=True), data)
            return refusal.replace("edit refused", "patch refused")
    return None


def _restore(path: Path, data: bytes | None) -> None:
    """Put a file back as it was before a patch (None: it did not exist)."""
    if data is None:
        if path.is_symlink() or path.is_file():
            path.unlink()
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
