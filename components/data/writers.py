"""How the data stages write: under a lock on their target, aside, then renamed into place.

Every writer (ingest, validate, snapshot, rollback) holds an exclusive `fcntl.flock` on a
lock file beside its target while it works, so a second writer of the same target waits
(up to a timeout, then fails with a message naming the holder) instead of mixing its files
with the first one's. A reader of a dataset holds a shared lock. Before a writer takes its
own lock it takes a shared lock on each ancestor folder that has a lock file: the versioned
data folder's lock file (kept, never removed) is how snapshot and rollback of data/ exclude
every ingest and validate inside it while they run.

A dataset folder is published whole: written into a hidden sibling folder, flushed to disk,
then renamed over the target (the old one is renamed aside first and removed after). A
process killed at any point leaves the target complete (old or new) or absent with the
old copy aside; the next writer's `recover_dir` puts the old copy back and removes the
leftovers. Small files (data.dvc, journals) are written aside and renamed the same way.

Bookkeeping names are hidden siblings `.<name>.agentrl-<kind>` (lock, tmp-<id>, old-<id>,
journal). They are never data: DVC ignores them (`IGNORE_PATTERN` in .dvcignore) and the
version hashes skip them (`is_bookkeeping`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

MARK = ".agentrl-"
IGNORE_PATTERN = f".*{MARK}*"


class LockTimeout(RuntimeError):
    """Another process held a lock for longer than the configured timeout."""


def sibling(target: Path, kind: str) -> Path:
    """The hidden bookkeeping path `.<name>.agentrl-<kind>` beside `target`."""
    return target.parent / f".{target.name}{MARK}{kind}"


def is_bookkeeping(name: str) -> bool:
    return name.startswith(".") and MARK in name


def _token() -> str:
    return f"{os.getpid()}-{secrets.token_hex(3)}"


# ------------------------------------------------------------------ locks


@dataclass(frozen=True)
class Lock:
    """A lock on `target`: exclusive for a writer, shared for a reader. `keep_file`: the
    lock file stays after release (the versioned data folder's, so that writers inside it
    find it); other lock files are removed by their last holder."""

    target: Path
    exclusive: bool = True
    keep_file: bool = False

    @property
    def path(self) -> Path:
        return sibling(self.target, "lock")


def _holder(path: Path) -> str:
    """Who holds the lock, from what the exclusive holder wrote into the lock file."""
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    pid = text.split()[1] if text.startswith("pid ") else ""
    if pid.isdigit():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), 0)
            return text
    return "another process (a reader, or a writer that has not said who it is)"


def _try_lock(lock: Lock) -> int | None:
    """The lock's file descriptor, locked; None when another process holds it."""
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if lock.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        # A holder removes the file on release: the lock we got must be on the file that
        # is at the path now, or a process opening the path afresh would not see it.
        if os.stat(lock.path).st_ino == os.fstat(fd).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _acquire(lock: Lock, deadline: float) -> int:
    lock.target.parent.mkdir(parents=True, exist_ok=True)
    pause = 0.01
    while (fd := _try_lock(lock)) is None:
        if time.monotonic() > deadline:
            raise LockTimeout(
                f"{lock.target} is locked by {_holder(lock.path)}; gave up waiting "
                f"(lock file {lock.path})"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
    if lock.exclusive:
        since = datetime.now(UTC).isoformat(timespec="seconds")
        who = f"pid {os.getpid()} on {socket.gethostname()} since {since}: {' '.join(sys.argv)}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, who[:500].encode("utf-8", "replace") + b"\n", 0)
    return fd


def _release(lock: Lock, fd: int) -> None:
    try:
        if lock.keep_file:
            if lock.exclusive:
                os.ftruncate(fd, 0)
            return
        if not lock.exclusive:
            # Remove the file only as its last holder (another reader may still hold it).
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock.path).st_ino == os.fstat(fd).st_ino:
                os.unlink(lock.path)
    finally:
        os.close(fd)


def with_ancestors(locks: list[Lock]) -> list[Lock]:
    """`locks` plus a shared lock on every ancestor folder that has a lock file, outermost
    first (one global order, so two processes never wait on each other in a cycle)."""
    by_target: dict[Path, Lock] = {}
    for lock in locks:
        target = lock.target.resolve()
        for folder in reversed(target.parents):
            if sibling(folder, "lock").is_file() and folder not in by_target:
                by_target[folder] = Lock(folder, exclusive=False, keep_file=True)
        have = by_target.get(target)
        if have is None or (lock.exclusive and not have.exclusive):
            by_target[target] = Lock(target, lock.exclusive, lock.keep_file)
    return sorted(by_target.values(), key=lambda k: (len(k.target.parts), str(k.target)))


@contextlib.contextmanager
def locked(locks: list[Lock], timeout_s: float) -> Iterator[None]:
    """Hold every lock (and the shared ancestor locks) for the duration of the block."""
    deadline = time.monotonic() + timeout_s
    held: list[tuple[Lock, int]] = []
    try:
        for lock in with_ancestors(locks):
            held.append((lock, _acquire(lock, deadline)))
        yield
    finally:
        for lock, fd in reversed(held):
            _release(lock, fd)


# ------------------------------------------------------------------ atomic publishing


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    _fsync_path(path, directory=True)


def fsync_tree(root: Path) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            _fsync_path(Path(folder) / name)
        _fsync_path(Path(folder), directory=True)


def replace_dir(new: Path, target: Path) -> None:
    """Put the complete folder `new` at `target`; an existing target is removed after."""
    old = sibling(target, f"old-{_token()}")
    had_old = os.path.lexists(target)
    if had_old:
        os.rename(target, old)
    os.rename(new, target)
    fsync_dir(target.parent)
    if had_old:
        shutil.rmtree(old)


@contextlib.contextmanager
def publish_dir(target: Path) -> Iterator[Path]:
    """Yield an empty hidden sibling folder to write into; when the block succeeds it is
    flushed and renamed to `target`, otherwise removed. Call it holding target's lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling(target, f"tmp-{_token()}")
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, target)


def recover_dir(target: Path) -> list[str]:
    """Undo what a killed `publish_dir`/`replace_dir` left (holding target's lock): put
    the old folder back when the target is missing, remove half-written leftovers."""
    done: list[str] = []
    olds = sorted(target.parent.glob(f".{target.name}{MARK}old-*"))
    if olds and not os.path.lexists(target):
        os.rename(olds.pop(), target)
        done.append(f"restored {target} from an interrupted write")
    for leftover in [*olds, *target.parent.glob(f".{target.name}{MARK}tmp-*")]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
        done.append(f"removed {leftover.name}")
    return done


def recover_file(path: Path) -> list[str]:
    """Remove what a killed `write_atomic(path)` left beside `path` (the file itself is
    either the old or the new one)."""
    done = []
    for leftover in path.parent.glob(f".{path.name}{MARK}tmp-*"):
        leftover.unlink(missing_ok=True)
        done.append(f"removed {leftover.name}")
    return done


def write_atomic(path: Path, text: str) -> None:
    """Write a small text file aside, flush it and rename it over `path`."""
    tmp = sibling(path, f"tmp-{_token()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_line(path: Path, line: str) -> None:
    """Append one line with a single write, flushed (a reader never sees half of it
    unless the machine dies mid-write; readers skip a damaged last line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
