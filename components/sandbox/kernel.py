"""The kernel calls the sandbox makes itself, through libc: namespaces (unshare), mounts
(a workspace's tmpfs, a private /dev/shm) and the seccomp filter every sandboxed command
runs under (`seccomp_program`)."""

from __future__ import annotations

import functools

_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x4000, 0x40000, 0x2, 0x4
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
MNT_DETACH = 2
# The kernel keyring is not namespaced (uid 0's keyrings are the same in every sandbox and
# on the host): a seccomp filter kills a process that calls add_key, request_key or keyctl.
# (audit arch, (add_key, request_key, keyctl)) per machine.
_KEYRING_SYSCALLS = {
    "x86_64": (0xC000003E, (248, 249, 250)),
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI numbers: refused as a whole


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
