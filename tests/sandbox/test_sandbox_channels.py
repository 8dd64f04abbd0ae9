"""No channel between a sandboxed command and anything outside its own run (issue 31).

Each test plants something through one kernel object in one sandboxed run and looks for it
in the next run and on the host: the kernel keyring (also through `run_command`), SysV
shared memory, semaphores and message queues, an abstract unix socket, /dev/shm and /tmp.
Each runs under every isolation mode that gives that protection on this machine (see
components/sandbox/isolation.py's docstring for the channels that remain, and why).
"""

from __future__ import annotations

import ctypes
import platform
import signal
import socket
import textwrap
import uuid
from pathlib import Path

import pytest

from components.env.tool_sets.shared import execute_tool
from components.sandbox.bubblewrap import bwrap_path
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import netns_works
from components.sandbox.kernel import seccomp_program
from components.sandbox.process import run_sandboxed
from components.sandbox.workspace import Workspace

HAS_BWRAP = bwrap_path() is not None
MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no usable bwrap")),
    pytest.param("namespace", marks=pytest.mark.skipif(
        not netns_works(), reason="unshare of net/ipc/mount namespaces fails")),
]  # fmt: skip
# add_key, request_key and keyctl, per machine (the keyring tests need raw syscalls).
KEYRING_NR = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
needs_keyring_nr = pytest.mark.skipif(
    platform.machine() not in KEYRING_NR, reason="syscall numbers unknown for this machine"
)
KEYCTL_SEARCH, KEY_SPEC_USER, KEY_SPEC_SESSION = 10, -4, -3
LIBC = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def ws(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "mod.py").write_text("x = 1\n")
    with Workspace.create(tmp_path / "src", parent=tmp_path) as w:
        yield w


def sandboxed(ws: Workspace, code: str, mode: str, *, status: int = 0) -> str:
    cfg = SandboxConfig(wall_time_s=20, cpu_time_s=10, isolation=mode)
    cmd = run_sandboxed(["python", "-c", textwrap.dedent(code)], ws.root, cfg)
    assert cmd.exit_code == status, cmd.output
    return cmd.output.strip()


SIGSYS_EXIT = 128 + signal.SIGSYS  # killed by the seccomp filter


def _keyring_code(desc: str, action: str) -> str:
    add_key, request_key, keyctl = KEYRING_NR.get(platform.machine(), (0, 0, 0))
    return f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        found = []
        for ring in ({KEY_SPEC_USER}, {KEY_SPEC_SESSION}):
            if {action == "add"!r}:
                key = libc.syscall({add_key}, b"user", {desc.encode()!r}, b"answer", 6, ring)
                if key > 0:
                    libc.syscall({keyctl}, 5, key, 0x3F3F3F3F)  # KEYCTL_SETPERM: all for all
                found.append(key)
            else:
                found.append(libc.syscall({keyctl}, {KEYCTL_SEARCH}, ring, b"user",
                                          {desc.encode()!r}, 0))
        found.append(libc.syscall({request_key}, b"user", {desc.encode()!r}, None, 0))
        print(max(found))
    """


def _host_key(desc: str) -> int:
    keyctl = KEYRING_NR[platform.machine()][2]
    hits = [
        LIBC.syscall(keyctl, KEYCTL_SEARCH, ring, b"user", desc.encode(), 0)
        for ring in (KEY_SPEC_USER, KEY_SPEC_SESSION)
    ]
    for key in hits:
        if key > 0:  # a leak from an unfixed sandbox: take it out of the host again
            LIBC.syscall(keyctl, 3, key)  # KEYCTL_REVOKE
    return max(hits)


@needs_keyring_nr
@pytest.mark.parametrize("mode", [*MODES, "none"])
def test_a_key_added_in_one_run_is_in_no_later_run_nor_on_the_host(ws, mode):
    """The kernel keyring is not namespaced: the seccomp filter kills a process that calls
    add_key, keyctl or request_key, in every mode (an unfixed sandbox handed hidden answers
    on this way)."""
    desc = f"agentrl-probe-{uuid.uuid4().hex}"
    # Killed at its first keyring call: nothing printed but the shell's "Bad system call".
    assert sandboxed(ws, _keyring_code(desc, "add"), mode, status=SIGSYS_EXIT) in (
        "",
        "Bad system call",
    )
    assert sandboxed(ws, _keyring_code(desc, "find"), mode, status=SIGSYS_EXIT) in (
        "",
        "Bad system call",
    )
    assert _host_key(desc) < 0


@needs_keyring_nr
def test_run_command_cannot_write_the_hosts_keyring(ws):
    desc = f"agentrl-probe-{uuid.uuid4().hex}"
    (ws.root / "k.py").write_text(textwrap.dedent(_keyring_code(desc, "add")))
    result = execute_tool(ws, "run_command", {"cmd": "python k.py"}, SandboxConfig())
    assert result.command.exit_code == SIGSYS_EXIT, result.observation
    assert result.safety.category == "write_outside_workspace"  # recorded, not only refused
    assert _host_key(desc) < 0


def _sysv_code(key: int, action: str) -> str:
    return f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        flags = 0o1600 if {action == "make"!r} else 0  # IPC_CREAT | 0600
        ids = [libc.shmget({key}, 4096, flags), libc.semget({key}, 1, flags),
               libc.msgget({key}, flags)]
        print(" ".join(map(str, ids)))
    """


@pytest.mark.parametrize("mode", MODES)
def test_sysv_ipc_objects_die_with_their_run(ws, mode):
    """Shared memory, semaphores and message queues live in the run's own IPC namespace."""
    key = 0x5A000000 | (uuid.uuid4().int & 0xFFFFFF)
    made = [int(i) for i in sandboxed(ws, _sysv_code(key, "make"), mode).split()]
    assert all(i >= 0 for i in made)  # the run itself may use them
    seen = [int(i) for i in sandboxed(ws, _sysv_code(key, "look"), mode).split()]
    assert seen == [-1, -1, -1]
    host = [LIBC.shmget(key, 0, 0), LIBC.semget(key, 0, 0), LIBC.msgget(key, 0)]
    for rm, ident in zip((LIBC.shmctl, LIBC.semctl, LIBC.msgctl), host, strict=True):
        if ident >= 0:  # a leak from an unfixed sandbox: remove it (IPC_RMID)
            rm(ident, 0, 0) if rm is LIBC.semctl else rm(ident, 0, None)
    assert host == [-1, -1, -1]


@pytest.mark.parametrize("mode", MODES)
def test_abstract_unix_sockets_of_the_host_are_out_of_reach(ws, mode):
    """Abstract unix sockets belong to the network namespace: a listener on the host (or in
    another run) cannot be reached."""
    name = f"agentrl-probe-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + name)
        listener.listen(1)
        out = sandboxed(ws, f"""
            import socket
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect("\\0{name}")
                print("connected")
            except OSError as e:
                print("refused", e.errno)
        """, mode)  # fmt: skip
    assert out.startswith("refused"), out


@pytest.mark.parametrize("mode", MODES)
def test_dev_shm_is_private_to_the_run(ws, mode):
    name = f"agentrl-probe-{uuid.uuid4().hex}"
    code = f"""
        import os
        print(os.path.exists("/dev/shm/{name}"))
        open("/dev/shm/{name}", "w").write("answers")
    """
    assert sandboxed(ws, code, mode) == "False"
    assert sandboxed(ws, code, mode) == "False"
    leaked = Path("/dev/shm", name)
    found = leaked.exists()
    leaked.unlink(missing_ok=True)
    assert not found


@pytest.mark.skipif(not HAS_BWRAP, reason="no usable bwrap (/tmp is the host's otherwise)")
def test_tmp_is_private_to_the_run(ws):
    name = f"agentrl-probe-{uuid.uuid4().hex}"
    code = f"""
        import os
        print(os.path.exists("/tmp/{name}"))
        open("/tmp/{name}", "w").write("answers")
    """
    assert sandboxed(ws, code, "bwrap") == "False"
    assert sandboxed(ws, code, "bwrap") == "False"
    assert not Path("/tmp", name).exists()


def test_the_seccomp_program_is_well_formed():
    """The hand-assembled filter ends in allow, then kill; every jump stays inside."""
    import struct

    program = seccomp_program()
    if not program:
        pytest.skip("no seccomp table for this machine")
    ins = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert ins[-2] == (0x06, 0, 0, 0x7FFF0000) and ins[-1] == (0x06, 0, 0, 0x80000000)
    for i, (code, jt, jf, _) in enumerate(ins):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert i + 1 + jt < len(ins) and i + 1 + jf < len(ins)
