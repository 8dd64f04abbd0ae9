"""The resource limits of one sandboxed command, and which one stopped it.

Per process: rlimits the child sets before exec (`rlimits`). For the whole process tree:
a cgroup v1 "pids" and "memory" folder per command (`make_cgroups`), where this process
may make them (`cgroup_parents`); everything left in them is killed when the command
returns (`remove_cgroups`). `limit_from_cgroups` and `limit_from_exit` name the limit a
command ran into."""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import resource
import signal
import time
from pathlib import Path

from components.sandbox.config import SandboxConfig

_CGROUP_V1 = Path("/sys/fs/cgroup")
_run_counter = itertools.count()


def rlimits(config: SandboxConfig, in_cgroups: bool) -> list[tuple[int, tuple[int, int]]]:
    """(resource, (soft, hard)) for each rlimit a command's process gets, in the order the
    child sets them: CPU seconds (SIGXCPU, one second later SIGKILL), address space, file
    size, no core files, and processes where no cgroup counts them and we are not root (the
    kernel ignores RLIMIT_NPROC for root)."""
    as_bytes = config.memory_mb * 1024 * 1024
    fsize = config.max_file_bytes
    cpu = config.cpu_time_s
    limits = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (as_bytes, as_bytes)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if os.geteuid() != 0 and not in_cgroups:
        nproc = config.max_processes
        limits.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    return limits


@functools.cache
def cgroup_parents() -> dict[str, Path]:
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


def make_cgroups(config: SandboxConfig) -> dict[str, Path]:
    """controller -> a fresh cgroup for one command, its limit written (none where
    `cgroup_parents` found no controller we may use)."""
    made: dict[str, Path] = {}
    name = f"agentrl-sbx-{os.getpid()}-{next(_run_counter)}"
    try:
        for controller, parent in cgroup_parents().items():
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
        remove_cgroups(made)
        raise
    return made


def _cgroup_pids(cgroups: dict[str, Path]) -> set[int]:
    pids: set[int] = set()
    for folder in cgroups.values():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
    return pids


def kill_cgroups(cgroups: dict[str, Path]) -> None:
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


def remove_cgroups(cgroups: dict[str, Path]) -> None:
    """Kill what is left in the cgroups, then remove them."""
    if not cgroups:
        return
    kill_cgroups(cgroups)
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


def limit_from_cgroups(cgroups: dict[str, Path]) -> str | None:
    """The limit the cgroups saw hit: an OOM kill ("memory") or a refused fork ("processes")."""
    if "memory" in cgroups and _read_counter(cgroups["memory"] / "memory.oom_control", "oom_kill"):
        return "memory"
    if "pids" in cgroups and _read_counter(cgroups["pids"] / "pids.events", "max"):
        return "processes"
    return None


def limit_from_exit(exit_code: int, output: str) -> str | None:
    """The limit an exit shows: SIGXCPU ("cpu_time") or an uncaught MemoryError ("memory")."""
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu_time"
    # RLIMIT_AS makes Python raise MemoryError; an uncaught one ends the traceback.
    if exit_code != 0 and output.rstrip().endswith("MemoryError"):
        return "memory"
    return None
