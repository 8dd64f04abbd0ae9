"""Output folders a command owns: `--overwrite` removes only what agentrl wrote there.

A command that writes a folder records what it wrote in `.agentrl-outputs.json` (its
manifest) when it is done. `--overwrite` then removes exactly those entries; anything else
in the folder (a file of the user's, a folder agentrl never wrote) is refused with the list,
so nobody's file is deleted by a flag. Files are written atomically (a temporary file in the
same folder, then a rename), so an interrupted command leaves the old file or the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from components.cli_args import CommandError

MANIFEST = ".agentrl-outputs.json"


def _ours(out: Path, known: set[str]) -> set[str]:
    """Entries of `out` agentrl wrote: listed in its manifest or in `known`, or folders
    that carry their own manifest (an output nested in another, e.g. imported tasks)."""
    try:
        listed = set(json.loads((out / MANIFEST).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        listed = set()
    nested = {p.name for p in out.iterdir() if p.is_dir() and (p / MANIFEST).is_file()}
    return {MANIFEST} | listed | set(known) | nested


def check_output_dir(out: Path, overwrite: bool, what: str = "output",
                     known: set[str] = frozenset()) -> list[str]:  # fmt: skip
    """Check, before any work, that `out` may take a command's output: absent or empty is
    fine; with `overwrite`, holding only what agentrl wrote (its manifest, or `known`
    names) is fine. The entries that would be replaced; CommandError naming the foreign
    entries otherwise."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise CommandError(f"{out}: is a file, expected a folder for the {what}")
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return []
    if not overwrite:
        raise CommandError(f"{out}: not empty (pass --overwrite to replace a previous {what})")
    foreign = sorted(set(present) - _ours(out, known))
    if foreign:
        shown = ", ".join(foreign[:8]) + (
            f" (+{len(foreign) - 8} more)" if len(foreign) > 8 else ""
        )
        raise CommandError(
            f"{out}: --overwrite only replaces what agentrl wrote there; refused, not written "
            f"by agentrl: {shown}"
        )
    return present


def claim_output_dir(out: Path, overwrite: bool, what: str = "output",
                     known: set[str] = frozenset()) -> None:  # fmt: skip
    """`check_output_dir`, then remove the entries it found (all agentrl's)."""
    for name in check_output_dir(out, overwrite, what, known):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def record_outputs(out: Path) -> None:
    """Record every entry now in `out` as agentrl's (after the command wrote them)."""
    entries = sorted(p.name for p in out.iterdir() if p.name != MANIFEST)
    write_atomic(out / MANIFEST, json.dumps({"entries": entries}, indent=2) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
