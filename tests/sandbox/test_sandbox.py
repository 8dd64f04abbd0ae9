"""Sandbox: config, workspace confinement, limits, and one adversarial test per property.

Every adversarial test checks two things: the sandbox contained the attack (limit hit,
access failed inside) and the host is unaffected (no leftover processes, files or cgroups,
the host still forks). Attack programs carry a unique marker so leftovers can be found.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from components.sandbox.bubblewrap import bwrap_path, interpreter_dirs
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.environ import HARNESS_PLUGINS
from components.sandbox.isolation import isolation_report, netns_works, resolve_isolation
from components.sandbox.limits import cgroup_parents
from components.sandbox.network import network_attempts
from components.sandbox.output import cap_text
from components.sandbox.process import CommandResult, run_sandboxed
from components.sandbox.workspace import PathEscapeError, Workspace

HAS_BWRAP = bwrap_path() is not None
CGROUPS = cgroup_parents()
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap missing or not usable")
needs_pids_cgroup = pytest.mark.skipif(
    "pids" not in CGROUPS, reason="no writable cgroup v1 pids controller"
)
needs_memory_cgroup = pytest.mark.skipif(
    "memory" not in CGROUPS, reason="no writable cgroup v1 memory controller"
)
needs_netns = pytest.mark.skipif(not netns_works(), reason="unshare(CLONE_NEWNET) fails")

FAST = SandboxConfig(wall_time_s=10, cpu_time_s=5, memory_mb=512)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "mod.py").write_text("def add(a, b):\n    return a + b\n")
    (src / "tests" / "test_mod.py").write_text(
        "from mod import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    return src


@pytest.fixture
def ws(repo: Path, tmp_path: Path):
    with Workspace.create(repo, parent=tmp_path) as w:
        yield w


def python_code(
    ws: Workspace, code: str, config: SandboxConfig = FAST, readonly: tuple = ()
) -> CommandResult:
    return run_sandboxed(
        ["python", "-c", textwrap.dedent(code)], ws.root, config, readonly=readonly
    )


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains marker (leftovers of an attack)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def leftover_cgroups() -> list[Path]:
    prefix = f"agentrl-sbx-{os.getpid()}-"
    return [p for parent in CGROUPS.values() for p in parent.glob(prefix + "*")]


def assert_host_clean(marker: str) -> None:
    assert processes_with(marker) == []
    assert leftover_cgroups() == []
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


# ----------------------------------------------------------------------------- config


def test_config_fields_have_help_and_are_validated():
    for f in dataclasses.fields(SandboxConfig):
        assert f.metadata.get("help"), f"{f.name} has no help string"
    SandboxConfig()  # defaults are valid
    bad = {
        "wall_time_s": 0,
        "cpu_time_s": -1,
        "memory_mb": 8,
        "max_processes": 1,
        "max_output_bytes": 10,
        "max_file_bytes": 10,
        "network": "no",
        "isolation": "docker",
        "allowed_programs": ("/bin/sh",),
        "hide_paths": ("relative",),
    }
    for name, value in bad.items():
        with pytest.raises(ValueError, match=name):
            SandboxConfig(**{name: value})


def test_cap_text_keeps_head_and_tail_within_budget():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    capped, cut = cap_text(text, 1000)
    assert cut and capped.startswith("HEAD") and capped.endswith("TAIL")
    assert "[... output truncated:" in capped and "bytes omitted ...]" in capped
    assert len(capped.encode()) <= 1000
    assert cap_text("short", 1000) == ("short", False)


def test_isolation_report_describes_this_machine():
    report = isolation_report(SandboxConfig())
    assert report["mode"] in ("bwrap", "namespace", "none")
    assert report["pids_cgroup"] == ("pids" in CGROUPS)
    assert "isolation=" in report["summary"]


# ----------------------------------------------------------------------------- workspace


def test_workspace_copies_and_cleans_up(repo: Path, tmp_path: Path):
    w = Workspace.create(repo, parent=tmp_path)
    assert (w.root / "tests" / "test_mod.py").read_text() == (
        repo / "tests" / "test_mod.py"
    ).read_text()
    files = {p.relative_to(repo): p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert w.root != repo and files == {
        p.relative_to(w.root): p.read_bytes() for p in w.root.rglob("*") if p.is_file()
    }
    w.cleanup()
    assert not w.root.exists() and repo.exists()


def test_resolve_refuses_escapes(ws: Workspace, tmp_path: Path):
    assert ws.resolve("mod.py") == ws.root / "mod.py"
    assert ws.resolve("tests/../mod.py") == ws.root / "mod.py"
    for bad in ("/etc/passwd", "~/.bashrc", "../outside", "tests/../../x", "a\x00b"):
        with pytest.raises(PathEscapeError):
            ws.resolve(bad)
    (ws.root / "link").symlink_to("/etc/passwd")
    (ws.root / "dirlink").symlink_to(tmp_path)
    with pytest.raises(PathEscapeError, match="symlink"):
        ws.resolve("link")
    with pytest.raises(PathEscapeError, match="symlink"):
        ws.resolve("dirlink/anything")
    (ws.root / "inner").symlink_to("mod.py")
    assert ws.resolve("inner") == ws.root / "mod.py"  # reading through an inside link is fine
    with pytest.raises(PathEscapeError, match="through symlink"):
        ws.resolve("inner", for_write=True)


# ----------------------------------------------------------------------------- normal runs


def test_pytest_passes_and_fails_with_exit_codes(ws: Workspace):
    ok = run_sandboxed(["python", "-m", "pytest", "-q"], ws.root, FAST)
    assert ok.exit_code == 0 and "1 passed" in ok.output and ok.limit_hit is None
    assert ok.isolation == resolve_isolation("auto") and not ok.truncated
    (ws.root / "mod.py").write_text("def add(a, b):\n    return a - b\n")
    bad = run_sandboxed(["python", "-m", "pytest", "-q"], ws.root, FAST)
    assert bad.exit_code == 1 and "1 failed" in bad.output and not bad.timed_out
    assert leftover_cgroups() == []


def test_refusals_are_clear(ws: Workspace):
    with pytest.raises(SandboxError, match="not allowed"):
        run_sandboxed(["bash", "-c", "true"], ws.root, FAST)
    with pytest.raises(SandboxError, match="by name"):
        run_sandboxed(["/usr/bin/python3", "-c", "1"], ws.root, FAST)
    with pytest.raises(SandboxError, match="not installed"):
        cfg = dataclasses.replace(FAST, allowed_programs=("no-such-program-xyz",))
        run_sandboxed(["no-such-program-xyz"], ws.root, cfg)
    with pytest.raises(SandboxError, match="inside the workspace"):
        run_sandboxed(["true"], Path("/"), FAST, workspace=ws.root)


def test_env_is_scrubbed_and_secrets_do_not_pass(ws: Workspace, monkeypatch):
    monkeypatch.setenv("AGENTRL_FAKE_SECRET_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-aws")
    r = python_code(ws, "import os, json; print(json.dumps(dict(os.environ)))")
    import json

    env = json.loads(r.output.strip().splitlines()[-1])
    assert "s3cr3t" not in r.output
    assert set(env) - {"PWD"} == {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE",
                                  "PYTHONHASHSEED", "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
                                  "PYTEST_PLUGINS", "PYTHONPATH"}  # fmt: skip
    # Only the harness's own plugins folder (its per-test limits), read-only in the sandbox.
    assert env["PYTHONPATH"] == str(HARNESS_PLUGINS)
    assert sorted(p.name for p in HARNESS_PLUGINS.glob("*.py")) == [
        "agentrl_cpu_timeout.py", "agentrl_limits.py"]  # fmt: skip
    assert env["HOME"] == str(ws.root)
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


# ----------------------------------------------------------------------------- adversarial


def test_infinite_loop_hits_cpu_limit_and_sleep_hits_wall_clock(ws: Workspace):
    marker = f"m{uuid.uuid4().hex}"
    cfg = dataclasses.replace(FAST, cpu_time_s=1, wall_time_s=5)
    spin = python_code(ws, f"# {marker}\nwhile True: pass", cfg)
    assert spin.limit_hit == "cpu_time" and spin.exit_code == 128 + 24 and spin.wall_s < 4
    cfg = dataclasses.replace(FAST, wall_time_s=1)
    sleeper = python_code(ws, f"# {marker}\nimport time\ntime.sleep(60)", cfg)
    assert sleeper.timed_out and sleeper.limit_hit == "wall_time" and sleeper.wall_s < 3
    assert_host_clean(marker)


def test_background_children_do_not_outlive_the_command(ws: Workspace):
    marker = f"m{uuid.uuid4().hex}"
    code = f"""
        # {marker}
        import os, time
        if os.fork() == 0:
            os.setsid()  # tries to leave the process group too
            time.sleep(60)
        print("parent done")
    """
    r = python_code(ws, code)
    assert "parent done" in r.output and r.wall_s < 5
    assert_host_clean(marker)


@needs_pids_cgroup
def test_fork_bomb_is_contained(ws: Workspace):
    marker = f"m{uuid.uuid4().hex}"
    code = f"""
        # {marker}
        import os, time
        for _ in range(100000):
            try:
                os.fork()
            except OSError:
                time.sleep(0.05)  # keep the CPU free for the rest of the machine
    """
    cfg = dataclasses.replace(FAST, max_processes=16, wall_time_s=2)
    r = python_code(ws, code, cfg)
    assert r.limit_hit == "processes"
    assert_host_clean(marker)


def test_memory_bomb_hits_the_limit(ws: Workspace):
    cfg = dataclasses.replace(FAST, memory_mb=128)
    r = python_code(ws, "x = bytearray(1024 ** 3)", cfg)
    assert r.exit_code != 0 and r.limit_hit == "memory" and "MemoryError" in r.output


@needs_memory_cgroup
def test_memory_cgroup_bounds_the_whole_process_tree(ws: Workspace):
    marker = f"m{uuid.uuid4().hex}"
    # Each process stays under RLIMIT_AS; together they exceed the cgroup limit.
    code = f"""
        # {marker}
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                block = b"x" * (150 * 1024 * 1024)
                time.sleep(1)  # hold it while the siblings allocate
                os._exit(0)
        for _ in range(3):
            os.wait()
    """
    cfg = dataclasses.replace(FAST, memory_mb=256)
    r = python_code(ws, code, cfg)
    assert r.limit_hit == "memory"
    assert_host_clean(marker)


def _network_probe_code(port: int) -> str:
    return f"""
        import socket
        for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("10.255.255.1", 80)):
            s = socket.socket()
            s.settimeout(1)
            try:
                s.connect((host, port))
                print("CONNECTED", host)
            except OSError as e:
                print("BLOCKED", host, type(e).__name__)
            finally:
                s.close()
    """


@pytest.fixture
def loopback_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize(
    "isolation",
    [pytest.param("bwrap", marks=needs_bwrap), pytest.param("namespace", marks=needs_netns)],
)
def test_network_is_unreachable(ws: Workspace, loopback_server: int, isolation: str):
    with socket.create_connection(("127.0.0.1", loopback_server), timeout=1):
        pass  # control: the server works from the host
    cfg = dataclasses.replace(FAST, isolation=isolation)
    r = python_code(ws, _network_probe_code(loopback_server), cfg)
    assert r.isolation == isolation
    assert "CONNECTED" not in r.output
    assert r.output.count("BLOCKED") == 3, r.output


@needs_bwrap
def test_writes_outside_the_workspace_do_not_reach_the_host(ws: Workspace, tmp_path: Path):
    name = f"agentrl-probe-{uuid.uuid4().hex}"
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = [f"/tmp/{name}", str(outside / name), f"/work/{name}", f"/etc/{name}"]
    code = f"""
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                print("WROTE", path)
            except OSError as e:
                print("DENIED", path, e.strerror)
        open("inside.txt", "w").write("ok")
    """
    r = python_code(ws, code)
    for t in targets:
        assert not os.path.exists(t), f"{t} leaked to the host"
    assert "DENIED /work/" in r.output and "DENIED /etc/" in r.output
    assert (ws.root / "inside.txt").read_text() == "ok"  # the workspace itself is writable


@needs_bwrap
def test_host_home_and_shadow_are_masked(ws: Workspace):
    home = os.path.realpath(os.path.expanduser("~"))
    code = f"""
        import os
        print(sorted(os.listdir({home!r})))
        try:
            open("/etc/shadow").read()
            print("SHADOW READ")
        except OSError:
            print("SHADOW DENIED")
    """
    r = python_code(ws, code)
    listed = eval(r.output.splitlines()[0])  # noqa: S307 - our own repr of a list of names
    assert set(listed) <= {".pyenv", os.path.basename(sys.base_prefix)} | {
        Path(p).relative_to(home).parts[0] for p in interpreter_dirs() if p.startswith(home + "/")
    }
    assert "SHADOW READ" not in r.output


def test_huge_output_is_truncated_with_head_and_tail(ws: Workspace):
    cfg = dataclasses.replace(FAST, max_output_bytes=2000)
    r = python_code(ws, "print('BEGIN' + 'x' * 1_000_000 + 'END')", cfg)
    assert r.truncated and r.limit_hit == "output" and r.exit_code == 0
    assert r.output.startswith("BEGIN") and r.output.rstrip().endswith("END")
    assert "[... output truncated:" in r.output and len(r.output.encode()) <= 2000


def test_endless_output_is_killed(ws: Workspace):
    marker = f"m{uuid.uuid4().hex}"
    cfg = dataclasses.replace(FAST, max_output_bytes=1000, wall_time_s=20)
    r = python_code(ws, f"# {marker}\nwhile True: print('y' * 1000)", cfg)
    assert r.limit_hit == "output" and r.truncated and r.wall_s < 10
    assert_host_clean(marker)


def test_file_size_limit(ws: Workspace):
    cfg = dataclasses.replace(FAST, max_file_bytes=64 * 1024)
    r = python_code(ws, "open('big.bin', 'wb').write(b'x' * 1_000_000)", cfg)
    assert r.exit_code != 0 and "File too large" in r.output
    assert (ws.root / "big.bin").stat().st_size <= 64 * 1024


def test_fallback_isolation_none_still_limits(ws: Workspace):
    cfg = dataclasses.replace(FAST, isolation="none", wall_time_s=1)
    ok = run_sandboxed(
        ["python", "-m", "pytest", "-q"], ws.root, dataclasses.replace(cfg, wall_time_s=10)
    )
    assert ok.isolation == "none" and ok.exit_code == 0 and "1 passed" in ok.output
    marker = f"m{uuid.uuid4().hex}"
    r = python_code(ws, f"# {marker}\nimport time\ntime.sleep(60)", cfg)
    assert r.timed_out and r.isolation == "none"
    assert_host_clean(marker)


@needs_bwrap
def test_hide_paths_masks_host_folders(ws: Workspace):
    # A host folder the sandbox shows (the interpreter's prefix is bound read-only; /tmp,
    # $HOME and the rest of the host are not in its view at all).
    hidden = tempfile.mkdtemp(prefix="agentrl-hide-", dir=sys.prefix)
    try:
        Path(hidden, "visible.txt").write_text("x")
        code = f"import os; print(sorted(os.listdir({hidden!r})))"
        shown = python_code(ws, code)
        assert "visible.txt" in shown.output
        masked = python_code(ws, code, dataclasses.replace(FAST, hide_paths=(hidden,)))
        assert masked.output.strip() == "[]"
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


@needs_bwrap
def test_only_the_system_the_interpreter_and_the_workspace_are_visible(ws: Workspace):
    """A task store, another workspace or the checkout: none is in the sandbox's view, with
    no hide_paths at all (issue 17: hidden material is invisible across tasks)."""
    store = Path(tempfile.mkdtemp(prefix="agentrl-store-", dir="/var/tmp"))
    other = Workspace.create(ws.root)
    try:
        (store / "task-1" / "hidden_tests").mkdir(parents=True)
        (store / "task-1" / "hidden_cases.json").write_text("{}")
        probes = [str(store), str(store / "task-1" / "hidden_cases.json"), str(other.root),
                  str(Path(__file__).resolve())]  # fmt: skip
        code = f"""
            import os
            for p in {probes!r}:
                print("SEEN" if os.path.exists(p) else "GONE", p)
            print("OWN", os.path.exists("mod.py"))
        """
        r = python_code(ws, code)
        assert "SEEN" not in r.output and r.output.count("GONE") == len(probes), r.output
        assert "OWN True" in r.output
    finally:
        shutil.rmtree(store, ignore_errors=True)
        other.cleanup()


@pytest.mark.parametrize(
    "isolation",
    [pytest.param("bwrap", marks=needs_bwrap), pytest.param("namespace", marks=needs_netns)],
)
def test_network_attempts_are_counted_whatever_the_spelling(ws: Workspace, isolation: str):
    """The namespace's own counters see an attempt that the code hides (caught exception,
    names built at run time); a command that does not touch the network counts zero."""
    cfg = dataclasses.replace(FAST, isolation=isolation)
    quiet = python_code(ws, "import json; print(json.dumps([1]))", cfg)
    assert quiet.network_attempts == 0 and quiet.exit_code == 0
    code = """
        m = __import__("so" + "cket")
        for target in [("127.0.0.1", 9), ("10.1.2.3", 80)]:
            try:
                getattr(m, "create_" + "connection")(target, timeout=1)
            except OSError:
                pass
    """
    r = python_code(ws, code, cfg)
    assert r.exit_code == 0 and r.output == "" and r.network_attempts > 0


def test_network_attempts_parse_and_only_add():
    snmp = "Ip: Forwarding OutRequests OutNoRoutes\nIp: 2 3 1\nTcp: ActiveOpens PassiveOpens\nTcp: 2 0\n"
    snmp6 = "Ip6OutRequests  \t4\nIp6InReceives 9\nUdp6OutDatagrams 1\n"
    assert network_attempts(snmp + snmp6) == 3 + 1 + 2 + 4 + 1
    zeros = snmp.replace("2 3 1", "2 0 0").replace("Tcp: 2 0", "Tcp: 0 0")
    assert network_attempts(zeros + snmp + snmp6) == network_attempts(snmp + snmp6)
    assert network_attempts("") == 0 and network_attempts("garbage\n1 2") == 0


@needs_bwrap
def test_readonly_paths_inside_the_workspace(ws: Workspace):
    (ws.root / "hidden.py").write_text("X = 1\n")
    code = """
        try:
            open("hidden.py", "w").write("X = 2")
            print("WROTE")
        except OSError as e:
            print("DENIED", e.strerror)
        open("other.txt", "w").write("ok")
    """
    r = python_code(ws, code, readonly=(ws.root / "hidden.py",))
    assert "DENIED Read-only file system" in r.output
    assert (ws.root / "hidden.py").read_text() == "X = 1\n"
    assert (ws.root / "other.txt").read_text() == "ok"
    with pytest.raises(SandboxError, match="inside the workspace"):
        run_sandboxed(["true"], ws.root, FAST, readonly=("/etc/hostname",))
