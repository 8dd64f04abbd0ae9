"""Which isolation a sandboxed command gets on this machine (`resolve_isolation`,
`isolation_report`), and what each mode protects against and what it does not.

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
    masked; so is the host's kernel state in /proc (the container runtimes' masked paths:
    keys, kallsyms, timers, slabinfo, every page's flags, ...; bubblewrap.PROC_MASKED_*);
    /proc/sys, sysrq-trigger, irq, bus and fs are read-only;
  * privileges: every capability is dropped (bwrap keeps them for root by default), with
    no_new_privs, and separate pid/ipc/uts/cgroup namespaces (host processes are invisible);
    no new user namespace (capabilities inside one: netlink, mounts) and no io_uring, by
    the same filter (killed and recorded); clone3 gets ENOSYS, so libc uses clone, whose
    flags the filter reads;
  * a second name of a file: the file tools refuse a file with more than one hard link
    (`Workspace.resolve`), and a command that makes one is recorded like a link out;
  * channels out of the run (nothing a command leaves in a kernel object reaches a later
    run or the host; tests/sandbox/test_sandbox_channels.py, one test per channel): the kernel
    keyring, which no namespace separates for uid 0, and the page cache (which pages of a
    host file are cached), by a seccomp filter (a process that calls add_key, request_key
    or keyctl, evicts or probes the page cache: posix_fadvise DONTNEED, madvise PAGEOUT,
    mincore, cachestat, readahead, preadv2 RWF_NOWAIT, Linux AIO; or any call of another
    ABI, is killed by SIGSYS, in every isolation mode; `kernel_call_refused` tells the
    tools and the verifier, which record it; kernel.REFUSED_CALLS lists them, with
    tests/sandbox/test_kernel_surface.py); SysV shared memory, semaphores, message queues
    and POSIX queues by the private IPC namespace; abstract unix sockets and the loopback
    by the private network namespace; /dev and /dev/shm by bwrap's own /dev; /tmp by the
    private tmpfs;
  * secrets in the environment: the environment is rebuilt from a short allow-list;
  * leftovers: every process of the command is killed when it returns, also on exceptions;
    cgroups are removed.

What is NOT protected against:
  * reading world-readable system files (/etc/passwd, /usr): the interpreter needs them;
  * disk usage of the workspace where this process may not mount (not root): the workspace
    is then a plain folder with no quota; as root it is a tmpfs of WORKSPACE_QUOTA_BYTES
    (`Workspace.create`), so filling it fails inside it and nowhere else;
  * kernel exploits through the calls the filter allows, and timing side channels (the
    sandboxed process is uid 0 without capabilities, since dropping to another uid breaks
    an interpreter under /root): CPU, cache and memory pressure of one run can be felt by
    another that runs at the same time, a bandwidth of bits, not of files; the page cache
    read by timing (a cached page reads faster) or loaded by plain reads stays such a
    channel: no check's verdict may rest on what a run of the agent's code could see;
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

Availability probes (bubblewrap, unshare, cgroups, mounting) run once per process.
"""

from __future__ import annotations

import functools
import os

from components.sandbox.bubblewrap import bwrap_path
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.kernel import load_libc, namespace_flags
from components.sandbox.limits import cgroup_parents


@functools.cache
def netns_works() -> bool:
    """Whether the "namespace" fallback's unshare (network, IPC and mount namespaces)
    succeeds here (tried in a throwaway child)."""
    try:
        libc = load_libc()
    except OSError:
        return False
    flags = namespace_flags(network=False)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe work, then _exit
        os._exit(0 if libc.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def resolve_isolation(mode: str) -> str:
    """The isolation a config's mode gives on this machine (raises if a forced mode can't)."""
    if mode == "auto":
        if bwrap_path():
            return "bwrap"
        return "namespace" if netns_works() else "none"
    if mode == "bwrap" and not bwrap_path():
        raise SandboxError("isolation 'bwrap' requested but bubblewrap is missing or broken")
    if mode == "namespace" and not netns_works():
        raise SandboxError("isolation 'namespace' requested but unshare(CLONE_NEWNET) fails")
    return mode


def isolation_report(config: SandboxConfig | None = None) -> dict[str, object]:
    """Which protections a config gets on this machine (for logs, docs and test skips)."""
    config = config or SandboxConfig()
    bwrap = bwrap_path()
    cgroups = cgroup_parents()
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
        "net_namespace_available": netns_works(),
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
