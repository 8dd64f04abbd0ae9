"""Writing a command's output so that a failure is clean: the output manifest first, atomic
writes, and a full disk named.

An output folder lists what agentrl writes there in `.agentrl-outputs.json` (its manifest;
components/outputs.py claims folders by it): the manifest first (`start_outputs`), each
entry listed before it is written (`add_outputs`), so a command that fails half-way leaves
a folder that `--overwrite` still recognises as agentrl's. Files are written atomically (a
temporary file in the same folder, then a rename), so an interrupted command leaves the old
file or the new one. A full disk (or quota, or file size limit) is one line naming the path
being written (`disk_errors`, DiskFull): the OS error of a failed write names no file.
Results that come one by one are appended as they come (`line_log`). Imports nothing of the
project: every layer writes through it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

MANIFEST = ".agentrl-outputs.json"

# What a write that ran out of room fails with: a full disk, a quota, a file size limit
# (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG).
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFull(OSError):
    """A write that ran out of room, its message naming the path: an OSError, so the
    command line's boundary prints it as one line, exit 1."""


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


def listed_outputs(out: Path) -> list[str]:
    """The entries out's manifest lists ([] without a readable one)."""
    try:
        entries = json.loads((out / MANIFEST).read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []


def start_outputs(out: Path, entries: Iterable[str] = ()) -> None:
    """Mark `out` (claimed, so empty or holding only agentrl's) as agentrl's before the
    first entry is written: its manifest, listing `entries` (those known up front) and any
    it listed before. A command that fails after this leaves a folder `--overwrite` takes."""
    with disk_errors(out / MANIFEST, "the output manifest"), made_folder(out):
        _write_manifest(out, [*listed_outputs(out), *entries])


@contextmanager
def made_folder(out: Path) -> Iterator[None]:
    """`out` made (with its missing parents) for the block; when the block fails, the
    folders it made are removed again (those still empty): a command that fails before
    its first entry, such as on a full disk at its manifest, leaves nothing."""
    missing, probe = [], Path(out)
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    Path(out).mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for folder in missing:  # the deepest first
            with suppress(OSError):
                folder.rmdir()
        raise


def add_outputs(out: Path, *names: str) -> None:
    """List `names` in out's manifest before they are written (a half-written entry is
    then still agentrl's); names already listed cost nothing."""
    listed = listed_outputs(out)
    if not set(names) <= set(listed):
        with disk_errors(out / MANIFEST, "the output manifest"):
            _write_manifest(out, [*listed, *names])


def _write_manifest(out: Path, entries: Iterable[str]) -> None:
    names = sorted(set(entries) - {MANIFEST})
    write_atomic(out / MANIFEST, json.dumps({"entries": names}, indent=2) + "\n")


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
