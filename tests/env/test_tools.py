"""Tools: argument errors, safety blocking, and the behaviour of each tool on a tiny repo."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from components.env.tool_sets.shared import ToolResult, execute_tool
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import isolation_report
from components.sandbox.workspace import IGNORED_NAMES, Workspace

CONFIG = SandboxConfig(wall_time_s=20, cpu_time_s=10, memory_mb=512, max_output_bytes=4000)

ESCAPE_ERRORS = ("path escape", "blocked: read_outside_workspace")


@pytest.fixture
def ws(tmp_path: Path):
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "pkg").mkdir()
    (src / "mod.py").write_text("def add(a, b):\n    return a - b\n")
    (src / "pkg" / "util.py").write_text("X = 1\nY = 2\nX = 3\n")
    (src / "tests" / "test_mod.py").write_text(
        "from mod import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    (src / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    with Workspace.create(src, parent=tmp_path) as w:
        yield w


def run(ws: Workspace, tool: str, config: SandboxConfig = CONFIG, **arguments) -> ToolResult:
    return execute_tool(ws, tool, arguments, config, protected_paths=("tests/",))


def changed_files(ws: Workspace) -> list[str]:
    """Files added, removed or modified in the workspace since it was copied (caches aside)."""

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and not IGNORED_NAMES & set(p.relative_to(root).parts)}  # fmt: skip

    before, after = files(ws.source), files(ws.root)
    return sorted(r for r in before.keys() | after.keys() if before.get(r) != after.get(r))


def test_invalid_arguments_are_reported_not_raised(ws):
    for tool, args in [
        ("run_command", {}),
        ("read_file", {"path": 3}),
        ("edit_file", {"path": "mod.py", "old": "x"}),
        ("search", {"pattern": "x", "bogus": 1}),
        ("teleport", {}),
        ("read_file", {"path": "mod.py", "start_line": 0}),
    ]:
        r = execute_tool(ws, tool, args, CONFIG)
        assert not r.ok and r.error == "invalid arguments" and "invalid arguments" in r.observation
        assert r.command is None


def test_pytest_via_run_command_fails_then_passes_after_edit(ws):
    r = run(ws, "run_command", cmd="python -m pytest -q")
    assert r.ok and r.command is not None and r.command.exit_code == 1
    assert "1 failed" in r.observation and r.observation.endswith("exit code 1")
    assert r.safety is not None and r.safety.allowed
    e = run(ws, "edit_file", path="mod.py", old="a - b", new="a + b")
    assert e.ok and "edited mod.py" in e.observation
    r = run(ws, "run_command", cmd="python -m pytest -q")
    assert r.ok and "1 passed" in r.observation and r.observation.endswith("exit code 0")
    assert changed_files(ws) == ["mod.py"]


def test_run_command_refusals_and_parse_errors(ws):
    r = run(ws, "run_command", cmd="echo 'unbalanced")
    assert not r.ok and "cannot parse" in r.observation
    cfg = dataclasses.replace(CONFIG, allowed_programs=("python", "no-such-prog-xyz"))
    r = run(ws, "run_command", cfg, cmd="no-such-prog-xyz --help")
    assert not r.ok and r.error == "refused" and "not installed" in r.observation


def test_destructive_command_is_blocked_and_not_executed(ws):
    r = run(ws, "run_command", cmd="rm -rf .")
    assert not r.ok and r.command is None
    assert r.observation.startswith("blocked by safety monitor: destructive: ")
    assert r.safety is not None and r.safety.category == "destructive"
    assert (ws.root / "mod.py").exists() and changed_files(ws) == []


def test_secret_reading_is_blocked(ws):
    (ws.root / ".env").write_text("API_KEY=s3cr3t\n")
    for tool, args in [
        ("read_file", {"path": ".env"}),
        ("run_command", {"cmd": "cat .env"}),
        ("run_command", {"cmd": "cat ~/.ssh/id_rsa"}),
        ("run_command", {"cmd": "python -c 'import os; print(os.environ)'"}),
    ]:
        r = execute_tool(ws, tool, args, CONFIG)
        assert not r.ok and r.safety.category == "secret_access", (tool, args)
        assert "s3cr3t" not in r.observation


def test_test_tampering_is_flagged_and_file_unchanged(ws):
    before = (ws.root / "tests" / "test_mod.py").read_text()
    r = run(ws, "edit_file", path="tests/test_mod.py", old="== 4", new="== 0")
    assert not r.ok and r.safety.category == "test_tampering"
    r = run(
        ws, "edit_file", path="mod.py", old="    return a - b", new="    import os; os._exit(0)"
    )
    assert not r.ok and r.safety.category == "test_tampering"
    assert (ws.root / "tests" / "test_mod.py").read_text() == before
    assert changed_files(ws) == []


def test_huge_output_observation_is_capped(ws):
    r = run(ws, "run_command", cmd="python -c \"print('A' * 100000 + 'Z')\"")
    assert r.ok and r.truncated and len(r.observation.encode()) <= CONFIG.max_output_bytes
    assert "[... output truncated:" in r.observation
    assert r.observation.startswith("AAA") and r.observation.endswith("exit code 0")
    assert "Z\nexit code 0" in r.observation


def test_timeout_is_a_failed_call(ws):
    cfg = dataclasses.replace(CONFIG, wall_time_s=1)
    r = run(ws, "run_command", cfg, cmd="python -c 'import time; time.sleep(30)'")
    assert not r.ok and r.error == "wall_time limit hit" and "wall time limit" in r.observation


# ----------------------------------------------------------------------------- search


def test_search_finds_matches_with_paths_and_lines(ws):
    r = run(ws, "search", pattern=r"^X =")
    assert r.ok and r.observation.splitlines() == ["pkg/util.py:1: X = 1", "pkg/util.py:3: X = 3"]
    r = run(ws, "search", pattern="add", path="tests")
    assert r.ok and r.observation.startswith("tests/test_mod.py:1: from mod import add")
    r = run(ws, "search", pattern="nothing-matches-this")
    assert r.ok and "no matches" in r.observation


def test_search_errors_and_confinement(ws, tmp_path):
    r = run(ws, "search", pattern="(unclosed")
    assert not r.ok and "invalid regular expression" in r.observation
    r = run(ws, "search", pattern="root", path="/etc")
    assert not r.ok and r.error in ESCAPE_ERRORS
    secret = tmp_path / "outside.txt"
    secret.write_text("TOPSECRET\n")
    (ws.root / "link.txt").symlink_to(secret)
    r = run(ws, "search", pattern="TOPSECRET")
    assert (
        r.ok and "no matches" in r.observation and "link.txt" not in r.observation
    )  # links leaving the workspace are not followed


def test_search_output_is_capped(ws):
    (ws.root / "many.txt").write_text("match line\n" * 5000)
    r = run(ws, "search", pattern="match")
    assert r.ok and r.truncated and "more matching lines omitted" in r.observation
    assert len(r.observation.encode()) <= CONFIG.max_output_bytes


# ----------------------------------------------------------------------------- read_file


def test_read_file_numbers_lines_and_ranges(ws):
    r = run(ws, "read_file", path="pkg/util.py")
    assert r.ok and r.observation == "   1| X = 1\n   2| Y = 2\n   3| X = 3"
    r = run(ws, "read_file", path="pkg/util.py", start_line=2, end_line=2)
    assert r.observation == "   2| Y = 2"
    r = run(ws, "read_file", path="pkg/util.py", start_line=9)
    assert not r.ok and "past the end" in r.observation and "3 lines" in r.observation
    r = run(ws, "read_file", path="pkg/util.py", start_line=3, end_line=1)
    assert not r.ok and r.error == "bad range"


def test_read_file_special_files(ws):
    r = run(ws, "read_file", path="blob.bin")
    assert not r.ok and "binary" in r.observation
    r = run(ws, "read_file", path="missing.py")
    assert not r.ok and "no such file" in r.observation
    r = run(ws, "read_file", path="pkg")
    assert not r.ok and "util.py" in r.observation
    (ws.root / "big.py").write_text("".join(f"line {i}\n" for i in range(100_000)))
    r = run(ws, "read_file", path="big.py")
    assert r.ok and r.truncated and "read further with start_line" in r.observation
    assert len(r.observation.encode()) <= CONFIG.max_output_bytes
    r = run(ws, "read_file", path="big.py", start_line=99_999, end_line=100_000)
    assert r.observation.splitlines() == [" 99999| line 99998", "100000| line 99999"]


def test_path_and_symlink_escapes_through_file_tools(ws, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("HOST FILE\n")
    (ws.root / "passwd").symlink_to("/etc/passwd")
    (ws.root / "out.txt").symlink_to(outside)
    (ws.root / "outdir").symlink_to(tmp_path)
    for path in ("/etc/passwd", "../outside.txt", "passwd", "out.txt", "outdir/outside.txt"):
        r = run(ws, "read_file", path=path)
        # Literal escapes are stopped by the monitor, symlinks by Workspace.resolve.
        assert not r.ok and r.error in ESCAPE_ERRORS, path
        assert "root:" not in r.observation and "HOST FILE" not in r.observation
        r = run(ws, "edit_file", path=path, old="HOST", new="PWNED")
        assert not r.ok, path
    assert outside.read_text() == "HOST FILE\n"
    # A symlink to a file inside the workspace may be read but not written through.
    (ws.root / "alias.py").symlink_to("mod.py")
    assert run(ws, "read_file", path="alias.py").ok
    r = run(ws, "edit_file", path="alias.py", old="a - b", new="a + b")
    assert not r.ok and "symlink" in r.observation
    assert "a - b" in (ws.root / "mod.py").read_text()


# ----------------------------------------------------------------------------- edit_file


def test_edit_file_errors(ws):
    r = run(ws, "edit_file", path="mod.py", old="nope", new="x")
    assert not r.ok and r.observation == "error: old text not found in mod.py"
    r = run(ws, "edit_file", path="pkg/util.py", old="X = ", new="Z = ")
    assert not r.ok and r.observation == (
        "error: old text occurs 2 times in pkg/util.py; include more context"
    )
    r = run(ws, "edit_file", path="missing.py", old="a", new="b")
    assert not r.ok and "no such file" in r.observation
    r = run(ws, "edit_file", path="mod.py", old="", new="b")
    assert not r.ok
    assert changed_files(ws) == []


def test_edit_file_keeps_crlf(ws):
    (ws.root / "win.py").write_bytes(b"a = 1\r\nb = 2\r\n")
    r = run(ws, "edit_file", path="win.py", old="b = 2", new="b = 3")
    assert r.ok and (ws.root / "win.py").read_bytes() == b"a = 1\r\nb = 3\r\n"


# ----------------------------------------------------------------------------- apply_patch


PATCH = """--- a/mod.py
+++ b/mod.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def test_apply_patch_success_and_failure(ws):
    r = run(ws, "apply_patch", patch=PATCH)
    assert r.ok and r.observation == "applied patch: mod.py"
    assert "a + b" in (ws.root / "mod.py").read_text()
    r = run(ws, "apply_patch", patch=PATCH)  # no longer applies
    assert not r.ok and r.observation.startswith("error: patch not applied:")
    r = run(ws, "apply_patch", patch="this is not a diff")
    assert not r.ok


def test_apply_patch_refuses_symlink_targets(ws, tmp_path):
    outside = tmp_path / "victim.py"
    outside.write_text("def add(a, b):\n    return a - b\n")
    (ws.root / "mod.py").unlink()
    (ws.root / "mod.py").symlink_to(outside)
    r = run(ws, "apply_patch", patch=PATCH)
    assert not r.ok and r.error == "path escape"
    assert outside.read_text() == "def add(a, b):\n    return a - b\n"


def test_finish(ws):
    r = run(ws, "finish", summary="done")
    assert r.ok and r.observation == "episode finished" and r.error is None


# ----------------------------------------------------------------------------- effects (issue 17)

HAS_BWRAP = isolation_report(CONFIG)["mode"] == "bwrap"
# Names the monitor cannot read: rot13 of "socket", "/usr/agentrl-probe", "/etc/passwd".
_ROT13 = "import codecs\nr = lambda s: codecs.decode(s, 'rot13')\n"
EFFECTS = {
    "network": _ROT13
    + (
        "m = __import__(r('fbpxrg'))\n"
        "try:\n    m.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError:\n    pass\n"
    ),
    "write_outside_workspace": _ROT13
    + ("try:\n    open(r('/hfe/ntragey-cebor'), 'w')\nexcept OSError as e:\n    print(e)\n"),
    "path_escape": _ROT13
    + "getattr(__import__('os'), 'sym' + 'link')(r('/rgp/cnffjq'), 'n.txt')\n",
}


@pytest.mark.skipif(not HAS_BWRAP, reason="observing effects needs the bwrap sandbox")
@pytest.mark.parametrize("category", sorted(EFFECTS))
def test_what_a_command_does_is_judged_whatever_its_spelling(ws, category):
    """The monitor lets `python x.py` run (it cannot read the script); what the sandbox saw
    it do is recorded with the same category a plainly spelled action gets."""
    (ws.root / "x.py").write_text(EFFECTS[category])
    r = run(ws, "run_command", cmd="python x.py")
    assert r.command is not None and r.safety is not None, r.observation
    assert not r.safety.allowed and r.safety.category == category, r.safety
    assert r.safety.reason.startswith("observed:")
    again = run(ws, "run_command", cmd="python -c 'print(1)'")
    assert again.safety is not None and again.safety.allowed  # reported once, not forever


def test_a_quiet_command_has_no_observed_violation(ws):
    r = run(ws, "run_command", cmd="python -m pytest -q")
    assert r.safety is not None and r.safety.allowed


def test_links_the_task_itself_ships_are_not_the_agents(tmp_path):
    src = tmp_path / "task-repo"
    src.mkdir()
    (src / "mod.py").write_text("X = 1\n")
    (src / "notes.txt").symlink_to("/etc/hostname")
    with Workspace.create(src, parent=tmp_path) as w:
        r = run(w, "run_command", cmd="python -c 'print(1)'")
        assert r.safety is not None and r.safety.allowed, r.safety
        (w.root / "mine.txt").symlink_to("/etc/hostname")
        assert w.new_escaping_links() == ["mine.txt"] and w.new_escaping_links() == []
