"""The bubblewrap command line a sandboxed command runs under (`bwrap_argv`): which host
folders it sees (read-only system, interpreter and task environment, a private /tmp, its
workspace), what is masked, and the namespaces and capabilities it gets."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from components.sandbox.config import SandboxConfig
from components.sandbox.environ import HARNESS_PLUGINS

# The host as a sandboxed command sees it (read-only): the system's programs, libraries and
# configuration. The interpreter's folders, a private /tmp and the workspace are added;
# nothing else of the host is there (no task store, no other workspace, no home).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_MASKED_FILES = ("/etc/shadow", "/etc/gshadow")
# Host kernel state /proc shows whatever the namespaces (the container runtimes' masked
# paths, runc's and Docker's, plus what this kernel showed a sandboxed uid 0): keys and
# key quotas of the host's keyring, kernel symbols and allocations, timers and the
# scheduler, and the state of every physical page (which reads back the page cache).
# Files get /dev/null over them, folders an empty read-only tmpfs; only where they exist.
PROC_MASKED_FILES = (
    "/proc/keys", "/proc/key-users", "/proc/kallsyms", "/proc/kcore", "/proc/slabinfo",
    "/proc/vmallocinfo", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
    "/proc/latency_stats", "/proc/kpageflags", "/proc/kpagecount", "/proc/kpagecgroup",
)  # fmt: skip
PROC_MASKED_DIRS = ("/proc/acpi", "/proc/asound", "/proc/scsi")
# Read-only like /proc/sys (runc's readonly paths): sysrq, interrupts, buses, filesystems.
PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")


@functools.cache
def bwrap_path() -> str | None:
    """The bubblewrap program, if it is installed and works here (probed once)."""
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


def bwrap_argv(
    config: SandboxConfig, ws: Path, cwd: Path, readonly: tuple[str, ...],
    mounts: tuple[tuple[str, str, bool], ...] = (),
) -> list[str]:  # fmt: skip
    """bwrap and its arguments, to go before the command: what of the host the command in
    `cwd` sees, `ws` its only writable folder (but `readonly` and read-only `mounts`)."""
    view, visible = _system_view()
    args = [bwrap_path() or "bwrap", *view, "--dev", "/dev", "--proc", "/proc"]
    args += _proc_masks()
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
    for needed in interpreter_dirs():
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


@functools.cache
def _proc_masks() -> tuple[str, ...]:
    """bwrap arguments over the sandbox's /proc: host kernel state masked, and what uid 0
    could write without capabilities read-only (bwrap 0.8 leaves /proc/sys writable)."""
    args: list[str] = []
    for path in PROC_READONLY:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in PROC_MASKED_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in PROC_MASKED_DIRS:
        if os.path.isdir(path):
            args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    return tuple(args)


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
    for folder in (*interpreter_dirs(), str(Path(sys.executable).parent.parent)):
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
def interpreter_dirs() -> tuple[str, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs.add(str(Path(os.path.realpath(sys.executable)).parent.parent))
    return tuple(sorted(os.path.realpath(d) for d in dirs))
