"""The kernel calls the sandbox makes itself, through libc: namespaces (unshare), mounts
(a workspace's tmpfs, a private /dev/shm) and the seccomp filter every sandboxed command
runs under (`seccomp_program`, what it refuses in `REFUSED_CALLS`)."""

from __future__ import annotations

import functools

_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x4000, 0x40000, 0x2, 0x4
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
MNT_DETACH = 2
POSIX_FADV_DONTNEED = 4
RWF_NOWAIT = 0x8
MADV_COLD, MADV_PAGEOUT = 20, 21
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI numbers: refused as a whole

# The calls the filter refuses, by name, and why. What is shared between two runs (and
# with the host) and no namespace separates: the kernel keyring (uid 0's keyrings are the
# same in every sandbox and on the host), the page cache (which pages of a world-readable
# host file are cached: set with posix_fadvise(DONTNEED) or madvise(PAGEOUT), read back
# with mincore, cachestat, preadv2(RWF_NOWAIT) or an asynchronous read that must not
# block), and the kernel's attack surface a new user namespace opens (capabilities inside
# it: netlink, mounts) or io_uring's. Such a call kills the calling process (SIGSYS,
# SECCOMP_RET_KILL_PROCESS), which `kernel_call_refused` (components/sandbox/process.py)
# sees and the tools and the verifier record: an EPERM would contain the attempt but leave
# no record. Two are refused without a kill because ordinary programs make them: clone3
# gets ENOSYS (glibc's pthread_create and posix_spawn then fall back to clone, whose flags
# the filter can read, unlike clone3's struct), and posix_fadvise with another advice
# than DONTNEED gets EPERM (coreutils' cat, sort and wc ask for sequential read-ahead and
# ignore the error).
REFUSED_CALLS: dict[str, str] = {
    "add_key, request_key, keyctl": "killed: the kernel keyring",
    "unshare, clone with CLONE_NEWUSER": "killed: a new user namespace",
    "clone3": "ENOSYS: libc falls back to clone, which is filtered by its flags",
    "io_uring_setup, io_uring_enter, io_uring_register": "killed: io_uring",
    "io_setup": "killed: Linux AIO (an RWF_NOWAIT read in its iocb, out of the filter's view)",
    "mincore, cachestat, readahead": "killed: the page cache read or loaded",
    "fadvise64": "killed with POSIX_FADV_DONTNEED (evicts host pages), else EPERM",
    "preadv2, pwritev2 with RWF_NOWAIT": "killed: reads whether a page is cached",
    "madvise with MADV_COLD or MADV_PAGEOUT, process_madvise": "killed: evicts host pages",
    "any call of another ABI (i386, x32)": "killed: its numbers differ",
}
# (audit arch, syscall numbers by name) per machine.
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "clone": 56, "unshare": 272,
        "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "io_setup": 206, "mincore": 27, "cachestat": 451,
        "readahead": 187, "fadvise64": 221, "preadv2": 327, "pwritev2": 328, "madvise": 28,
        "process_madvise": 440,
    }),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "unshare": 97,
        "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "io_setup": 0, "mincore": 232, "cachestat": 451,
        "readahead": 213, "fadvise64": 223, "preadv2": 286, "pwritev2": 287, "madvise": 233,
        "process_madvise": 440,
    }),
}  # fmt: skip
_KILLED = ("add_key", "request_key", "keyctl", "io_uring_setup", "io_uring_enter",
           "io_uring_register", "io_setup", "mincore", "cachestat", "readahead",
           "process_madvise")  # fmt: skip
# Calls refused by one argument: (name, argument index, test, values, else-action).
# "set": killed if any bit of the value is set; "in": killed if the argument is one of them.
_BY_ARGUMENT = (
    ("clone", 0, "set", (CLONE_NEWUSER,), "allow"),
    ("unshare", 0, "set", (CLONE_NEWUSER,), "allow"),
    ("fadvise64", 3, "in", (POSIX_FADV_DONTNEED,), "eperm"),
    ("preadv2", 5, "set", (RWF_NOWAIT,), "allow"),
    ("pwritev2", 5, "set", (RWF_NOWAIT,), "allow"),
    ("madvise", 2, "in", (MADV_COLD, MADV_PAGEOUT), "allow"),
)
# SECCOMP_RET_* actions; SECCOMP_RET_ERRNO carries the errno in its low 16 bits.
_RETURNS = {"enosys": 0x00050000 | 38, "eperm": 0x00050000 | 1, "allow": 0x7FFF0000,
            "kill": 0x80000000}  # fmt: skip
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|.., RET|K


@functools.cache
def load_libc():
    """The C library through ctypes (loaded on first use: a bwrap run may need none)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def namespace_flags(network: bool) -> int:
    """The namespaces the "namespace" fallback makes (no network namespace when allowed)."""
    return _CLONE_NEWIPC | _CLONE_NEWNS | (0 if network else _CLONE_NEWNET)


@functools.cache
def seccomp_program() -> bytes:
    """The classic-BPF seccomp filter every sandboxed command runs under, as the packed
    `struct sock_filter` array bwrap's --seccomp reads: the calls of `REFUSED_CALLS`
    refused as it says, all else allowed. It ends in the four returns: ENOSYS, EPERM,
    allow, kill. b"" on a machine `_SYSCALLS` does not know (nothing is refused there)."""
    import platform
    import struct

    known = _SYSCALLS.get(platform.machine())
    if known is None:
        return b""
    arch, nr = known
    # (code, jump if true, jump if false, k): a jump names a label, resolved below.
    prog: list[tuple[int, str | int, str | int, int]] = [
        (_LD_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 0, "kill", arch),
        (_LD_ABS, 0, 0, 0),  # seccomp_data.nr
        (_JGE, "kill", 0, _X32_SYSCALL_BIT),
        (_JEQ, "enosys", 0, nr["clone3"]),
    ]
    prog += [(_JEQ, "kill", 0, nr[name]) for name in _KILLED]
    prog += [(_JEQ, f"arg:{name}", 0, nr[name]) for name, *_ in _BY_ARGUMENT]
    prog.append((_JEQ, "allow", "allow", 0))  # an unconditional jump to "allow"
    labels: dict[str, int] = {}
    for name, index, test, values, otherwise in _BY_ARGUMENT:
        labels[f"arg:{name}"] = len(prog)
        prog.append((_LD_ABS, 0, 0, 16 + 8 * index))  # the argument's low 32 bits
        if test == "set":
            prog.append((_JSET, "kill", otherwise, sum(values)))
        else:
            prog += [(_JEQ, "kill", 0, v) for v in values[:-1]]
            prog.append((_JEQ, "kill", otherwise, values[-1]))
    for action in ("enosys", "eperm", "allow", "kill"):
        labels[action] = len(prog)
        prog.append((_RET, 0, 0, _RETURNS[action]))

    def offset(i: int, target: str | int) -> int:
        jump = target if isinstance(target, int) else labels[target] - i - 1
        if not 0 <= jump <= 255:
            raise ValueError(f"seccomp jump out of range at {i}: {target}")
        return jump

    return b"".join(
        struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
        for i, (code, jt, jf, k) in enumerate(prog)
    )


@functools.cache
def seccomp_fprog():
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
