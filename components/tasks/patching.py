"""Pure-Python application of unified diffs to a folder.

Used by the data gate (apply a task's reference.patch) and by the agent's `apply_patch`
tool, so it must be strict about paths (nothing outside the repository) and give error
messages a model can act on. All files are computed in memory first and written only when
every hunk applied, so a failed patch leaves the folder untouched.

It runs in the driver's process, so its work is bounded whatever the patch (issue 44): the
hunk search counts every line it compares (and every line it prepares) against
`max_comparisons`, files created or changed earlier in the same patch included, and no
staged file may be larger than `max_file_bytes` (the sandbox's file limit by default);
either refusal is a PatchError and nothing is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath

from components.sandbox.config import SandboxConfig

DEV_NULL = "/dev/null"
# The most line comparisons one patch's hunk search may make: about a second at worst.
MAX_COMPARISONS = 2_000_000
# The largest file a patch may leave: the sandbox's default file limit.
DEFAULT_MAX_FILE_BYTES: int = next(
    f.default for f in fields(SandboxConfig) if f.name == "max_file_bytes"
)
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch is malformed, touches a forbidden path, or a hunk does not apply."""


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    # (tag, text) with tag in ' ', '-', '+'; text keeps no line terminator.
    lines: list[tuple[str, str]] = field(default_factory=list)
    # The old/new side ends without a newline ("\ No newline at end of file").
    old_no_eol: bool = False
    new_no_eol: bool = False

    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass
class FilePatch:
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)


def _clean_path(raw: str) -> str | None:
    """Header path -> repo-relative path (git's a/ b/ prefixes stripped), None for /dev/null."""
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"') and len(path) >= 2:
        path = path[1:-1]
    if path == DEV_NULL:
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    if not path:
        raise PatchError("empty file path in patch header")
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("\\") or re.match(r"^[A-Za-z]:", path):
        raise PatchError(f"refusing absolute path {path!r} in patch")
    if ".." in pure.parts:
        raise PatchError(f"refusing path with '..' {path!r} in patch")
    return str(pure)


def parse_unified_diff(patch_text: str) -> list[FilePatch]:
    """Parse a unified diff (git or plain `diff -u` style) into per-file hunks.

    Hunk bodies are read by their header counts (a mismatch is an error, as with
    `git apply`); bare empty lines stand for blank context lines, which editors and models
    often produce by stripping the single leading space.
    """
    lines = patch_text.splitlines()
    files: list[FilePatch] = []
    i = 0
    current: FilePatch | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            current = FilePatch(_clean_path(line[4:]), _clean_path(lines[i + 1][4:]))
            if current.old_path is None and current.new_path is None:
                raise PatchError("patch header has /dev/null on both sides")
            files.append(current)
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if current is None:
                raise PatchError(f"hunk {line!r} appears before any '---'/'+++' file header")
            hunk = Hunk(
                old_start=int(m.group(1)),
                old_count=int(m.group(2)) if m.group(2) is not None else 1,
                new_start=int(m.group(3)),
                new_count=int(m.group(4)) if m.group(4) is not None else 1,
            )
            i = _read_hunk_body(lines, i + 1, hunk, current)
            current.hunks.append(hunk)
            continue
        if line.startswith("GIT binary patch") or line.startswith("Binary files "):
            raise PatchError("binary patches are not supported")
        i += 1  # diff --git, index, mode lines and free text between files are ignored
    if not files:
        raise PatchError("no file headers ('--- a/path' then '+++ b/path') found in patch")
    for fp in files:
        if not fp.hunks and fp.new_path is not None:
            name = fp.new_path or fp.old_path
            raise PatchError(f"{name}: file header without any '@@' hunk")
    return files


def _read_hunk_body(lines: list[str], i: int, hunk: Hunk, fp: FilePatch) -> int:
    old_seen = new_seen = 0
    while i < len(lines):
        if old_seen >= hunk.old_count and new_seen >= hunk.new_count:
            # Counts satisfied; a trailing "\ No newline" marker still belongs to us.
            if lines[i].startswith("\\"):
                _mark_no_eol(hunk)
                i += 1
                continue
            break
        line = lines[i]
        if _HUNK_RE.match(line) or (
            line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            break
        if line.startswith("\\"):
            _mark_no_eol(hunk)
            i += 1
            continue
        tag, text = (line[0], line[1:]) if line else (" ", "")
        if tag not in " -+":
            name = fp.new_path or fp.old_path
            raise PatchError(
                f"{name}: hunk {hunk.header()}: line {line!r} does not start with ' ', '-' or '+'"
            )
        hunk.lines.append((tag, text))
        if tag in " -":
            old_seen += 1
        if tag in " +":
            new_seen += 1
        i += 1
    if old_seen != hunk.old_count or new_seen != hunk.new_count:
        name = fp.new_path or fp.old_path
        raise PatchError(
            f"{name}: hunk {hunk.header()} has {old_seen} old and {new_seen} new lines; "
            "the header counts do not match the body"
        )
    return i


def _mark_no_eol(hunk: Hunk) -> None:
    last_tag = hunk.lines[-1][0] if hunk.lines else " "
    if last_tag in " -":
        hunk.old_no_eol = True
    if last_tag in " +":
        hunk.new_no_eol = True


def _split_keep(text: str) -> tuple[list[str], bool]:
    """File text -> (lines without terminators, ends with newline)."""
    if text == "":
        return [], True
    return text.splitlines(), text.endswith(("\n", "\r"))


@dataclass
class _Budget:
    """Line comparisons left to one patch's hunk search (MAX_COMPARISONS)."""

    left: int

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise PatchError(
                "the hunks' search needs more line comparisons than this patch's limit "
                "allows: patch a smaller file or fewer hunks, or give more exact line numbers"
            )


def _apply_hunks(name: str, text: str, hunks: list[Hunk], budget: _Budget | None = None) -> str:
    budget = budget or _Budget(MAX_COMPARISONS)
    lines, ends_with_eol = _split_keep(text)
    budget.spend(len(lines) + len(hunks))  # the file is split and joined once per file patch
    original_len = len(lines)
    search_from = 0
    for n, hunk in enumerate(hunks, 1):
        old = [t for tag, t in hunk.lines if tag in " -"]
        new = [t for tag, t in hunk.lines if tag in " +"]
        # old_start is 1-based; for a pure insertion (count 0) it names the line before.
        expected = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        expected = max(expected + len(lines) - original_len, 0)  # shift by earlier hunks
        pos = _find_block(lines, old, expected, search_from, budget)
        if pos is None:
            raise PatchError(_mismatch_message(name, n, hunk, lines, old, expected))
        lines[pos : pos + len(old)] = new
        search_from = pos + len(new)
        if pos + len(new) == len(lines):  # the hunk reaches the end of the file
            if hunk.new_no_eol:
                ends_with_eol = False
            elif hunk.old_no_eol:
                ends_with_eol = True
    if not lines:
        return ""
    return "\n".join(lines) + ("\n" if ends_with_eol else "")


def _find_block(
    lines: list[str], block: list[str], expected: int, lo: int, budget: _Budget
) -> int | None:
    """Nearest position >= lo where `block` matches (trailing whitespace/CR ignored); every
    line compared is spent from `budget`, a PatchError once it runs out."""
    if not block:
        return min(max(expected, lo), len(lines))
    budget.spend(len(lines) + len(block))  # each line stripped once
    stripped, want = [line.rstrip() for line in lines], [line.rstrip() for line in block]

    def matches(pos: int) -> bool:
        if pos < lo or pos + len(want) > len(stripped):
            return False
        for k, line in enumerate(want):
            if stripped[pos + k] != line:
                budget.spend(k + 1)
                return False
        budget.spend(len(want))
        return True

    for delta in range(len(lines) + 1):
        for pos in (expected - delta, expected + delta) if delta else (expected,):
            if matches(pos):
                return pos
    return None


def _mismatch_message(
    name: str, n: int, hunk: Hunk, lines: list[str], old: list[str], expected: int
) -> str:
    head = f"{name}: hunk #{n} ({hunk.header()}) does not apply"
    for k, want in enumerate(old):
        at = expected + k
        have = lines[at] if 0 <= at < len(lines) else None
        if have is None:
            return f"{head}: file has {len(lines)} lines, expected {want!r} at line {at + 1}"
        if have.rstrip() != want.rstrip():
            return f"{head}: line {at + 1} is {have!r}, the patch expects {want!r}"
    return f"{head}: context not found"


def _within_size(rel: str, text: str, max_file_bytes: int) -> str:
    """`text`, or a PatchError when its file would be over the file limit."""
    if len(text) > max_file_bytes or len(text.encode("utf-8", "surrogatepass")) > max_file_bytes:
        raise PatchError(f"{rel}: the patched file would be over the {max_file_bytes}-byte file "
                         "limit; nothing was written")  # fmt: skip
    return text


def apply_unified_diff(
    repo_dir: str | Path,
    patch_text: str,
    *,
    max_comparisons: int = MAX_COMPARISONS,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[str]:
    """Apply a unified diff to the files under repo_dir; return the changed relative paths.

    Paths are relative to repo_dir (git's `a/`/`b/` prefixes are stripped, like -p1).
    Handles several files and hunks, new files (`--- /dev/null`) and deletions
    (`+++ /dev/null`). Raises PatchError without touching any file when the patch is
    malformed, a hunk does not apply, a path is absolute, contains '..', or resolves
    outside repo_dir (e.g. through a symlink), the hunk search would compare more than
    `max_comparisons` lines (all files together, the ones the patch itself made included),
    or a file would be left larger than `max_file_bytes`.
    """
    root = Path(repo_dir).resolve()
    files = parse_unified_diff(patch_text)
    budget = _Budget(max_comparisons)
    # path -> new text (None = delete). Later file patches see earlier results.
    staged: dict[str, str | None] = {}

    def resolve(rel: str) -> Path:
        p = (root / rel).resolve()
        if p != root and root not in p.parents:
            raise PatchError(f"refusing path {rel!r}: it resolves outside the repository")
        return p

    def current_text(rel: str) -> str | None:
        if rel in staged:
            return staged[rel]
        p = resolve(rel)
        if p.is_dir():
            raise PatchError(f"{rel}: is a directory")
        return p.read_text() if p.exists() else None

    for fp in files:
        if fp.old_path is None:  # creation
            rel = fp.new_path
            assert rel is not None
            if current_text(rel) is not None:
                raise PatchError(f"{rel}: patch creates this file but it already exists")
            staged[rel] = _within_size(rel, _apply_hunks(rel, "", fp.hunks, budget), max_file_bytes)
            continue
        text = current_text(fp.old_path)
        if text is None:
            raise PatchError(f"{fp.old_path}: no such file to patch")
        result = _within_size(
            fp.new_path or fp.old_path, _apply_hunks(fp.old_path, text, fp.hunks, budget),
            max_file_bytes,
        )  # fmt: skip
        if fp.new_path is None:  # deletion; the hunks must have removed everything
            if result.strip():
                raise PatchError(f"{fp.old_path}: deletion patch leaves content behind")
            staged[fp.old_path] = None
        else:
            if fp.new_path != fp.old_path:
                staged[fp.old_path] = None  # a rename
                resolve(fp.new_path)
            staged[fp.new_path] = result
    for rel, text in staged.items():
        p = resolve(rel)
        if text is None:
            if p.exists():
                p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return sorted(staged)
