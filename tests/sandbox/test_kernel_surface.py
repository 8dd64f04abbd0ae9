"""The kernel surface a sandboxed command reaches is closed (issue 44, item 6).

One test per refused family of calls, each a tiny python program run through the sandbox
runner under every isolation mode that installs the filter: new user namespaces, io_uring
and Linux AIO, the page cache (evicted, loaded or probed) and clone3 (ENOSYS, so libc falls
back to clone); what ordinary programs need (threads, subprocesses, coreutils' read-ahead
hint) still works. Then the host's /proc kernel state masked, and the file tools refusing
a file with two names (a hard link to a test file).
"""

from __future__ import annotations

import os
import platform
import signal
import textwrap
from pathlib import Path

import pytest

from components.env.tool_sets.shared import execute_tool
from components.sandbox.bubblewrap import PROC_MASKED_DIRS, PROC_MASKED_FILES, bwrap_path
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import netns_works
from components.sandbox.kernel import seccomp_program
from components.sandbox.process import kernel_call_refused, run_sandboxed
from components.sandbox.workspace import PathEscapeError, Workspace

HAS_BWRAP = bwrap_path() is not None
MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no usable bwrap")),
    pytest.param("namespace", marks=pytest.mark.skipif(
        not netns_works(), reason="unshare of net/ipc/mount namespaces fails")),
]  # fmt: skip
# The test's own syscall numbers (not the filter's table), per machine.
NR = {
    "x86_64": {"clone": 56, "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "io_setup": 206, "cachestat": 451, "readahead": 187,
               "process_madvise": 440},
    "aarch64": {"clone": 220, "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426,
                "io_uring_register": 427, "io_setup": 0, "cachestat": 451, "readahead": 213,
                "process_madvise": 440},
}.get(platform.machine())  # fmt: skip
pytestmark = pytest.mark.skipif(
    NR is None or not seccomp_program(), reason="no seccomp table for this machine"
)
SIGSYS_EXIT = 128 + signal.SIGSYS
PRELUDE = """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
fd = os.open("/etc/passwd", os.O_RDONLY)
page = mmap.mmap(-1, mmap.PAGESIZE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
print("started", flush=True)
"""


@pytest.fixture
def ws(tmp_path: Path):
    (tmp_path / "src" / "tests").mkdir(parents=True)
    (tmp_path / "src" / "mod.py").write_text("x = 1\n")
    (tmp_path / "src" / "tests" / "test_mod.py").write_text("def test_x():\n    assert 1\n")
    with Workspace.create(tmp_path / "src", parent=tmp_path) as w:
        yield w


def sandboxed(ws: Workspace, code: str, mode: str):
    cfg = SandboxConfig(wall_time_s=30, cpu_time_s=20, isolation=mode)
    src = textwrap.dedent(PRELUDE) + textwrap.dedent(code).format(**NR)
    return run_sandboxed(["python", "-c", src], ws.root, cfg)


def assert_killed(ws: Workspace, code: str, mode: str) -> None:
    """The call kills the process (SIGSYS) after it started, and the runner says so."""
    cmd = sandboxed(ws, code + "\nprint('survived')\n", mode)
    assert cmd.exit_code == SIGSYS_EXIT, cmd.output
    assert "started" in cmd.output and "survived" not in cmd.output
    assert kernel_call_refused(cmd)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "call", ["libc.unshare(0x10000000)", "libc.syscall({clone}, 0x10000000 | 17, 0, 0, 0, 0)"]
)
def test_a_new_user_namespace_is_refused(ws, mode, call):
    assert_killed(ws, call, mode)


@pytest.mark.parametrize("mode", MODES)
def test_clone3_is_enosys_and_threads_and_subprocesses_still_start(ws, mode):
    """clone3's flags are in a struct the filter cannot read: ENOSYS, and glibc falls back
    to clone (filtered by its flags) for threads and posix_spawn."""
    cmd = sandboxed(ws, """
        import subprocess, threading
        print("clone3", libc.syscall({clone3}, None, 0), ctypes.get_errno())
        t = threading.Thread(target=print, args=("thread",))
        t.start(); t.join()
        print(subprocess.run(["cat", "/etc/hostname"], capture_output=True).returncode)
        print(os.fork() or "parent")
    """, mode)  # fmt: skip
    assert cmd.exit_code == 0, cmd.output
    assert "clone3 -1 38" in cmd.output and "thread" in cmd.output and "parent" in cmd.output
    assert not kernel_call_refused(cmd)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", [
    "libc.syscall({io_uring_setup}, 8, ctypes.create_string_buffer(120))",
    "libc.syscall({io_uring_enter}, 3, 1, 0, 0, None, 0)",
    "libc.syscall({io_uring_register}, 3, 0, None, 0)",
    "libc.syscall({io_setup}, 8, ctypes.byref(ctypes.c_ulong(0)))",
])  # fmt: skip
def test_io_uring_and_linux_aio_are_refused(ws, mode, call):
    assert_killed(ws, call, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", [
    "libc.mincore(addr, mmap.PAGESIZE, ctypes.create_string_buffer(1))",
    "libc.syscall({cachestat}, fd, None, None, 0)",
    "libc.syscall({readahead}, fd, 0, 4096)",
    "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
    "os.preadv(fd, [bytearray(8)], 0, os.RWF_NOWAIT)",
    "os.pwritev(fd, [b'x'], 0, os.RWF_NOWAIT)",
    "libc.madvise(addr, mmap.PAGESIZE, 21)",  # MADV_PAGEOUT
    "libc.madvise(addr, mmap.PAGESIZE, 20)",  # MADV_COLD
    "libc.syscall({process_madvise}, -1, None, 0, 21, 0)",
])  # fmt: skip
def test_the_page_cache_can_be_neither_evicted_nor_probed(ws, mode, call):
    assert_killed(ws, call, mode)


@pytest.mark.parametrize("mode", MODES)
def test_harmless_neighbours_of_the_refused_calls_still_work(ws, mode):
    """A read-ahead hint is EPERM (coreutils ignore it), plain preadv and madvise work."""
    cmd = sandboxed(ws, """
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError as e:
            print("fadvise errno", e.errno)
        print("preadv", os.preadv(fd, [bytearray(4)], 0, 0))
        print("madvise", libc.madvise(addr, mmap.PAGESIZE, 4))  # MADV_DONTNEED
    """, mode)  # fmt: skip
    assert cmd.exit_code == 0, cmd.output
    assert "fadvise errno 1" in cmd.output
    assert "preadv 4" in cmd.output and "madvise 0" in cmd.output
    cat = run_sandboxed(["cat", "mod.py"], ws.root, SandboxConfig(isolation=mode))
    assert cat.exit_code == 0 and cat.output == "x = 1\n"


@pytest.mark.skipif(not HAS_BWRAP, reason="no usable bwrap")
def test_the_hosts_kernel_state_in_proc_is_masked(ws):
    """Every masked /proc file that shows something on the host shows nothing inside;
    masked folders are empty and read-only, /proc/sys read-only."""
    shown = []
    for path in PROC_MASKED_FILES:
        try:
            with open(path, "rb") as f:
                if f.read(64):
                    shown.append(path)
        except OSError:
            continue
    assert "/proc/kallsyms" in shown  # the host does show kernel state
    cmd = sandboxed(ws, f"""
        for path in {shown + list(PROC_MASKED_DIRS)!r}:
            try:
                if os.path.isdir(path):
                    print(path, "folder", os.listdir(path), os.access(path, os.W_OK))
                else:
                    print(path, "read", len(open(path, "rb").read()))
            except OSError as e:
                print(path, "refused", e.errno)
        for path in ("/proc/sys/kernel/hostname", "/proc/acpi/x"):
            try:
                open(path, "w").write("x")
            except OSError as e:
                print(path, "write refused", e.errno)
    """, "bwrap")  # fmt: skip
    assert cmd.exit_code == 0, cmd.output
    lines = dict(line.split(" ", 1) for line in cmd.output.splitlines()[1:])
    for path in shown:
        assert lines[path] in ("read 0", "refused 13", "refused 1"), (path, cmd.output)
    for path in PROC_MASKED_DIRS:
        if os.path.isdir(path):
            assert lines[path] == "folder [] False", cmd.output
    assert lines["/proc/sys/kernel/hostname"].startswith("write refused"), cmd.output


def test_tools_refuse_a_file_with_two_names(ws):
    """A hard link to a test file is a second name the tools' guards do not know: reading
    or writing through either name is refused, and both names are reported once."""
    os.link(ws.root / "tests" / "test_mod.py", ws.root / "notes.py")
    for rel in ("notes.py", "tests/test_mod.py"):
        for for_write in (False, True):
            with pytest.raises(PathEscapeError, match="2 hard links"):
                ws.resolve(rel, for_write=for_write)
    assert ws.new_escaping_links() == ["notes.py", "tests/test_mod.py"]
    assert ws.new_escaping_links() == []
    cfg = SandboxConfig()
    edit = execute_tool(ws, "edit_file", {"path": "notes.py", "old": "assert 1",
                                          "new": "assert True"}, cfg)  # fmt: skip
    read = execute_tool(ws, "read_file", {"path": "notes.py"}, cfg)
    assert "hard links" in edit.observation and "hard links" in read.observation
    assert (ws.root / "tests" / "test_mod.py").read_text() == "def test_x():\n    assert 1\n"
    assert ws.resolve("mod.py") == ws.root / "mod.py"  # one name: as before
    assert ws.resolve("tests") == ws.root / "tests"  # folders always have several links


@pytest.mark.skipif(not HAS_BWRAP, reason="no usable bwrap")
def test_a_command_that_makes_a_hard_link_is_recorded(ws):
    code = "import os; os.link('tests/test_mod.py', 'notes.py')"
    (ws.root / "l.py").write_text(code)
    result = execute_tool(ws, "run_command", {"cmd": "python l.py"}, SandboxConfig())
    assert result.safety is not None and not result.safety.allowed
    assert result.safety.category == "path_escape" and "notes.py" in result.safety.reason
