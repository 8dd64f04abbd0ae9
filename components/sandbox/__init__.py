"""Per-episode workspaces and a sandbox for the commands an agent runs in them.

`Workspace` is a private copy of a task repository in a fresh temp folder; the agent's file
tools go through `Workspace.resolve`, which confines paths to that folder. `run_sandboxed`
runs one allow-listed program (an argv list, never a shell) inside the workspace under hard
limits and returns a `CommandResult`. `isolation_report()` says what is active on this machine.

What is protected against (isolation "bwrap", the default wherever bubblewrap works):
  * runaway time: wall clock (the whole process group, cgroup and pid namespace are killed)
    and CPU time (RLIMIT_CPU: SIGXCPU, then SIGKILL one second later);
  * memory bombs: RLIMIT_AS per process (Python sees MemoryError) plus a memory cgroup for
    the whole process tree (the kernel OOM-kills inside the sandbox only);
  * fork bombs: a pids cgroup caps processes+threads of the whole tree; RLIMIT_NPROC is the
    fallback when we are not root (the kernel ignores RLIMIT_NPROC for root);
  * output floods: stdout+stderr are read merged, at most max_output_bytes are kept (head
    and tail, with a visible "[... output truncated: N bytes omitted ...]" line), and a
    command that keeps writing past max(16x that budget, 8 MiB) is killed;
  * huge files and full disks: RLIMIT_FSIZE per file; the private /tmp is a size-capped
    tmpfs; the workspace a size-capped tmpfs of its own (as root, see below);
  * network: a fresh network namespace (only its own loopback, with no listeners); every
    attempt to send a packet or open a connection is counted from the namespace's own
    counters after the command (`CommandResult.network_attempts`), whatever program or
    spelling made it;
  * the filesystem: the command sees only the system (/usr, /etc, the /bin and /lib links),
    the interpreter's folders (and a task environment's, `python_env`, first on PATH), a
    private /tmp and its own workspace, all read-only except
    the workspace and /tmp (`readonly` paths inside the workspace are read-only too). The
    task store, other workspaces, the checkout and the user's home are not there at all;
    /etc/shadow, /etc/gshadow and `SandboxConfig.hide_paths` inside the visible part are
    masked; /proc/sys is read-only;
  * privileges: every capability is dropped (bwrap keeps them for root by default), with
    no_new_privs, and separate pid/ipc/uts/cgroup namespaces (host processes are invisible);
  * channels out of the run (nothing a command leaves in a kernel object reaches a later
    run or the host; tests/sandbox/test_sandbox_channels.py, one test per channel): the kernel
    keyring, which no namespace separates for uid 0, by a seccomp filter (a process that
    calls add_key, request_key or keyctl, or any call of another ABI, is killed by SIGSYS,
    in every isolation mode; `kernel_call_refused` tells the tools and the verifier, which
    record it); SysV shared memory, semaphores, message queues and POSIX queues by the
    private IPC namespace; abstract unix sockets and the loopback by the private network
    namespace; /dev and /dev/shm by bwrap's own /dev; /tmp by the private tmpfs;
  * secrets in the environment: the environment is rebuilt from a short allow-list;
  * leftovers: every process of the command is killed when it returns, also on exceptions;
    cgroups are removed.

What is NOT protected against:
  * reading world-readable system files (/etc/passwd, /usr): the interpreter needs them;
  * disk usage of the workspace where this process may not mount (not root): the workspace
    is then a plain folder with no quota; as root it is a tmpfs of WORKSPACE_QUOTA_BYTES
    (`Workspace.create`), so filling it fails inside it and nowhere else;
  * kernel exploits and timing side channels (the seccomp filter refuses the keyring calls
    only; the sandboxed process is uid 0 without capabilities, since dropping to another
    uid breaks an interpreter under /root): CPU, cache and memory pressure of one run can
    be felt by another that runs at the same time, a bandwidth of bits, not of files;
  * channels left when a setting opens them: with `network=True` the host's network
    namespace (its abstract unix sockets and loopback listeners) is shared;
  * CPU contention with other work (no cpu shares are set);
  * a command that hides its network attempts by killing the small shell that reads the
    namespace's counters after it (same pid namespace): the attempt still fails, but is
    not counted.

Fallbacks, chosen by isolation="auto" (or forced by the config):
  * "namespace" (no usable bwrap, but unshare works): the command gets new network, IPC
    and mount namespaces via unshare in the child (network attempts are counted as above),
    a private /dev/shm and the seccomp filter; limits and cgroups as above; NO filesystem
    isolation otherwise (writes outside the workspace are possible, bounded by
    RLIMIT_FSIZE, /tmp is the host's and so a channel between runs, and the task store is
    readable; so is a task environment writable) and host processes are visible.
  * "none": rlimits, cgroups and the seccomp filter only; no network, IPC or filesystem
    isolation, no network counting. The safety monitor (components/env/safety.py) still blocks network tools and
    writes outside the workspace at the action level, but a Python program can get around
    it. Use for development only.
  * without writable cgroup v1 controllers (or on cgroup v2 only, not supported yet):
    RLIMIT_AS replaces the memory cgroup, and processes are limited by RLIMIT_NPROC only when
    not root; as root a fork bomb is then bounded by the wall clock alone (with bwrap, the
    pid namespace is torn down at the deadline).

Performance: the hot path imports nothing heavy and starts three extra processes (bwrap,
and inside it a shell that runs the command and then `cat`s the network counters).
Availability probes run once per process.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import filecmp
import functools
import itertools
import os
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from components.runtime import refuse_if_stopping

DEFAULT_ALLOWED_PROGRAMS: tuple[str, ...] = (
    "python",
    "python3",
    "pytest",
    "ls",
    "cat",
    "head",
    "tail",
    "grep",
    "wc",
    "diff",
    "find",
    "echo",
    "pwd",
    "ruff",
    "true",
    "sort",
    "uniq",
)
ISOLATION_MODES = ("auto", "bwrap", "namespace", "none")
LIMIT_KINDS = ("wall_time", "cpu_time", "memory", "processes", "output")
# Folders that tools create on their own (caches); never reported as changes by the agent.
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"})
# A command that writes more than this many times its output budget (and at least
# OUTPUT_DRAIN_MIN bytes) is killed: reading and discarding an endless stream would only
# burn the host's CPU.
OUTPUT_DRAIN_FACTOR = 16
OUTPUT_DRAIN_MIN = 8 * 1024 * 1024
_CGROUP_V1 = Path("/sys/fs/cgroup")
# Bytes a workspace may hold (files and folders together): a size-capped tmpfs is mounted
# on it where we may mount (root), so a command that fills it gets ENOSPC in its own
# workspace while the host's disk, other workspaces and the verifier's trees are untouched.
WORKSPACE_QUOTA_BYTES = 256 * 1024 * 1024
_MNT_DETACH = 2
# The host as a sandboxed command sees it (read-only): the system's programs, libraries and
# configuration. The interpreter's folders, a private /tmp and the workspace are added;
# nothing else of the host is there (no task store, no other workspace, no home).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_MASKED_FILES = ("/etc/shadow", "/etc/gshadow")
# Runs the command with the namespace's counter pipe closed (stdin is /dev/null for it),
# then writes the namespace's IP counters to that pipe (our stdin, opened for writing).
_NET_COUNTING_SHELL = (
    "/bin/sh",
    "-c",
    '"$@" </dev/null; s=$?; cat /proc/net/snmp /proc/net/snmp6 >&0 2>/dev/null; exit $s',
    "sh",
)
# (table, counter) pairs that move only when something tries to reach a network.
_ATTEMPT_COUNTERS = frozenset({
    ("Ip", "OutRequests"), ("Ip", "OutNoRoutes"), ("Tcp", "ActiveOpens"),
    ("Udp", "OutDatagrams"), ("UdpLite", "OutDatagrams"), ("Ip6", "OutRequests"),
    ("Ip6", "OutNoRoutes"), ("Udp6", "OutDatagrams"), ("UdpLite6", "OutDatagrams"),
})  # fmt: skip
_COUNTER_BYTES_MAX = 1 << 16
_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 0x40000, 0x2, 0x4
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
# The kernel keyring is not namespaced (uid 0's keyrings are the same in every sandbox and
# on the host): a seccomp filter makes add_key, request_key and keyctl fail with EPERM.
# (audit arch, (add_key, request_key, keyctl)) per machine.
_KEYRING_SYSCALLS = {
    "x86_64": (0xC000003E, (248, 249, 250)),
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI numbers: refused as a whole


class SandboxError(RuntimeError):
    """A command was refused or could not be started (the message says why)."""


class PathEscapeError(ValueError):
    """A path given by the agent points outside its workspace (or writes through a symlink)."""


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


@dataclass(frozen=True)
class SandboxConfig:
    wall_time_s: float = field(
        default=60.0, metadata={"help": "wall-clock limit per command, seconds"}
    )
    cpu_time_s: int = field(
        default=60, metadata={"help": "CPU-time limit per process (RLIMIT_CPU), seconds"}
    )
    memory_mb: int = field(
        default=1024,
        metadata={"help": "address-space limit per process and memory cgroup limit, MiB"},
    )
    max_processes: int = field(
        default=64, metadata={"help": "processes+threads of one command (pids cgroup)"}
    )
    max_output_bytes: int = field(
        default=16_384, metadata={"help": "bytes of merged stdout+stderr kept (head and tail)"}
    )
    max_file_bytes: int = field(
        default=16 * 1024 * 1024, metadata={"help": "largest file a command may write"}
    )
    network: bool = field(
        default=False, metadata={"help": "allow network access (off: empty net namespace)"}
    )
    isolation: str = field(
        default="auto",
        metadata={"help": "auto | bwrap | namespace | none (auto picks the strongest working)"},
    )
    allowed_programs: tuple[str, ...] = field(
        default=DEFAULT_ALLOWED_PROGRAMS,
        metadata={"help": "program basenames a command may start"},
    )
    hide_paths: tuple[str, ...] = field(
        default=(),
        metadata={"help": "extra host paths masked inside the sandbox (bwrap), e.g. task dirs"},
    )
    python_env: str = field(
        default="",
        metadata={"help": "prefix of the environment whose python commands run with, mounted "
                  "read-only ('' = the project's interpreter); set per task from its "
                  "environment (components/tasks/environments.py)"},
    )  # fmt: skip
    environments_dir: str = field(
        default="~/.cache/agentrl/environments",
        metadata={"help": "where `agentrl tasks prepare` builds task environments and "
                  "episodes and the verifier find them"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.wall_time_s, int | float) or not self.wall_time_s > 0:
            problems.append(f"wall_time_s must be a positive number, got {self.wall_time_s!r}")
        for name in ("cpu_time_s", "memory_mb", "max_processes", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.max_file_bytes, bool) or not isinstance(self.max_file_bytes, int):
            problems.append(f"max_file_bytes must be an integer, got {self.max_file_bytes!r}")
        elif self.max_file_bytes < 1024:
            problems.append(f"max_file_bytes must be >= 1024, got {self.max_file_bytes}")
        if isinstance(self.memory_mb, int) and 0 < self.memory_mb < 32:
            problems.append("memory_mb must be >= 32 (an interpreter needs that much)")
        if isinstance(self.max_processes, int) and 0 < self.max_processes < 4:
            problems.append("max_processes must be >= 4 (bwrap itself uses two)")
        if isinstance(self.max_output_bytes, int) and 0 < self.max_output_bytes < 256:
            problems.append("max_output_bytes must be >= 256")
        if not isinstance(self.network, bool):
            problems.append(f"network must be a bool, got {self.network!r}")
        if self.isolation not in ISOLATION_MODES:
            problems.append(f"isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        for name in ("allowed_programs", "hide_paths"):
            value = getattr(self, name)
            if not (isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)):
                problems.append(f"{name} must be a tuple of non-empty strings")
        if isinstance(self.allowed_programs, tuple) and any(
            "/" in p for p in self.allowed_programs
        ):
            problems.append("allowed_programs holds basenames, not paths")
        if isinstance(self.hide_paths, tuple) and any(
            not p.startswith("/") for p in self.hide_paths
        ):
            problems.append("hide_paths must be absolute paths")
        if not isinstance(self.python_env, str) or (
            self.python_env and not self.python_env.startswith("/")
        ):
            problems.append(f"python_env must be '' or an absolute path, got {self.python_env!r}")
        if not isinstance(self.environments_dir, str):
            problems.append("environments_dir must be a string")
        if problems:
            raise ValueError("invalid SandboxConfig: " + "; ".join(problems))


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int  # the program's exit status; 128+N when killed by signal N (shell style)
    output: str  # merged stdout+stderr, capped (see `truncated`)
    truncated: bool
    timed_out: bool
    limit_hit: str | None  # None | "wall_time" | "cpu_time" | "memory" | "processes" | "output"
    wall_s: float
    isolation: str  # the mode actually used: "bwrap" | "namespace" | "none"
    # Packets sent or connections opened inside the command's network namespace (its own
    # counters, read after the command): any attempt to reach a network, by any program.
    # 0 when unknown (isolation "none", network allowed, or the command was killed).
    network_attempts: int = 0


# --------------------------------------------------------------------------- output capping


class OutputBuffer:
    """Keeps the first and last bytes of a stream within a byte budget, counting the rest."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.head_limit = max_bytes // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            # Trim lazily (at 2x) so a stream of small chunks is not quadratic.
            if len(self.tail) > 2 * self.max_bytes:
                del self.tail[: len(self.tail) - self.max_bytes]

    def getvalue(self) -> tuple[bytes, bool]:
        """(kept bytes with a truncation line where bytes were dropped, truncated?)"""
        if self.total <= self.max_bytes:
            return bytes(self.head + self.tail), False
        # Reserve room for the marker so the result stays within max_bytes.
        marker_len = len(_marker(self.total))
        tail_keep = max(0, self.max_bytes - len(self.head) - marker_len)
        tail = self.tail[len(self.tail) - tail_keep :] if tail_keep else b""
        omitted = self.total - len(self.head) - len(tail)
        return bytes(self.head) + _marker(omitted) + bytes(tail), True


def _marker(omitted: int) -> bytes:
    return f"\n[... output truncated: {omitted} bytes omitted ...]\n".encode()


def encodable(text: str) -> str:
    """`text` with every lone surrogate (a non-UTF-8 file name) as "?": what an
    observation must be for a tokenizer (or any UTF-8 writer) to take it."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cap `text` at max_bytes of UTF-8 (head and tail kept, marker in between). A lone
    surrogate (a non-UTF-8 file name) becomes "?": the text must encode for a tokenizer."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8"), False
    buf = OutputBuffer(max_bytes)
    buf.feed(data)
    kept, _ = buf.getvalue()
    return kept.decode("utf-8", errors="replace"), True


# --------------------------------------------------------------------------- workspace


class Workspace:
    """A per-episode copy of a task repository in a fresh temp folder."""

    def __init__(self, root: Path, source: Path | None = None, *, mounted: bool = False) -> None:
        self.root = root.resolve()
        self.source = source
        self.mounted = mounted  # a size-capped tmpfs of its own (WORKSPACE_QUOTA_BYTES)
        self._reported_links: set[str] = set()

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
            raise
        ws = cls(root, source=src, mounted=mounted)
        ws.new_escaping_links()  # the task's own links are not the agent's doing
        return ws

    def resolve(self, rel_path: str, for_write: bool = False) -> Path:
        """The absolute path for `rel_path` inside the workspace, or PathEscapeError.

        Absolute paths, `~`, `..` that leaves the workspace and symlinks that point outside
        are refused; with for_write, so is a symlink as the final component (even one that
        points inside: writes go to real files only).
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
        return resolved

    def new_escaping_links(self) -> list[str]:
        """Symlinks in the workspace that resolve outside it, each reported once: a command
        made a way out (reading or writing through it is refused, and the verifier never
        follows it; making it is recorded all the same)."""
        found = []
        root = str(self.root)
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in IGNORED_NAMES]
            for name in filenames + dirnames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    continue
                target = os.path.realpath(path)
                rel = os.path.relpath(path, root)
                inside = target == root or target.startswith(root + "/")
                if not inside and rel not in self._reported_links:
                    self._reported_links.add(rel)
                    found.append(rel)
        return sorted(found)

    def changed_files(self, original_dir: str | Path | None = None) -> list[str]:
        """Relative paths added, removed or modified compared with original_dir (sorted)."""
        original = self._original(original_dir)
        before, after = _tree(original), _tree(self.root)
        changed = []
        for rel in sorted(before.keys() | after.keys()):
            a, b = before.get(rel), after.get(rel)
            if a is None or b is None or not _same_entry(original / rel, self.root / rel):
                changed.append(rel)
        return changed

    def diff(self, original_dir: str | Path | None = None) -> str:
        """A unified diff (a/ and b/ prefixes, git style) from original_dir to the workspace."""
        original = self._original(original_dir)
        parts = []
        for rel in self.changed_files(original):
            parts.append(_file_diff(rel, original / rel, self.root / rel))
        return "".join(parts)

    def cleanup(self) -> None:
        _remove_root(self.root, self.mounted)
        self.mounted = False

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _original(self, original_dir: str | Path | None) -> Path:
        if original_dir is None:
            if self.source is None:
                raise ValueError("no original_dir given and the workspace has no source")
            return self.source
        return Path(original_dir)


def _mount_quota(root: Path, quota_bytes: int) -> bool:
    """Mount a tmpfs of quota_bytes on root (an empty folder); False where we may not."""
    if not _can_mount():
        return False
    options = f"size={quota_bytes},mode=0700".encode()
    return _libc().mount(b"tmpfs", os.fsencode(root), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                         options) == 0  # fmt: skip


def _remove_root(root: Path, mounted: bool) -> None:
    if mounted:
        _libc().umount2(os.fsencode(root), _MNT_DETACH)  # drops the contents at once
    shutil.rmtree(root, ignore_errors=True)


@functools.cache
def _can_mount() -> bool:
    """Whether this process may mount a tmpfs (tried once on a throwaway folder)."""
    if os.geteuid() != 0:
        return False
    try:
        libc = _libc()
    except OSError:
        return False
    probe = tempfile.mkdtemp(prefix="agentrl-mount-probe-")
    try:
        if libc.mount(b"tmpfs", os.fsencode(probe), b"tmpfs", 0, b"size=4096") != 0:
            return False
        libc.umount2(os.fsencode(probe), _MNT_DETACH)
        return True
    finally:
        os.rmdir(probe)


def _has_symlink(root: Path, rel_path: str) -> bool:
    p = root
    for part in Path(rel_path).parts:
        p = p / part
        if p.is_symlink():
            return True
    return False


def _tree(base: Path) -> dict[str, str]:
    """rel path -> kind ("file" | "link") for every file and symlink below base."""
    entries: dict[str, str] = {}
    if not base.is_dir():
        return entries
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_NAMES]
        rel_dir = os.path.relpath(dirpath, base)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if name.endswith(".pyc"):
                continue
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            entries[rel] = "link" if os.path.islink(os.path.join(dirpath, name)) else "file"
    return entries


def _same_entry(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    return filecmp.cmp(a, b, shallow=False)


def _read_for_diff(path: Path) -> list[str] | None:
    """Lines of a text file ([] when absent); None for binary content or symlinks."""
    if path.is_symlink():
        return None
    if not path.exists():
        return []
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _file_diff(rel: str, old: Path, new: Path) -> str:
    old_lines, new_lines = _read_for_diff(old), _read_for_diff(new)
    from_name = f"a/{rel}" if old.exists() or old.is_symlink() else "/dev/null"
    to_name = f"b/{rel}" if new.exists() or new.is_symlink() else "/dev/null"
    if old_lines is None or new_lines is None:
        return f"Binary files {from_name} and {to_name} differ\n"
    out = []
    for line in difflib.unified_diff(old_lines, new_lines, from_name, to_name):
        if line.endswith("\n"):
            out.append(line)
        else:  # last line of a file without a trailing newline (patch(1) convention)
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


# --------------------------------------------------------------------------- probes


@functools.cache
def _bwrap_path() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    probe += ["--unshare-net", "--unshare-pid", "--die-with-parent", "--cap-drop", "ALL", "true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return path if ok else None


@functools.cache
def _netns_works() -> bool:
    """Whether the "namespace" fallback's unshare (network, IPC and mount namespaces)
    succeeds here (tried in a throwaway child)."""
    try:
        libc = _libc()
    except OSError:
        return False
    flags = _namespace_flags(network=False)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe work, then _exit
        os._exit(0 if libc.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@functools.cache
def seccomp_program() -> bytes:
    """The classic-BPF seccomp filter every sandboxed command runs under, as the packed
    `struct sock_filter` array bwrap's --seccomp reads: a keyring call (or any call of
    another ABI, where the numbers differ) kills the calling process; all else is allowed.
    b"" on a machine this table does not know (the keyring then stays a channel)."""
    import platform
    import struct

    known = _KEYRING_SYSCALLS.get(platform.machine())
    if known is None:
        return b""
    arch, calls = known
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    # SECCOMP_RET_ALLOW; SECCOMP_RET_KILL_PROCESS: the caller dies by SIGSYS, which
    # `kernel_call_refused` sees (an EPERM would contain the attempt but leave no record).
    allow, deny = 0x7FFF0000, 0x80000000
    n = 4 + len(calls)  # index of the final "allow"; "deny" follows it
    prog = [(ld_abs, 0, 0, 4), (jeq, 0, n - 1, arch), (ld_abs, 0, 0, 0),
            (jge, n - 3, 0, _X32_SYSCALL_BIT)]  # fmt: skip
    for i, nr in enumerate(calls):
        prog.append((jeq, n - 4 - i, 0, nr))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


@functools.cache
def _libc():
    import ctypes  # only the namespace fallback needs it

    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _cgroup_parents() -> dict[str, Path]:
    """controller -> our own cgroup v1 folder for "pids" and "memory", where we can mkdir."""
    parents: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return parents
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in ("pids", "memory"):
            if name not in controllers.split(","):
                continue
            folder = _CGROUP_V1 / name / path.lstrip("/")
            probe = folder / f"agentrl-probe-{os.getpid()}"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError:
                continue
            parents[name] = folder
    return parents


def resolve_isolation(mode: str) -> str:
    """The isolation a config's mode gives on this machine (raises if a forced mode can't)."""
    if mode == "auto":
        if _bwrap_path():
            return "bwrap"
        return "namespace" if _netns_works() else "none"
    if mode == "bwrap" and not _bwrap_path():
        raise SandboxError("isolation 'bwrap' requested but bubblewrap is missing or broken")
    if mode == "namespace" and not _netns_works():
        raise SandboxError("isolation 'namespace' requested but unshare(CLONE_NEWNET) fails")
    return mode


def isolation_report(config: SandboxConfig | None = None) -> dict[str, object]:
    """Which protections a config gets on this machine (for logs, docs and test skips)."""
    config = config or SandboxConfig()
    bwrap = _bwrap_path()
    cgroups = _cgroup_parents()
    root = os.geteuid() == 0
    try:
        mode = resolve_isolation(config.isolation)
    except SandboxError as e:
        mode = f"unavailable ({e})"
    if "pids" in cgroups:
        processes = "pids cgroup"
    else:
        processes = "RLIMIT_NPROC" if not root else "none (wall clock only)"
    memory = "RLIMIT_AS + memory cgroup" if "memory" in cgroups else "RLIMIT_AS"
    network = "isolated" if mode in ("bwrap", "namespace") and not config.network else "host"
    filesystem = "read-only host, private /tmp" if mode == "bwrap" else "host (not isolated)"
    return {
        "mode": mode,
        "bwrap": bwrap,
        "net_namespace_available": _netns_works(),
        "pids_cgroup": "pids" in cgroups,
        "memory_cgroup": "memory" in cgroups,
        "root": root,
        "process_limit": processes,
        "memory_limit": memory,
        "network": network,
        "filesystem": filesystem,
        "rlimits": ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE"],
        "summary": (
            f"isolation={mode}; network {network}; filesystem {filesystem}; "
            f"processes: {processes}; memory: {memory}"
        ),
    }


# --------------------------------------------------------------------------- running


_run_counter = itertools.count()
HARNESS_PLUGINS = Path(__file__).resolve().parent / "harness_plugins"


def sandbox_env(home: Path, python_env: str = "") -> dict[str, str]:
    """The whole environment a sandboxed command sees (nothing else from the host passes).
    With a task environment its bin/ comes first: `python` and `pytest` are the task's; the
    project's bin/ stays behind it for the other allowed tools (ruff)."""
    venv_bin = str(Path(sys.executable).parent)  # not resolved: keep the venv's own bin/
    first = f"{python_env}/bin:" if python_env else ""
    return {
        "PATH": f"{first}{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        # The host venv's pytest plugins (kmock, asyncio, ...) are ours, not the task's:
        # they slow every run and can break it. Tasks get plain pytest + pytest-timeout,
        # its limit counted in CPU time (harness_plugins/agentrl_cpu_timeout.py), so that
        # load decides no test's outcome. The folder holds that one module.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_PLUGINS": "pytest_timeout,agentrl_cpu_timeout",
        "PYTHONPATH": str(HARNESS_PLUGINS),
    }


def run_sandboxed(
    argv: list[str],
    cwd: Path,
    config: SandboxConfig,
    *,
    workspace: Path | None = None,
    readonly: tuple[str | Path, ...] = (),
    mounts: tuple[tuple[str, str, bool], ...] = (),
) -> CommandResult:
    """Run argv (no shell) in cwd under config's limits; `workspace` (default cwd) is the
    only writable host folder, except `readonly` paths inside it (bwrap only: elsewhere they
    stay writable). `mounts`: (folder inside the workspace, absolute path in the sandbox,
    writable) binds, e.g. Harbor's /app, /tests and /logs/verifier (bwrap only: refused
    elsewhere); with mounts, `cwd` may be one of the sandbox paths. Raises SandboxError when
    the command is refused."""
    refuse_if_stopping("a sandboxed process")  # Ctrl-C: nothing new while the run ends
    argv = list(argv)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise SandboxError("argv must be a non-empty list of strings")
    if any("\x00" in a for a in argv):
        raise SandboxError("argv must not contain NUL bytes")
    program = argv[0]
    if "/" in program:
        raise SandboxError(f"give the program by name, not by path: {program!r}")
    if program not in config.allowed_programs:
        allowed = ", ".join(config.allowed_programs)
        raise SandboxError(f"program {program!r} is not allowed (allowed: {allowed})")
    ws = Path(workspace).resolve() if workspace is not None else Path(cwd).resolve()
    inner_cwd = next((Path(host) for host, at, _ in mounts if Path(at) == Path(cwd)), None)
    if mounts and resolve_isolation(config.isolation) != "bwrap":
        raise SandboxError("mounts need bubblewrap isolation")
    for host, at, writable in mounts:
        if not at.startswith("/") or (writable and ws not in Path(host).resolve().parents):
            raise SandboxError(f"mount {at}: a writable mount's folder must lie in the workspace")
    sandbox_cwd = str(cwd) if inner_cwd is not None else None
    cwd = (inner_cwd or Path(cwd)).resolve()
    if not cwd.is_dir() or (cwd != ws and ws not in cwd.parents):
        raise SandboxError(f"cwd {cwd} is not a folder inside the workspace {ws}")
    env = sandbox_env(ws, config.python_env)
    if config.python_env and not os.path.exists(os.path.join(config.python_env, "bin", "python")):
        raise SandboxError(f"task environment {config.python_env} has no bin/python (not prepared)")
    if shutil.which(program, path=env["PATH"]) is None:
        raise SandboxError(f"program {program!r} is not installed on the sandbox PATH")
    mode = resolve_isolation(config.isolation)
    ro = [Path(p).resolve() for p in readonly]
    if any(ws not in p.parents for p in ro):
        raise SandboxError("readonly paths must lie inside the workspace")

    count_net = mode in ("bwrap", "namespace") and not config.network
    full_argv = [*_NET_COUNTING_SHELL, *argv] if count_net else argv
    if mode == "bwrap":
        full_argv = _bwrap_argv(config, ws, cwd, tuple(str(p) for p in ro), mounts) + full_argv
        if sandbox_cwd is not None:
            full_argv[full_argv.index("--chdir") + 1] = sandbox_cwd
    cgroups = _make_cgroups(config)
    try:
        return _run(argv, full_argv, cwd, env, config, mode, cgroups, count_net=count_net)
    finally:
        _remove_cgroups(cgroups)


def _bwrap_argv(
    config: SandboxConfig, ws: Path, cwd: Path, readonly: tuple[str, ...],
    mounts: tuple[tuple[str, str, bool], ...] = (),
) -> list[str]:  # fmt: skip
    view, visible = _system_view()
    args = [_bwrap_path() or "bwrap", *view, "--dev", "/dev", "--proc", "/proc"]
    # bwrap (0.8) leaves /proc/sys writable; uid 0 may write sysctls without capabilities.
    args += ["--ro-bind", "/proc/sys", "/proc/sys"]
    for secret in _MASKED_FILES:
        if os.path.exists(secret):
            args += ["--ro-bind", "/dev/null", secret]
    args += ["--size", str(4 * config.max_file_bytes), "--tmpfs", "/tmp"]
    # An interpreter or venv under /tmp (a checkout in a temporary folder, as CI's may be)
    # goes back over the private /tmp, or no command would find its python.
    for folder in visible:
        if _under(folder, ("/tmp",)):
            args += ["--ro-bind", folder, folder]
    masked: list[str] = []
    for hidden in config.hide_paths:
        if not _under(os.path.realpath(hidden), visible):
            continue  # not in the sandbox's view at all
        if os.path.isdir(hidden):
            args += ["--size", str(1 << 20), "--tmpfs", hidden]
            masked.append(hidden)
        elif os.path.lexists(hidden):
            args += ["--ro-bind", "/dev/null", hidden]
    # Put the interpreter back where a mask covered it.
    for needed in _interpreter_dirs():
        if _under(needed, tuple(masked)):
            args += ["--ro-bind", needed, needed]
    # A task environment and the interpreter it was made from: read-only, after the masks
    # (a mask over the cache must not hide them; nothing may make them writable).
    for needed in environment_dirs(config.python_env):
        args += ["--ro-bind", needed, needed]
    # The harness's own pytest plugin (sandbox_env's PYTHONPATH), read-only like the venv.
    args += ["--ro-bind", str(HARNESS_PLUGINS), str(HARNESS_PLUGINS)]
    args += ["--bind", str(ws), str(ws)]
    for path in readonly:
        args += ["--ro-bind", path, path]
    for host, at, writable in mounts:
        args += ["--bind" if writable else "--ro-bind", str(Path(host).resolve()), at]
    args += ["--remount-ro", "/"]  # the skeleton bwrap builds the view on
    if not config.network:
        args.append("--unshare-net")
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--chdir", str(cwd)]
    return args


def _under(path: str, folders: tuple[str, ...] | list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


@functools.cache
def _system_view() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(bwrap arguments that rebuild the visible host, the folders they make visible)."""
    args: list[str] = []
    visible: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            visible.append(path)
    # The venv as PATH names it (maybe through a symlink) and every folder it resolves to.
    for folder in (*_interpreter_dirs(), str(Path(sys.executable).parent.parent)):
        if not _under(folder, visible):
            args += ["--ro-bind", folder, folder]
            visible.append(folder)
    return tuple(args), tuple(visible)


def environment_dirs(python_env: str) -> tuple[str, ...]:
    """The folders a task environment needs visible: its prefix and the prefix of the
    interpreter it was made from (pyvenv.cfg's `home`); () for the project's own."""
    if not python_env:
        return ()
    dirs = [os.path.realpath(python_env)]
    with contextlib.suppress(OSError):
        for line in Path(python_env, "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip().startswith("/"):
                dirs.append(os.path.realpath(Path(value.strip()).parent))
    return tuple(dict.fromkeys(dirs))


@functools.cache
def _interpreter_dirs() -> tuple[str, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs.add(str(Path(os.path.realpath(sys.executable)).parent.parent))
    return tuple(sorted(os.path.realpath(d) for d in dirs))


def _make_cgroups(config: SandboxConfig) -> dict[str, Path]:
    made: dict[str, Path] = {}
    name = f"agentrl-sbx-{os.getpid()}-{next(_run_counter)}"
    try:
        for controller, parent in _cgroup_parents().items():
            folder = parent / name
            folder.mkdir()
            made[controller] = folder
            if controller == "pids":
                (folder / "pids.max").write_text(str(config.max_processes))
            else:
                limit = str(config.memory_mb * 1024 * 1024)
                (folder / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (folder / "memory.memsw.limit_in_bytes").write_text(limit)
    except OSError:
        _remove_cgroups(made)
        raise
    return made


def _cgroup_pids(cgroups: dict[str, Path]) -> set[int]:
    pids: set[int] = set()
    for folder in cgroups.values():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
    return pids


def _kill_cgroups(cgroups: dict[str, Path]) -> None:
    """SIGKILL everything in the cgroups until they are empty (forks race with us)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        pids = _cgroup_pids(cgroups)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # exiting tasks stay listed for a moment


def _remove_cgroups(cgroups: dict[str, Path]) -> None:
    if not cgroups:
        return
    _kill_cgroups(cgroups)
    for folder in cgroups.values():
        for _ in range(1000):  # exiting tasks leave the cgroup asynchronously (<= ~1 s)
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    break
                time.sleep(0.001)


def _read_counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _preexec(config: SandboxConfig, mode: str, cgroup_procs: list[str]):
    """Runs in the child between fork and exec: join cgroups, set rlimits, unshare."""
    as_bytes = config.memory_mb * 1024 * 1024
    fsize = config.max_file_bytes
    cpu = config.cpu_time_s
    nproc = config.max_processes if os.geteuid() != 0 and not cgroup_procs else None
    # bwrap installs the seccomp filter itself (--seccomp); the other modes do it here.
    fprog = _seccomp_fprog() if mode != "bwrap" else None
    libc = _libc() if mode == "namespace" or fprog is not None else None
    flags = _namespace_flags(config.network) if mode == "namespace" else 0
    shm_options = f"size={4 * config.max_file_bytes}".encode()

    def preexec() -> None:
        pid = str(os.getpid()).encode()
        for procs in cgroup_procs:  # first, so that everything after is accounted
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if flags:
            if libc.unshare(flags) != 0:
                raise OSError("unshare(CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWNS) failed")
            # A private /dev/shm: nothing written there outlives the command's namespace.
            if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0 or (
                os.path.isdir("/dev/shm")
                and libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                               shm_options) != 0
            ):  # fmt: skip
                raise OSError("a private /dev/shm could not be mounted")
        if fprog is not None and (
            libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0) != 0
        ):
            raise OSError("the seccomp filter could not be installed")

    return preexec


def kernel_call_refused(cmd: CommandResult) -> bool:
    """Whether the command died by the seccomp filter (SIGSYS): it called add_key, keyctl
    or request_key. A child that dies so under a parent that exits 0 is not seen."""
    return cmd.exit_code == 128 + signal.SIGSYS and bool(seccomp_program())


def _namespace_flags(network: bool) -> int:
    """The namespaces the "namespace" fallback makes (no network namespace when allowed)."""
    return _CLONE_NEWIPC | _CLONE_NEWNS | (0 if network else _CLONE_NEWNET)


@functools.cache
def _seccomp_fprog():
    """`struct sock_fprog` for prctl(PR_SET_SECCOMP), or None without a program. Built once,
    before any fork: the child only passes its address."""
    import ctypes

    program = seccomp_program()
    if not program:
        return None
    buf = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    fprog._buf = buf  # keep the instructions alive with the struct
    return ctypes.byref(fprog)


def _run(
    argv: list[str],
    full_argv: list[str],
    cwd: Path,
    env: dict[str, str],
    config: SandboxConfig,
    mode: str,
    cgroups: dict[str, Path],
    *,
    count_net: bool,
) -> CommandResult:
    start = time.monotonic()
    proc, counters_fd = _start(argv, full_argv, cwd, env, config, mode, cgroups, count_net)
    buf = OutputBuffer(config.max_output_bytes)
    fd = proc.stdout.fileno()
    # A pidfd tells us when the command exits even if a background child keeps the pipe
    # open; without one (old kernels) we poll the exit status every 50 ms.
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        killed_for = _pump(proc, fd, pidfd, buf, start + config.wall_time_s)
    finally:
        # Kill the group while the leader is unreaped, so its pgid cannot have been reused;
        # then whatever else is left in the cgroups (processes that left the group).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_cgroups(cgroups)
        returncode = proc.wait()
        _drain(fd, buf)
        proc.stdout.close()
        if pidfd is not None:
            os.close(pidfd)
        counters = _read_counters(counters_fd)
    wall_s = time.monotonic() - start

    exit_code = returncode if returncode >= 0 else 128 - returncode
    data, truncated = buf.getvalue()
    output = data.decode("utf-8", errors="replace")
    # Cgroup counters name the root cause (a fork bomb usually also runs into the clock).
    limit_hit = _limit_from_cgroups(cgroups) or killed_for or _limit_from_exit(exit_code, output)
    if limit_hit is None and truncated:
        limit_hit = "output"
    return CommandResult(
        argv=tuple(argv),
        exit_code=exit_code,
        output=output,
        truncated=truncated,
        timed_out=killed_for == "wall_time",
        limit_hit=limit_hit,
        wall_s=wall_s,
        isolation=mode,
        network_attempts=network_attempts(counters),
    )


def _pump(
    proc: subprocess.Popen, fd: int, pidfd: int | None, buf: OutputBuffer, deadline: float
) -> str | None:
    """Read the command's output until it exits; the limit it was stopped for, if any."""
    drain_cap = _drain_cap(buf.max_bytes)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    tick = None if pidfd is not None else 0.05
    pipe_open = True
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "wall_time"
        events = poller.poll((remaining if tick is None else min(remaining, tick)) * 1000)
        if pipe_open and any(efd == fd for efd, _ in events):
            chunk = os.read(fd, 65536)
            if chunk:
                buf.feed(chunk)
                if buf.total > drain_cap:
                    return "output"
                continue  # read until the pipe is empty before looking at the exit
            pipe_open = False
            poller.unregister(fd)
        if _exited(proc.pid):
            return None


def _start(
    argv: list[str],
    full_argv: list[str],
    cwd: Path,
    env: dict[str, str],
    config: SandboxConfig,
    mode: str,
    cgroups: dict[str, Path],
    count_net: bool,
) -> tuple[subprocess.Popen, int | None]:
    """The started process and the read end of its counter pipe (None: not counting).

    The counter pipe is the command's stdin opened for writing: the counting shell writes
    the namespace's counters to it after the command, which itself gets /dev/null."""
    procs_files = [str(folder / "cgroup.procs") for folder in cgroups.values()]
    read_end, write_end = os.pipe() if count_net else (None, None)
    pass_fds: tuple[int, ...] = ()
    if mode == "bwrap" and seccomp_program():
        # bwrap reads the filter from an fd to its end: a fresh pipe per command.
        filter_r, filter_w = os.pipe()
        os.write(filter_w, seccomp_program())
        os.close(filter_w)
        pass_fds = (filter_r,)
        full_argv = [full_argv[0], "--seccomp", str(filter_r), *full_argv[1:]]
    try:
        proc = subprocess.Popen(
            full_argv,
            pass_fds=pass_fds,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL if write_end is None else write_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: killpg reaches every descendant
            preexec_fn=_preexec(config, mode, procs_files),
            close_fds=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        if read_end is not None:
            os.close(read_end)
        raise SandboxError(f"could not start {argv[0]!r}: {e}") from e
    finally:
        if write_end is not None:
            os.close(write_end)
        for fd in pass_fds:
            os.close(fd)
    return proc, read_end


def _read_counters(fd: int | None) -> str:
    """What the counting shell wrote (every writer is dead by now; never blocks)."""
    if fd is None:
        return ""
    data = bytearray()
    try:
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while len(data) < _COUNTER_BYTES_MAX and (chunk := os.read(fd, 65536)):
                data += chunk
    finally:
        os.close(fd)
    return data.decode("ascii", errors="replace")


def network_attempts(counters: str) -> int:
    """Packets sent and connections opened, summed over the attempt counters of every
    /proc/net/snmp (header line + value line per table) and snmp6 ("Ip6OutRequests 3")
    block in `counters`. Extra blocks written by the command itself can only add."""
    total = 0
    lines = counters.splitlines()
    for head, values in zip(lines, lines[1:], strict=False):
        names, numbers = head.split(), values.split()
        if len(names) < 2 or not names[0].endswith(":") or names[0] != numbers[0]:
            continue
        table = names[0][:-1]
        for name, number in zip(names[1:], numbers[1:], strict=False):
            if (table, name) in _ATTEMPT_COUNTERS and number.isdigit():
                total += int(number)
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            m = re.match(r"^(Ip6|Udp6|UdpLite6)(\w+)$", parts[0])
            if m and (m.group(1), m.group(2)) in _ATTEMPT_COUNTERS:
                total += int(parts[1])
    return total


def _exited(pid: int) -> bool:
    """Whether the child exited, without reaping it (WNOWAIT keeps its pid reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _drain_cap(max_output_bytes: int) -> int:
    return max(OUTPUT_DRAIN_FACTOR * max_output_bytes, OUTPUT_DRAIN_MIN)


def _drain(fd: int, buf: OutputBuffer) -> None:
    """Read what is left in the pipe after every writer is dead (never blocks)."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            buf.feed(chunk)
            if buf.total > _drain_cap(buf.max_bytes):
                break


def _limit_from_cgroups(cgroups: dict[str, Path]) -> str | None:
    if "memory" in cgroups and _read_counter(cgroups["memory"] / "memory.oom_control", "oom_kill"):
        return "memory"
    if "pids" in cgroups and _read_counter(cgroups["pids"] / "pids.events", "max"):
        return "processes"
    return None


def _limit_from_exit(exit_code: int, output: str) -> str | None:
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu_time"
    # RLIMIT_AS makes Python raise MemoryError; an uncaught one ends the traceback.
    if exit_code != 0 and output.rstrip().endswith("MemoryError"):
        return "memory"
    return None
