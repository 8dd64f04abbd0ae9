"""Running one allow-listed program (an argv list, never a shell) in a workspace under the
sandbox's limits and isolation (`run_sandboxed`), its output captured and capped, every
process it started killed when it returns; the outcome is a `CommandResult`.

Performance: the hot path imports nothing heavy and starts three extra processes (bwrap,
and inside it a shell that runs the command and then `cat`s the network counters).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from components.runtime import refuse_if_stopping
from components.sandbox.bubblewrap import bwrap_argv
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.environ import sandbox_env
from components.sandbox.isolation import resolve_isolation
from components.sandbox.kernel import (
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER,
    load_libc,
    namespace_flags,
    seccomp_fprog,
    seccomp_program,
)
from components.sandbox.limits import (
    kill_cgroups,
    limit_from_cgroups,
    limit_from_exit,
    make_cgroups,
    remove_cgroups,
    rlimits,
)
from components.sandbox.network import NET_COUNTING_SHELL, network_attempts, read_counters
from components.sandbox.output import OutputBuffer

# A command that writes more than this many times its output budget (and at least
# OUTPUT_DRAIN_MIN bytes) is killed: reading and discarding an endless stream would only
# burn the host's CPU.
OUTPUT_DRAIN_FACTOR = 16
OUTPUT_DRAIN_MIN = 8 * 1024 * 1024


@dataclass(frozen=True)
class CommandResult:
    """What one sandboxed command did: its exit, its capped output, the limit it hit."""

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
    full_argv = [*NET_COUNTING_SHELL, *argv] if count_net else argv
    if mode == "bwrap":
        full_argv = bwrap_argv(config, ws, cwd, tuple(str(p) for p in ro), mounts) + full_argv
        if sandbox_cwd is not None:
            full_argv[full_argv.index("--chdir") + 1] = sandbox_cwd
    slot = _open_slot(ws, make_cgroups(config))
    try:
        return _run(argv, full_argv, cwd, env, config, mode, slot, count_net=count_net)
    finally:
        _close_slot(slot)
        remove_cgroups(slot.cgroups)


@dataclass
class _Slot:
    """A command running in a workspace: what `stop_commands_in`, from another thread,
    needs to kill it (its process group and cgroups)."""

    workspace: Path
    cgroups: dict[str, Path]
    proc: subprocess.Popen | None = None
    stopped: bool = False  # killed by stop_commands_in
    done: bool = False  # reaped, or about to be: its pid may no longer be its own


_SLOTS: dict[Path, list[_Slot]] = {}
_STOPPED: set[Path] = set()  # workspaces whose driver ended them: no new command there
_SLOTS_LOCK = threading.Lock()


def _open_slot(ws: Path, cgroups: dict[str, Path]) -> _Slot:
    with _SLOTS_LOCK:
        if ws in _STOPPED:
            remove_cgroups(cgroups)
            raise SandboxError(f"workspace {ws} was stopped by its driver: no new command")
        slot = _Slot(ws, cgroups)
        _SLOTS.setdefault(ws, []).append(slot)
    return slot


def _close_slot(slot: _Slot) -> None:
    with _SLOTS_LOCK:
        slots = _SLOTS.get(slot.workspace, [])
        if slot in slots:
            slots.remove(slot)
        if not slots:
            _SLOTS.pop(slot.workspace, None)


def _started(slot: _Slot, proc: subprocess.Popen) -> None:
    """Record the started process; one stopped while it started is killed at once."""
    with _SLOTS_LOCK:
        slot.proc = proc
        stopped = slot.stopped
    if stopped:
        _kill_slot(slot)


def _kill_slot(slot: _Slot) -> None:
    with _SLOTS_LOCK:  # the leader is unreaped until `done`: its pgid is still its own
        if slot.proc is not None and not slot.done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(slot.proc.pid, signal.SIGKILL)
    kill_cgroups(slot.cgroups)


def stop_commands_in(workspace: str | Path) -> int:
    """Kill every command running in `workspace` now (its process group and cgroups, from
    any thread) and refuse new ones there until `forget_stopped`: what a driver does when
    the thread that runs a command is past its deadline and cannot itself be killed (the
    rollout engine's step limit). The command returns at once as a wall_time limit hit.
    Returns how many commands were running."""
    ws = Path(workspace).resolve()
    with _SLOTS_LOCK:
        _STOPPED.add(ws)
        slots = list(_SLOTS.get(ws, ()))
        for slot in slots:
            slot.stopped = True
    for slot in slots:
        _kill_slot(slot)
    return len(slots)


def forget_stopped(workspace: str | Path) -> None:
    """The workspace is gone (Workspace.cleanup): a new one at its path may run commands."""
    with _SLOTS_LOCK:
        _STOPPED.discard(Path(workspace).resolve())


def kernel_call_refused(cmd: CommandResult) -> bool:
    """Whether the command died by the seccomp filter (SIGSYS): it made a call that
    `components.sandbox.kernel.REFUSED_CALLS` kills for (the kernel keyring, a new user
    namespace, io_uring, the page cache evicted or probed). A child that dies so under a
    parent that exits 0 is not seen."""
    return cmd.exit_code == 128 + signal.SIGSYS and bool(seccomp_program())


def _preexec(config: SandboxConfig, mode: str, cgroup_procs: list[str]):
    """Runs in the child between fork and exec: join cgroups, set rlimits, unshare."""
    limits = rlimits(config, in_cgroups=bool(cgroup_procs))
    # bwrap installs the seccomp filter itself (--seccomp); the other modes do it here.
    fprog = seccomp_fprog() if mode != "bwrap" else None
    libc = load_libc() if mode == "namespace" or fprog is not None else None
    flags = namespace_flags(config.network) if mode == "namespace" else 0
    shm_options = f"size={4 * config.max_file_bytes}".encode()

    def preexec() -> None:
        pid = str(os.getpid()).encode()
        for procs in cgroup_procs:  # first, so that everything after is accounted
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        for which, soft_hard in limits:
            resource.setrlimit(which, soft_hard)
        if flags:
            if libc.unshare(flags) != 0:
                raise OSError("unshare(CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWNS) failed")
            # A private /dev/shm: nothing written there outlives the command's namespace.
            if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0 or (
                os.path.isdir("/dev/shm")
                and libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV,
                               shm_options) != 0
            ):  # fmt: skip
                raise OSError("a private /dev/shm could not be mounted")
        if fprog is not None and (
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0) != 0
        ):
            raise OSError("the seccomp filter could not be installed")

    return preexec


def _run(
    argv: list[str],
    full_argv: list[str],
    cwd: Path,
    env: dict[str, str],
    config: SandboxConfig,
    mode: str,
    slot: _Slot,
    *,
    count_net: bool,
) -> CommandResult:
    start = time.monotonic()
    cgroups = slot.cgroups
    proc, counters_fd = _start(argv, full_argv, cwd, env, config, mode, cgroups, count_net)
    _started(slot, proc)
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
        with _SLOTS_LOCK:  # never while `stop_commands_in` kills it: then it is reaped
            slot.done = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        kill_cgroups(cgroups)
        returncode = proc.wait()
        _drain(fd, buf)
        proc.stdout.close()
        if pidfd is not None:
            os.close(pidfd)
        counters = read_counters(counters_fd)
    wall_s = time.monotonic() - start
    if slot.stopped:  # its driver's own time limit ended it (`stop_commands_in`)
        killed_for = killed_for or "wall_time"

    exit_code = returncode if returncode >= 0 else 128 - returncode
    data, truncated = buf.getvalue()
    output = data.decode("utf-8", errors="replace")
    # Cgroup counters name the root cause (a fork bomb usually also runs into the clock).
    limit_hit = limit_from_cgroups(cgroups) or killed_for or limit_from_exit(exit_code, output)
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
