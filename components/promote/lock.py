"""One writer at a time on a promotion store: an flock on a file beside the audit log.

Every command that changes the registry or appends to the audit log (request, approve,
reject, rollback, the record of a registration) holds `promotion_lock` while it reads the
state it decides on and writes its decision, so decisions are linearizable: of two
approvals at once, the second sees the first one's result and is refused. The kernel drops
the lock when its process dies, so a killed command never leaves it held. The lock is
reentrant within a process (approve holds it, and so does the record_decision it calls).
Read-only commands (status, history) take `shared_lock`, which waits out a writer but
creates nothing (no lock file: no writer ever ran), so they never read a log and a
registry from two different moments.

What this does not protect against: a process that moves aliases through MlflowClient
directly takes no lock; the compare-and-set in audit.py and the drift check catch it.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from components.promote.config import PromotionConfig
from components.promote.errors import LockBusy

WAIT_S = 120.0  # a decision takes well under a second; longer means a stuck holder
_guard = threading.Lock()
_thread_locks: dict[str, threading.RLock] = {}  # lock path -> the in-process lock
_held: dict[str, list[int]] = {}  # lock path -> [file descriptor, depth]


def lock_path(config: PromotionConfig) -> Path:
    audit = config.resolved_audit_path()
    return audit.with_name(audit.name + ".lock")


def _wait(fd: int, mode: int, path: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise LockBusy(
                    f"another promotion command has held {path} for over {wait_s:.0f} s; "
                    "try again when it has finished"
                ) from None
            time.sleep(0.02)


def _flock(path: Path, wait_s: float) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _wait(fd, fcntl.LOCK_EX, path, wait_s)
    return fd


@contextmanager
def promotion_lock(config: PromotionConfig, wait_s: float | None = None) -> Iterator[None]:
    """Hold the store's writer lock (blocking up to `wait_s`, default WAIT_S, then LockBusy)."""
    wait_s = WAIT_S if wait_s is None else wait_s
    key = str(lock_path(config))
    with _guard:
        in_process = _thread_locks.setdefault(key, threading.RLock())
    if not in_process.acquire(timeout=wait_s):
        raise LockBusy(f"another thread has held {key} for over {wait_s:.0f} s")
    try:
        held = _held.get(key)
        if held is None:
            held = _held[key] = [_flock(Path(key), wait_s), 0]
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
            if held[1] == 0:
                del _held[key]
                os.close(held[0])  # closing the descriptor releases the flock
    finally:
        in_process.release()


@contextmanager
def shared_lock(config: PromotionConfig, wait_s: float | None = None) -> Iterator[None]:
    """For readers: wait until no decision is half written, so the log and the registry
    are read as one state. Creates nothing: without a lock file no writer ever ran."""
    path = lock_path(config)
    try:
        fd = None if str(path) in _held else os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = None
    if fd is None:  # nothing to wait for, or this process is the writer
        yield
        return
    _wait(fd, fcntl.LOCK_SH, path, WAIT_S if wait_s is None else wait_s)
    try:
        yield
    finally:
        os.close(fd)
