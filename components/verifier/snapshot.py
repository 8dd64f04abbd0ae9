"""The snapshot: one copy of the agent's final tree that every check starts from, and the
fresh trees the checks run in.

The final repository is copied once, before any verification process runs: regular files
and symlinks (as links) only. A FIFO, socket or device file is only listed (tampering.py
refuses it: it can only be there to break the copy); at most MAX_SNAPSHOT_FILES files and
MAX_SNAPSHOT_BYTES bytes are copied. Each check then gets a fresh tree (`build_tree`): the
original repository plus the snapshot's changes that are not tampering, so nothing a check
writes survives it.

Where the trees live (`work_area`): a fresh folder on a tmpfs of its own, sized for a
snapshot, one tree and what the code under test writes into it, where this process may
mount one. Nothing a verification writes then touches the host's temporary disk, and a
write refused there for want of room was refused because the agent's tree (or its code)
outgrew its share (`outgrew_share`): the agent's outcome, never an infrastructure failure.
Without mount privileges the share is only counted (MAX_SNAPSHOT_FILES/BYTES).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from components import shutdown
from components.sandbox.kernel import MNT_DETACH, MS_NODEV, MS_NOSUID, load_libc
from components.sandbox.workspace import can_mount
from components.tasks.task import Task

IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".git", ".mypy_cache"}
MAX_SNAPSHOT_FILES = 20_000
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
# A verification's own room: the snapshot, one tree at a time (a check's tree is removed
# before the next is built) and what the code under test may write into it.
WORK_AREA_BYTES = 2 * MAX_SNAPSHOT_BYTES + 64 * 1024 * 1024
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class SnapshotError(OSError):
    """The agent's repository is larger than its share (MAX_SNAPSHOT_FILES/BYTES)."""


@contextmanager
def work_area(prefix: str, quota_bytes: int | None = None) -> Iterator[tuple[Path, bool]]:
    """(a fresh, empty folder, whether it is a tmpfs of `quota_bytes` of its own, default
    WORK_AREA_BYTES): mounted where this process may mount, else a plain temporary folder
    on the host's disk."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    # Ctrl-C/SIGTERM (components/shutdown.py) unmounts and removes it if we do not
    on_stop = shutdown.remove_on_stop(root)
    options = f"size={quota_bytes or WORK_AREA_BYTES},mode=0700".encode()
    try:
        own = (
            can_mount()
            and load_libc().mount(
                b"tmpfs", os.fsencode(root), b"tmpfs", MS_NOSUID | MS_NODEV, options
            )
            == 0
        )
        try:
            yield root, own
        finally:
            if own:
                load_libc().umount2(os.fsencode(root), MNT_DETACH)  # drops the contents now
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutdown.forget(on_stop)


def outgrew_share(error: BaseException, own_quota: bool) -> bool:
    """Whether `error` says the agent's tree did not fit its share: a SnapshotError, or a
    write refused for want of room in a work area of its own (shutil.copytree gathers the
    errors of single files into one shutil.Error)."""
    if isinstance(error, SnapshotError):
        return True
    if not own_quota or not isinstance(error, OSError):
        return False
    if error.errno in _DISK_FULL:
        return True
    gathered = error.args[0] if isinstance(error, shutil.Error) and error.args else []
    return isinstance(gathered, list) and any(
        f"[Errno {code}]" in str(item) for item in gathered for code in _DISK_FULL
    )


@dataclass
class Snapshot:
    root: Path | None  # None: entries only, nothing copied
    # rel path -> (kind "file"|"link"|"special", sha256 of the bytes | link target | "")
    entries: dict[str, tuple[str, str]]
    modes: dict[str, int] = field(default_factory=dict)  # rel path -> st_mode (lstat)

    @property
    def digest(self) -> str:
        """The tree's hash, the verdict cache's key: every entry's path, kind, mode and
        content (bytes' hash or link target), each field length-prefixed, so no two trees
        share an encoding whatever their names hold (newlines, separators, non-UTF-8)."""
        h = hashlib.sha256(len(self.entries).to_bytes(8, "big"))
        for rel, (kind, digest) in sorted(self.entries.items()):
            mode = self.modes.get(rel, 0).to_bytes(8, "big")
            for part in (os.fsencode(rel), kind.encode(), mode, os.fsencode(digest)):
                h.update(len(part).to_bytes(8, "big") + part)
        return h.hexdigest()


def _scan(src: Path):
    """(rel path, kind, DirEntry) below src in sorted order; never follows a symlink."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(src / rel_dir if rel_dir else src) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.is_symlink():
                yield rel, "link", e
            elif e.is_dir(follow_symlinks=False):
                if e.name not in IGNORED_PARTS:
                    yield rel, "dir", e
                    stack.append(rel)
            elif e.is_file(follow_symlinks=False):
                if not e.name.endswith((".pyc", ".pyo")):
                    yield rel, "file", e
            else:
                yield rel, "special", e  # FIFO, socket, device


def take_snapshot(src: Path, dest: Path | None) -> Snapshot:
    """Copy src to dest once (regular files and links; special files are only listed) and
    describe every entry; dest None: describe only."""
    entries: dict[str, tuple[str, str]] = {}
    modes: dict[str, int] = {}
    files = size = 0
    if dest is not None:
        dest.mkdir(parents=True)
    for rel, kind, e in _scan(Path(src)):
        out = dest / rel if dest is not None else None
        if kind == "dir":
            if out is not None:
                out.mkdir()
            continue
        modes[rel] = e.stat(follow_symlinks=False).st_mode
        if kind == "link":
            target = os.readlink(e.path)
            entries[rel] = ("link", target)
            if out is not None:
                os.symlink(target, out)
            continue
        if kind == "special":
            entries[rel] = ("special", "")
            continue
        files += 1
        size += e.stat(follow_symlinks=False).st_size
        if files > MAX_SNAPSHOT_FILES or size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(
                f"more than {MAX_SNAPSHOT_FILES} files or {MAX_SNAPSHOT_BYTES} bytes"
            )
        fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        entries[rel] = ("file", hashlib.sha256(data).hexdigest())
        if out is not None:
            out.write_bytes(data)
    return Snapshot(dest, entries, modes)


def changed_paths(before: dict, after: dict) -> list[str]:
    """Entries (of two snapshots) added, removed or modified."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def changed_files(original: Path, final: Path) -> list[str]:
    """Relative paths added, removed or modified between two repo trees."""
    return changed_paths(take_snapshot(original, None).entries, take_snapshot(final, None).entries)


def build_tree(
    task: Task, snap: Snapshot, changed: list[str], tampered: set[str], dest: Path, *,
    hidden: bool,
) -> None:  # fmt: skip
    """Original repo + the snapshot's non-tampering changes (+ the hidden tests) in dest.
    A symlink the agent made is never followed: its path is absent from the tree."""
    shutil.copytree(task.repo_dir, dest, symlinks=True,
                    ignore=shutil.ignore_patterns(*IGNORED_PARTS, "*.pyc"))  # fmt: skip
    for rel in changed:
        if rel in tampered:
            continue
        dst = dest / rel
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.is_dir() and snap.entries.get(rel, ("gone",))[0] == "file":
            shutil.rmtree(dst)  # a folder of the original that the agent made a file
        if snap.entries.get(rel, ("gone",))[0] != "file":
            continue  # deleted by the agent, or a symlink
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(snap.root / rel, dst)
    if hidden:
        for rel in task.hidden_test_files():
            dst = dest / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_symlink():
                dst.unlink()
            shutil.copyfile(task.hidden_tests_dir / rel, dst)
