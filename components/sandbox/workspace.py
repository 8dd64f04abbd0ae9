"""The per-episode copy of a task repository the agent works in (`Workspace`), and how its
file tools reach into it: `Workspace.resolve` confines a path to the copy and refuses a
file with more than one name (a hard link), `read_regular` opens only regular files
(never blocks on a FIFO or device)."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import tempfile
from pathlib import Path

from components import shutdown
from components.runtime import refuse_if_stopping
from components.sandbox.kernel import MNT_DETACH, MS_NODEV, MS_NOSUID, load_libc
from components.sandbox.process import forget_stopped

# Folders that tools create on their own (caches): a workspace does not copy them, and
# the agent's tools skip them.
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"})
# Bytes a workspace may hold (files and folders together): a size-capped tmpfs is mounted
# on it where we may mount (root), so a command that fills it gets ENOSPC in its own
# workspace while the host's disk, other workspaces and the verifier's trees are untouched.
WORKSPACE_QUOTA_BYTES = 256 * 1024 * 1024


class PathEscapeError(ValueError):
    """A path given by the agent points outside its workspace, writes through a symlink,
    or names a file with more than one hard link."""


class NotRegularFileError(OSError):
    """A path names a FIFO, socket or device: the tools never open one (it could block)."""


def read_regular(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file, opened without blocking and checked after the open (a
    FIFO, socket or device raises NotRegularFileError, never blocks); at most max_bytes
    (more raises OSError EFBIG)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


class Workspace:
    """A per-episode copy of a task repository in a fresh temp folder."""

    def __init__(self, root: Path, source: Path | None = None, *, mounted: bool = False) -> None:
        self.root = root.resolve()
        self.source = source
        self.mounted = mounted  # a size-capped tmpfs of its own (WORKSPACE_QUOTA_BYTES)
        self._reported_links: set[str] = set()
        self._on_stop: int | None = None  # its removal, should a signal stop the command

    @classmethod
    def create(
        cls, src_dir: str | Path, parent: str | Path | None = None,
        quota_bytes: int | None = None,
    ) -> Workspace:  # fmt: skip
        """A copy of src_dir in a fresh folder, on a tmpfs of quota_bytes (default
        WORKSPACE_QUOTA_BYTES) where this process may mount one (else no quota)."""
        src = Path(src_dir).resolve()
        if not src.is_dir():
            raise FileNotFoundError(f"workspace source is not a folder: {src}")
        refuse_if_stopping("a sandbox workspace")  # Ctrl-C: no new folder in the run's tmp
        root = Path(tempfile.mkdtemp(prefix="agentrl-ws-", dir=parent))
        # Ctrl-C/SIGTERM (components/shutdown.py) unmounts and removes it if we do not
        on_stop = shutdown.remove_on_stop(root)
        quota = WORKSPACE_QUOTA_BYTES if quota_bytes is None else quota_bytes
        mounted = _mount_quota(root, quota)
        try:
            # symlinks=True: copy links as links; following them could copy host files in.
            shutil.copytree(
                src,
                root,
                symlinks=True,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(*IGNORED_NAMES),
            )
        except BaseException:
            _remove_root(root, mounted)
            shutdown.forget(on_stop)
            raise
        ws = cls(root, source=src, mounted=mounted)
        ws._on_stop = on_stop
        ws.new_escaping_links()  # the task's own links are not the agent's doing
        return ws

    def resolve(self, rel_path: str, for_write: bool = False) -> Path:
        """The absolute path for `rel_path` inside the workspace, or PathEscapeError.

        Absolute paths, `~`, `..` that leaves the workspace and symlinks that point outside
        are refused; with for_write, so is a symlink as the final component (even one that
        points inside: writes go to real files only). So is a file with more than one hard
        link, read or written: a second name of a test file would be a way round the guards
        that judge a path by its name.
        """
        if not isinstance(rel_path, str) or "\x00" in rel_path:
            raise PathEscapeError(f"invalid path {rel_path!r}")
        try:
            os.fsencode(rel_path)
        except UnicodeError:  # a lone surrogate no file name can hold
            raise PathEscapeError(f"invalid path {rel_path!r}") from None
        if rel_path.startswith(("/", "~")):
            raise PathEscapeError(
                f"path {rel_path!r} is absolute; use a path relative to the repository root"
            )
        candidate = self.root / (rel_path or ".")
        try:
            resolved = candidate.resolve()
        except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError up to 3.12)
            raise PathEscapeError(f"path {rel_path!r} cannot be resolved: {e}") from None
        if resolved != self.root and self.root not in resolved.parents:
            what = "symlink" if _has_symlink(self.root, rel_path) else "path"
            raise PathEscapeError(f"{what} {rel_path!r} escapes the workspace")
        if for_write:
            if candidate.is_symlink():
                raise PathEscapeError(f"refusing to write through symlink {rel_path!r}")
            if resolved == self.root:
                raise PathEscapeError("cannot write to the repository root itself")
        links = _hard_links(resolved)
        if links > 1:
            raise PathEscapeError(
                f"refusing {rel_path!r}: the file has {links} hard links (other names)"
            )
        return resolved

    def new_escaping_links(self) -> list[str]:
        """Links a command made around the workspace's guards, each reported once: symlinks
        that resolve outside it (a way out) and files with more than one hard link (a second
        name, e.g. of a test file). The tools refuse both and the verifier never follows
        them; making one is recorded all the same."""
        found = []
        root = str(self.root)
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in IGNORED_NAMES]
            for name in filenames + dirnames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:  # gone since the walk listed it
                    continue
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(path)
                    around = target != root and not target.startswith(root + "/")
                else:
                    around = stat.S_ISREG(st.st_mode) and st.st_nlink > 1
                rel = os.path.relpath(path, root)
                if around and rel not in self._reported_links:
                    self._reported_links.add(rel)
                    found.append(rel)
        return sorted(found)

    def cleanup(self) -> None:
        _remove_root(self.root, self.mounted)
        self.mounted = False
        forget_stopped(self.root)  # a stopped episode's refusal ends with its folder
        if self._on_stop is not None:
            shutdown.forget(self._on_stop)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _mount_quota(root: Path, quota_bytes: int) -> bool:
    """Mount a tmpfs of quota_bytes on root (an empty folder); False where we may not."""
    if not can_mount():
        return False
    options = f"size={quota_bytes},mode=0700".encode()
    return load_libc().mount(b"tmpfs", os.fsencode(root), b"tmpfs", MS_NOSUID | MS_NODEV,
                         options) == 0  # fmt: skip


def _remove_root(root: Path, mounted: bool) -> None:
    if mounted:
        load_libc().umount2(os.fsencode(root), MNT_DETACH)  # drops the contents at once
    shutil.rmtree(root, ignore_errors=True)


@functools.cache
def can_mount() -> bool:
    """Whether this process may mount a tmpfs (tried once on a throwaway folder)."""
    if os.geteuid() != 0:
        return False
    try:
        libc = load_libc()
    except OSError:
        return False
    probe = tempfile.mkdtemp(prefix="agentrl-mount-probe-")
    try:
        if libc.mount(b"tmpfs", os.fsencode(probe), b"tmpfs", 0, b"size=4096") != 0:
            return False
        libc.umount2(os.fsencode(probe), MNT_DETACH)
        return True
    finally:
        os.rmdir(probe)


def _hard_links(path: Path) -> int:
    """How many names the regular file at path has (0: none there, or not a file)."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_nlink if stat.S_ISREG(st.st_mode) else 0


def _has_symlink(root: Path, rel_path: str) -> bool:
    p = root
    for part in Path(rel_path).parts:
        p = p / part
        if p.is_symlink():
            return True
    return False
