"""Output folders a command owns: `--overwrite` removes only what agentrl wrote there.

A command that writes a folder records what it writes in `.agentrl-outputs.json` (its
manifest): the manifest first (`start_outputs`), each entry listed before it is written
(`add_outputs`), so a command that fails half-way leaves a folder that is still recognised
as agentrl's. `--overwrite` then removes exactly those entries; anything else in the folder
(a file of the user's, a folder agentrl never wrote) is refused with the list, so nobody's
file is deleted by a flag. Files are written atomically (a temporary file in the same
folder, then a rename), so an interrupted command leaves the old file or the new one. A
full disk (or quota, or file size limit) is one line naming the path being written
(`disk_errors`): the OS error of a failed write names no file.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from components.cli_args import CommandError

MANIFEST = ".agentrl-outputs.json"


# What a write that ran out of room fails with: a full disk, a quota, a file size limit
# (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG).
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFull(CommandError):
    """A write that ran out of room: one line naming the path (exit 1)."""


def full_disk_errno(error: BaseException) -> int | None:
    """The errno of a write that ran out of room, else None: an OSError, or a library's own
    error that carries the OS error in its text (safetensors: `Os { code: 28, ... }`)."""
    if isinstance(error, OSError):
        return error.errno if error.errno in FULL_DISK else None
    text = str(error)
    for code in FULL_DISK:
        if f"code: {code}," in text or os.strerror(code) in text:
            return code
    return None


@contextmanager
def disk_errors(path: Path, what: str = "") -> Iterator[None]:
    """Turn a full-disk error inside the block into DiskFull naming `path` (or the file the
    OS error names), what was being written and what to do; other errors pass through."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:  # noqa: BLE001 - only the full-disk ones are turned, by errno
        code = full_disk_errno(e)
        if code is None:
            raise
        named = getattr(e, "filename", None) or path
        raise DiskFull(
            f"{named}: {os.strerror(code).lower()} while writing "
            f"{what or 'output'} (free space, or write elsewhere)"
        ) from e


def check_free_space(path: Path, what: str) -> None:
    """Before long work whose output goes to `path`: DiskFull when its file system has no
    free block left (the work would be lost at its first write). Writes nothing."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        stats = os.statvfs(probe)
    except OSError:
        return  # nothing to say before trying: the write names what fails
    if stats.f_bavail == 0:
        raise DiskFull(
            f"{path}: {os.strerror(errno.ENOSPC).lower()} for {what} (free space, or write elsewhere)"
        )


def _listed(out: Path) -> list[str]:
    try:
        entries = json.loads((out / MANIFEST).read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []


def _ours(out: Path, known: set[str]) -> set[str]:
    """Entries of `out` agentrl wrote: listed in its manifest or in `known`, or folders
    that carry their own manifest (an output nested in another, e.g. imported tasks)."""
    listed = set(_listed(out))
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


def start_outputs(out: Path, entries: Iterable[str] = ()) -> None:
    """Mark `out` (claimed, so empty or holding only agentrl's) as agentrl's before the
    first entry is written: its manifest, listing `entries` (those known up front) and any
    it listed before. A command that fails after this leaves a folder `--overwrite` takes."""
    with disk_errors(out / MANIFEST, "the output manifest"):
        out.mkdir(parents=True, exist_ok=True)
        _write_manifest(out, [*_listed(out), *entries])


def add_outputs(out: Path, *names: str) -> None:
    """List `names` in out's manifest before they are written (a half-written entry is
    then still agentrl's); names already listed cost nothing."""
    listed = _listed(out)
    if not set(names) <= set(listed):
        with disk_errors(out / MANIFEST, "the output manifest"):
            _write_manifest(out, [*listed, *names])


def _write_manifest(out: Path, entries: Iterable[str]) -> None:
    names = sorted(set(entries) - {MANIFEST})
    write_atomic(out / MANIFEST, json.dumps({"entries": names}, indent=2) + "\n")


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


@contextmanager
def line_log(path: Path, what: str, first: dict) -> Iterator[Callable[[dict], None]]:
    """Append one JSON line per call to `path` as results come (from any thread, flushed
    each), so a failure later keeps every one before it. `first` is written at once: a
    full disk is found before any work, not after it. Full-disk errors name `path`."""
    lock = threading.Lock()
    with disk_errors(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        f = path.open("w", encoding="utf-8")
    try:

        def append(row: dict) -> None:
            with lock, disk_errors(path, what):
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()

        try:
            append(first)
        except DiskFull:  # nothing of this run is in it: leave no file behind
            path.unlink(missing_ok=True)
            raise
        yield append
    finally:
        with suppress(OSError):  # the write that failed already said why
            f.close()
