"""The agent's change to a task's repository, as a unified diff, and the size of such a diff.

An episode stores this diff (`EpisodeResult.final_diff`, the record's `final_diff`) before
its workspace is freed, so what the agent left behind can be measured or reviewed later
without replaying its tool calls. The diff applies to the task's repo with
`components.tasks.patching.apply_unified_diff`; lines are compared as `str.splitlines`
splits them (line terminators become `\\n`), undecodable bytes are replaced, and a symlink
or other non-regular file counts as absent (never followed: it could point anywhere on the
host), as in the verifier's copy of the repository.
"""

from __future__ import annotations

import difflib
import json
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from components.tasks.patching import DEV_NULL

# Above this many bytes of files to compare, no diff is kept (the episode's patch metrics
# are then unknown): a record stays small and difflib's time bounded whatever the agent wrote.
MAX_DIFF_INPUT_BYTES = 1 << 20
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _lines(path: Path) -> tuple[list[str] | None, int]:
    """A regular file's lines (each with its `\\n`, the last without one when the file
    has none) and its size; (None, 0) for anything else."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None, 0
    if not stat.S_ISREG(st.st_mode):
        return None, 0
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = [line + "\n" for line in text.splitlines()]
    if lines and not text.endswith(("\n", "\r")):
        lines[-1] = lines[-1][:-1]
    return lines, st.st_size


def _header_path(prefix: str, rel: str) -> str:
    # A name with a line break would split the header: quote it, as git does.
    return f"{prefix}{rel}" if rel.isprintable() else json.dumps(f"{prefix}{rel}")


def repo_diff(original: Path, final: Path, files: Iterable[str]) -> str | None:
    """The unified diff turning `original` into `final` over the relative paths `files`
    (git's a/ b/ prefixes, /dev/null for created and deleted files); None when the files
    hold more than MAX_DIFF_INPUT_BYTES. Raises OSError for a file it cannot read."""
    out: list[str] = []
    total = 0
    for rel in sorted(files):
        (before, n_before), (after, n_after) = _lines(original / rel), _lines(final / rel)
        total += n_before + n_after
        if total > MAX_DIFF_INPUT_BYTES:
            return None
        if before is None and after is None:
            continue
        fromfile = DEV_NULL if before is None else _header_path("a/", rel)
        tofile = DEV_NULL if after is None else _header_path("b/", rel)
        for line in difflib.unified_diff(before or [], after or [], fromfile, tofile):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diff_changed_lines(diff: str) -> int:
    """Added plus removed lines of a unified diff. Hunk bodies are read by their header
    counts, so a content line that looks like a file header is still counted."""
    changed = old = new = 0  # old/new: lines of the current hunk still to read
    for line in diff.splitlines():
        if old > 0 or new > 0:
            tag = line[:1] or " "  # a bare empty line is blank context
            if tag == "\\":
                continue
            old -= tag in " -"
            new -= tag in " +"
            changed += tag in "+-"
            continue
        m = _HUNK.match(line)
        if m:
            old = int(m.group(1)) if m.group(1) is not None else 1
            new = int(m.group(2)) if m.group(2) is not None else 1
    return changed
