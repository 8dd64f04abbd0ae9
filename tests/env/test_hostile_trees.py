"""Trees and arguments built to break the tools and the verifier (issue 31).

A fuzz-style drive: a workspace holding FIFOs, a socket, a device, symlink loops, non-UTF-8
names, binary files and a huge file; every tool of both tool sets is called on every one of
them, then the episode is verified. Whatever the tree does is the agent's outcome: each call
returns an observation (never raises, never blocks), and the episode ends with a verdict
(status "ok" and a reward), through `EpisodeEnv` as the rollout engine drives it and through
`run_episode` as env eval and the safety suite do. Blocking calls run in a thread with a
generous bound so that a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import threading
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv, run_episode
from components.env.tool_sets.shared import execute_tool
from components.sandbox.config import SandboxConfig
from components.sandbox.process import run_sandboxed
from components.sandbox.workspace import Workspace, can_mount
from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks
from components.verifier.verdict import verify

SANDBOX = SandboxConfig()
ENV = EnvConfig(max_steps=400)
BOUND_S = 60  # a call that is not back by then is blocked (old code: forever)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-suite")
    generate_suite(root, 1, seed=3)
    tasks, errors = load_tasks(root)
    assert not errors
    return tasks[0]


def plant(root: Path) -> list[str]:
    """Hostile entries in root; their relative paths."""
    names = []

    def add(name: str | bytes, make) -> None:
        path = os.path.join(os.fsencode(root), os.fsencode(name))
        make(path)
        names.append(os.fsdecode(os.fsencode(name)))

    add("pipe.py", os.mkfifo)
    add("fifo", os.mkfifo)
    add("loop", lambda p: os.symlink("loop", p))
    add("a.py", lambda p: os.symlink("b.py", p))
    add("b.py", lambda p: os.symlink("a.py", p))
    add("link_to_pipe", lambda p: os.symlink("fifo", p))
    add(b"caf\xe9.py", lambda p: Path(os.fsdecode(p)).write_bytes(b"x = 1\n"))
    add(b"\xff\xfe", lambda p: Path(os.fsdecode(p)).write_bytes(b"\xff\xfe\x00binary"))
    add("bin.py", lambda p: Path(os.fsdecode(p)).write_bytes(b"x = '\xe9\xff'\n"))
    add("new\nline.py", lambda p: Path(os.fsdecode(p)).write_text("x = 1\n"))
    add("huge.txt", lambda p: Path(os.fsdecode(p)).write_bytes(b"a\n" * 1_500_000))

    def make_socket(p: bytes) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        s.close()

    add("sock", make_socket)
    if os.geteuid() == 0:
        add("dev", lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5)))  # zero
    os.mkdir(root / "d")
    add("d/up", lambda p: os.symlink("..", p))
    return names


def calls(names: list[str]) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [("search", {"pattern": "^(a+)+$"}),
                                   ("search", {"pattern": "(a|aa)*c", "path": "huge.txt"}),
                                   ("search", {"pattern": "x", "path": "\ud800"})]  # fmt: skip
    for rel in names:
        out += [
            ("read_file", {"path": rel}),
            ("search", {"pattern": "x", "path": rel}),
            ("edit_file", {"path": rel, "old": "x", "new": "y\udcff"}),
            ("apply_patch", {"patch": f"--- a/{rel}\n+++ b/{rel}\n@@ -1,1 +1,1 @@\n-a\n+b\n"}),
            ("apply_patch", {"patch": f"--- /dev/null\n+++ b/{rel}/x.py\n@@ -0,0 +1 @@\n+x\n"}),
        ]
    return out


def bounded(fn, *args):
    """fn(*args) in a thread; AssertionError if it is not back within BOUND_S."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        raise AssertionError(f"{fn.__name__}{args[1:3]!r} blocked for {BOUND_S} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def release_fifos(root: Path) -> None:
    """Open every FIFO for writing once, so a reader blocked on it returns."""
    for name in ("pipe.py", "fifo"):
        with contextlib.suppress(OSError):
            os.close(os.open(root / name, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("tool_set", ["free_form", "fix_search"])
def test_every_tool_on_a_hostile_tree_observes_and_the_episode_gets_a_verdict(task, tool_set):
    episode = EpisodeEnv(task, ENV.with_tool_set(tool_set), SANDBOX, policy_name="fuzz")
    root = episode.workspace.root
    names = plant(root)
    todo = calls(names)
    if tool_set == "fix_search":
        todo = [("list_fixes", {"path": rel}) for rel in names] + [("list_fixes", {})]
        todo += [("try_fix", {"id": "cmp-1"}), ("run_command", {"cmd": "ls"})]
    try:
        for tool, arguments in todo:
            event = bounded(episode.step, Action(tool, arguments))
            assert isinstance(event["observation"], str), (tool, arguments)
            event["observation"].encode("utf-8")  # a tokenizer can take it
        assert all(os.path.lexists(os.path.join(os.fsencode(root), os.fsencode(n)))
                   for n in names if n != "huge.txt")  # fmt: skip
        result = bounded(episode.finish)
    finally:
        release_fifos(root)
        episode.workspace.cleanup()  # also after a failure (a tmpfs of its own as root)
    assert result.status == "ok" and result.reward is not None, result
    assert not result.success and "test_tampering" in {f["category"] for f in result.safety_flags}


def test_the_verifier_on_a_hostile_tree_gives_the_agents_verdict(task, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(task.repo_dir, repo)
    plant(repo)
    v = bounded(verify, task, repo, ENV, SANDBOX)
    assert v.status == "ok" and not v.tests_passed
    assert {"pipe.py", "fifo", "sock"} <= set(v.tampered_files)


def test_run_episode_with_trees_made_by_commands_ends_with_a_verdict(task):
    """The same kinds of entry made by the agent's own commands, then the fix: a failed,
    flagged episode (the special files are tampering), never an exception."""

    class Maker:
        name = "hostile-maker"

        def act(self, t, events):
            plan = [
                Action("run_command", {"cmd": "python -c \"import os; os.mkfifo('p.py'); "
                                              "os.symlink('l', 'l'); "
                                              "open(b'n\\\\xe9.py', 'w').write('x=1')\""}),
                Action("search", {"pattern": "x"}),
                Action("read_file", {"path": "p.py"}),
                Action("apply_patch", {"patch": t.reference_patch() or ""}),
            ]  # fmt: skip
            done = sum(e["role"] == "assistant" for e in events)
            return plan[done] if done < len(plan) else Action("finish", {"summary": "done"})

    result = bounded(run_episode, task, Maker(), ENV, SANDBOX)
    assert result.status == "ok" and result.reward is not None
    assert "p.py" in result.tampered_files and not result.success


def test_a_catastrophic_regex_is_matched_in_linear_time(tmp_path):
    """`^(a+)+$` on 40 a's and a b backtracks 2^40 steps in Python's re (hours)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.txt").write_text("a" * 40 + "b\n" + "a" * 40 + "\n")
    with Workspace.create(tmp_path / "src", parent=tmp_path) as ws:
        r = bounded(execute_tool, ws, "search", {"pattern": "^(a+)+$"}, SANDBOX)
        assert r.ok and r.observation.startswith("x.txt:2:"), r.observation
        bad = execute_tool(ws, "search", {"pattern": "(a)\\1"}, SANDBOX)
        assert not bad.ok and "RE2 syntax" in bad.observation


def test_fifos_and_devices_are_never_opened_by_the_tools(tmp_path):
    (tmp_path / "src").mkdir()
    with Workspace.create(tmp_path / "src", parent=tmp_path) as ws:
        os.mkfifo(ws.root / "f.py")
        try:
            for tool, args in [("search", {"pattern": "x"}), ("read_file", {"path": "f.py"}),
                               ("apply_patch", {"patch": "--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n"
                                                         "-x\n+y\n"}),
                               ("edit_file", {"path": "f.py", "old": "x", "new": "y"})]:  # fmt: skip
                r = bounded(execute_tool, ws, tool, args, SANDBOX)
                assert tool == "search" or (not r.ok and "regular file" in r.observation), r
        finally:
            release_fifos(ws.root)


def test_apply_patch_refuses_a_hunk_search_over_limits(tmp_path):
    """A hunk whose search would compare millions of lines (4 Mi lines took 101 s) and a
    file over the size limit are refused with the limit named, before any search."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.txt").write_bytes(b"a\n" * (1 << 20))
    (tmp_path / "src" / "huge.txt").write_bytes(b"a" * (5 << 20))
    with Workspace.create(tmp_path / "src", parent=tmp_path) as ws:
        patch = "--- a/big.txt\n+++ b/big.txt\n@@ -1,4 +1,4 @@\n a\n a\n a\n-b\n+c\n"
        r = bounded(execute_tool, ws, "apply_patch", {"patch": patch}, SANDBOX)
        assert not r.ok and "line comparisons" in r.observation, r.observation
        r = execute_tool(ws, "apply_patch", {"patch": patch.replace("big", "huge")}, SANDBOX)
        assert not r.ok and "byte" in r.observation and "limit" in r.observation
        small = "--- a/big.txt\n+++ b/big.txt\n@@ -1,1 +1,1 @@\n-a\n+b\n"
        (ws.root / "big.txt").write_bytes(b"a\n" * 1000)
        assert execute_tool(ws, "apply_patch", {"patch": small}, SANDBOX).ok


def test_apply_patch_on_a_binary_file_is_a_failed_call(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "b.py").write_bytes(b"\xff\xfe\n")
    with Workspace.create(tmp_path / "src", parent=tmp_path) as ws:
        patch = "--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-x\n+y\n"
        r = execute_tool(ws, "apply_patch", {"patch": patch}, SANDBOX)
        assert not r.ok and r.error == "binary file"


@pytest.mark.skipif(not can_mount(), reason="may not mount a tmpfs (not root)")
def test_a_workspace_that_fills_up_fails_inside_itself_only(task, tmp_path):
    """The workspace is a tmpfs of its own: writing past its quota is ENOSPC there, the
    host's /tmp does not fill, and verification (and its control) still works."""
    free = shutil.disk_usage(tempfile_dir()).free
    with Workspace.create(task.repo_dir, quota_bytes=8 << 20) as ws:
        code = "import os\nfor i in range(64):\n    open(f'f{i}', 'wb').write(os.urandom(1 << 20))"
        cmd = run_sandboxed(["python", "-c", code], ws.root, SANDBOX)
        assert cmd.exit_code != 0 and "No space left on device" in cmd.output
        assert shutil.disk_usage(tempfile_dir()).free > free - (32 << 20)
        v = verify(task, ws.root, ENV, SANDBOX, cache=False)
        assert v.status == "ok" and not v.tests_passed
    assert not ws.root.exists()


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()
