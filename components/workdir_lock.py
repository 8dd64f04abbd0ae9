"""One lock per workdir and per data repository, held by every command that writes into one
for as long as it runs: a second writer is refused at once, with who holds it, instead of
mixing its files with the first one's (issue 45: `agentrl reproduce` started beside a
running pipeline rolled data/ back and moved the pipeline's live workdir aside).

    with workdir_lock("runs/pipeline", "python -m flows.retrain --preset configs/cpu-demo.yaml"):
        ...  # refused: WorkdirInUse, "runs/pipeline is in use by PID 123, started at ..."

The lock is an exclusive `fcntl.flock` on `.<name>.agentrl-runlock` beside the folder, so the
kernel drops it when its holder dies, and it belongs to the path, not the folder (a folder
moved aside leaves its lock where it was). The holder writes who it is into the lock file
(JSON: pid, start time, command, run token) for the refusal to quote and empties it on
release: a record found in a lock file nobody holds is a holder that died, whose lock is
taken over, and that is said on stderr.

A lock is the run's, not only its process's:
- in the process that holds it, taking it again is free (a stage the flow runs in-process
  writes into the workdir the flow holds);
- a process the holder started (a stage run as a subprocess) inherits the holder's run token
  (AGENTRL_RUN_TOKEN, set in the holder's environment) and passes;
- a writer of a folder inside a held one is refused (every ancestor's lock file is checked),
  and taking a folder checks the lock files one and two levels inside it (a writer inside
  it that started first).
It excludes agentrl commands on one machine (or on a file system whose flock is shared):
what runs on other machines (Kubernetes Jobs) passes only with the token in its environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from components.cli_args import CommandError
from components.output_files import disk_errors

SUFFIX = ".agentrl-runlock"
TOKEN_ENV = "AGENTRL_RUN_TOKEN"


class WorkdirInUse(CommandError):
    """Another run holds the folder's lock (exit 2: nothing was done; run it afterwards)."""

    code = 2


@dataclass
class _Held:
    fd: int | None  # None: held by the run that started this process (its token)
    count: int


_HELD: dict[Path, _Held] = {}
_GUARD = threading.Lock()


def lock_file(folder: str | Path) -> Path:
    """The lock file of `folder`: `.<name>.agentrl-runlock` beside it."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}{SUFFIX}"


def run_token() -> str:
    """This run's token: inherited from the process that started this one, else new (and
    put in the environment, so every process this one starts carries it)."""
    if not os.environ.get(TOKEN_ENV):
        os.environ[TOKEN_ENV] = f"{os.getpid()}-{secrets.token_hex(6)}"
    return os.environ[TOKEN_ENV]


def command_line() -> str:
    """This process's command line as a person typed it (the program's name, not its path)."""
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "python"


def read_record(path: Path) -> dict:
    """The holder record in lock file `path` ({} when empty or unreadable); a holder writes
    it right after it gets the lock, so an empty one is read again a few times."""
    for _ in range(5):
        try:
            record = json.loads(path.read_text(encoding="utf-8", errors="replace") or "{}")
        except (OSError, ValueError):
            record = {}
        if record:
            return record if isinstance(record, dict) else {}
        time.sleep(0.02)
    return {}


def describe(record: dict) -> str:
    """`PID N, started at T (command)`, from a holder record."""
    if not record.get("pid"):
        return "another process (it has not written who it is)"
    host = record.get("host", "")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return (f"PID {record['pid']}{where}, started at {record.get('started_at', '?')} "
            f"({record.get('command', '?')})")  # fmt: skip


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _refusal(folder: Path, held: Path, record: dict) -> WorkdirInUse:
    owner = held.parent / held.name[1 : -len(SUFFIX)]
    where = f"{folder}: {owner}" if owner != folder else f"{folder}"
    return WorkdirInUse(f"{where} is in use by {describe(record)}; run this when it has "
                        f"finished (lock file {held})")  # fmt: skip


def _held_by_others(path: Path, shared: bool) -> dict | None:
    """The record of another run holding lock file `path`, or None (free, or this run's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or not ours to read: nothing we could wait on
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        record = read_record(path)
        return None if record.get("token") == run_token() else record
    finally:
        os.close(fd)


def _check_around(folder: Path) -> None:
    """Refuse when another run holds a folder above `folder` or one or two levels inside."""
    for above in folder.parents:
        path = lock_file(above)
        if not above.name or above in _HELD or not path.is_file():
            continue
        if (record := _held_by_others(path, shared=True)) is not None:
            raise _refusal(folder, path, record)
    if not folder.is_dir():
        return
    inside = [*folder.glob(f".*{SUFFIX}"), *folder.glob(f"*/.*{SUFFIX}")]
    for path in sorted(inside):
        owner = path.parent / path.name[1 : -len(SUFFIX)]
        if owner not in _HELD and (record := _held_by_others(path, shared=False)) is not None:
            raise _refusal(folder, path, record)


def _take(folder: Path, command: str) -> tuple[int | None, str]:
    """Lock `folder` for this run: (the lock's file descriptor, None when the run that
    started this process holds it; a line saying a dead holder's lock was taken over)."""
    path = lock_file(folder)
    with disk_errors(path, "the run lock"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock_current(path)
    if fd is None:
        record = read_record(path)
        if record.get("token") == run_token():
            return None, ""
        raise _refusal(folder, path, record) from None
    previous = read_record_fd(fd)
    taken_over = ""
    if previous.get("pid"):  # its holder never released it: it died holding it
        state = "still runs but no longer holds it" if _alive(previous["pid"]) else "is gone"
        taken_over = (f"took over the lock on {folder} from {describe(previous)}, which "
                      f"{state}")  # fmt: skip
    record = {"pid": os.getpid(), "host": socket.gethostname(), "token": run_token(),
              "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
              "command": (command or command_line())[:400]}  # fmt: skip
    try:
        with disk_errors(path, "the run lock's holder record"):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode("utf-8", "replace"), 0)
    except BaseException:
        os.close(fd)  # not taken: a full disk leaves no held lock behind
        raise
    return fd, taken_over


def _lock_current(path: Path) -> int | None:
    """A descriptor of the lock file at `path`, flocked; None while another holds it. A
    release unlinks the file before it unlocks, so a lock won on a file no longer at
    `path` is stale: try again on the one there now."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"could not lock {path}: it keeps being replaced")


def read_record_fd(fd: int) -> dict:
    """The holder record in the open lock file `fd` ({} when empty or damaged)."""
    try:
        size = os.fstat(fd).st_size
        record = json.loads(os.pread(fd, min(size, 65536), 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def acquire(folder: str | Path, command: str = "") -> str:
    """Take the lock of `folder` for this run (again: a count); '' or the line saying a
    dead holder's lock was taken over. Raises WorkdirInUse naming the holder."""
    key = Path(folder).resolve()
    with _GUARD:
        if key in _HELD:
            _HELD[key].count += 1
            return ""
        _check_around(key)
        fd, taken_over = _take(key, command)
        _HELD[key] = _Held(fd, 1)
    return taken_over


def release(folder: str | Path) -> None:
    """Give one `acquire` of `folder` back; the last one removes the lock file and unlocks."""
    key = Path(folder).resolve()
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _HELD[key]
    if held.fd is not None:
        with contextlib.suppress(OSError):  # gone before unlocked: nothing left beside
            os.unlink(lock_file(key))  # the folder (a waiter re-checks the inode)
        with contextlib.suppress(OSError):
            os.ftruncate(held.fd, 0)
        os.close(held.fd)  # closing the last descriptor releases the flock


@contextlib.contextmanager
def workdir_lock(folder: str | Path, command: str = "") -> Iterator[None]:
    """Hold the lock of `folder` (a pipeline's workdir, a command's output folder) while the
    block runs; a lock taken over from a dead holder is said on stderr."""
    taken_over = acquire(folder, command)
    if taken_over:
        print(f"agentrl: {taken_over}", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        release(folder)


def data_repository(versioning) -> Path:
    """The versioned data folder of a preset's `data.versioning` (a VersioningConfig):
    `repo_root/data_dir`, the folder whose lock every writer of data takes."""
    return Path(versioning.repo_root) / versioning.data_dir


@contextlib.contextmanager
def data_repository_lock(versioning, command: str = "") -> Iterator[None]:
    """Hold the lock of the data repository of `versioning` (a VersioningConfig)."""
    with workdir_lock(data_repository(versioning), command):
        yield


@contextlib.contextmanager
def pipeline_locks(preset, command: str = "") -> Iterator[None]:
    """Hold what a pipeline run writes into: the preset's workdir and its data repository."""
    workdir = preset.section("pipeline").workdir
    versioning = preset.section("data").versioning
    with workdir_lock(workdir, command), data_repository_lock(versioning, command):
        yield


def release_all() -> None:
    """Give back every lock this process holds, records emptied (a signal handler about to
    `os._exit`: the kernel would drop the flocks but leave the records)."""
    with _GUARD:
        held = list(_HELD.values())
        _HELD.clear()
    for entry in held:
        if entry.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(entry.fd, 0)
            os.close(entry.fd)
