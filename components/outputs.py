"""Output folders a command owns: `--overwrite` removes only what agentrl wrote there.

A command that writes a folder lists what it writes in `.agentrl-outputs.json` (its
manifest; written first and entry by entry, components/output_files.py). `--overwrite` then
removes exactly those entries; anything else in the folder (a file of the user's, a folder
agentrl never wrote) is refused with the list, so nobody's file is deleted by a flag.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from components.cli_args import CommandError
from components.output_files import MANIFEST, listed_outputs, write_atomic

__all__ = ["MANIFEST", "check_output_dir", "claim_output_dir", "record_outputs", "write_atomic"]


def _ours(out: Path, known: set[str]) -> set[str]:
    """Entries of `out` agentrl wrote: listed in its manifest or in `known`, or folders
    that carry their own manifest (an output nested in another, e.g. imported tasks)."""
    listed = set(listed_outputs(out))
    nested = {p.name for p in out.iterdir() if p.is_dir() and (p / MANIFEST).is_file()}
    return {MANIFEST} | listed | set(known) | nested


def check_output_dir(out: Path, overwrite: bool, what: str = "output",
                     known: set[str] = frozenset(), *, rewritten: bool = False) -> list[str]:  # fmt: skip
    """Check, before any work, that `out` may take a command's output: absent or empty is
    fine; with `overwrite`, holding only what agentrl wrote (its manifest, or `known`
    names) is fine. The entries that would be replaced; CommandError naming the foreign
    entries otherwise. `rewritten`: a command with no --overwrite that replaces its own
    previous output (a default folder written on every run) says so when it refuses."""
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
        if rewritten:
            raise CommandError(
                f"{out}: holds what agentrl did not write there ({shown}); "
                f"the {what} replaces only its own files: choose another --out"
            )
        raise CommandError(
            f"{out}: --overwrite only replaces what agentrl wrote there; refused, not written "
            f"by agentrl: {shown}"
        )
    return present


def claim_output_dir(out: Path, overwrite: bool, what: str = "output",
                     known: set[str] = frozenset(), *, rewritten: bool = False) -> None:  # fmt: skip
    """`check_output_dir`, then remove the entries it found (all agentrl's)."""
    for name in check_output_dir(out, overwrite, what, known, rewritten=rewritten):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def record_outputs(out: Path) -> None:
    """Record every entry now in `out` as agentrl's (after the command wrote them)."""
    entries = sorted(p.name for p in out.iterdir() if p.name != MANIFEST)
    write_atomic(out / MANIFEST, json.dumps({"entries": entries}, indent=2) + "\n")
