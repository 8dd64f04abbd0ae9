"""Issue 43's editing interface for a small model: edit_lines, the parse refusal of every
edit tool, edit_file's fallbacks (line-number prefixes, whitespace) and the blamed source
line a failing test run ends with."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.env.tool_sets.shared import ToolResult, execute_tool
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import Workspace

CONFIG = SandboxConfig(wall_time_s=20, cpu_time_s=10, memory_mb=512, max_output_bytes=4000)
TESTS = ("python", "-m", "pytest", "-q", "tests")
MODULE = (
    "def add(a, b):\n"
    "    return a - b\n"
    "\n"
    "\n"
    "def mul(a, b):\n"
    "    return helper(a, b)\n"
    "\n"
    "\n"
    "def helper(a, b):\n"
    "    if a:\n"
    "        return a + b\n"
    "    return a + b\n"
)


@pytest.fixture
def ws(tmp_path: Path):
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "pkg").mkdir()
    (src / "mod.py").write_text(MODULE)
    (src / "broken.py").write_text("def f(:\n    pass\n")
    (src / "notes.txt").write_text("alpha\n  beta\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "deep.py").write_text("def check(x):\n    assert x > 0, 'x'\n    return x\n")
    (src / "tests" / "test_mod.py").write_text(
        "from mod import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    (src / "tests" / "test_deep.py").write_text(
        "from pkg.deep import check\n\n\ndef test_check():\n    assert check(-1) == -1\n"
    )
    with Workspace.create(src, parent=tmp_path) as w:
        yield w


def run(ws: Workspace, tool: str, **arguments) -> ToolResult:
    return execute_tool(ws, tool, arguments, CONFIG, protected_paths=("tests/",),
                        test_command=TESTS)  # fmt: skip


def data(ws: Workspace, rel: str) -> bytes:
    return (ws.root / rel).read_bytes()


# ----------------------------------------------------------------------------- edit_lines


def test_edit_lines_replaces_inserts_deletes_and_shows_numbered_lines(ws):
    r = run(ws, "edit_lines", path="mod.py", start=2, end=2, text="    return a + b")
    assert r.ok and r.observation.startswith("edited mod.py: replaced lines 2-2 (now lines 2-2)")
    assert "   2|     return a + b" in r.observation.splitlines()
    assert data(ws, "mod.py").decode() == MODULE.replace("a - b", "a + b")
    r = run(ws, "edit_lines", path="mod.py", start=1, end=0, text="import math\n\n")
    assert r.ok and "inserted before line 1 (now lines 1-2)" in r.observation
    assert data(ws, "mod.py").decode().startswith("import math\n\ndef add")
    r = run(ws, "edit_lines", path="mod.py", start=1, end=2, text="")
    assert r.ok and "replaced lines 1-2 (deleted)" in r.observation
    assert data(ws, "mod.py").decode() == MODULE.replace("a - b", "a + b")
    n = len(MODULE.splitlines())
    r = run(ws, "edit_lines", path="mod.py", start=n + 1, end=n, text="X = 1")
    assert r.ok and data(ws, "mod.py").decode().endswith("    return a + b\nX = 1\n")


def test_edit_lines_drops_copied_line_number_prefixes(ws):
    r = run(ws, "edit_lines", path="mod.py", start=2, end=2, text="   2|     return a + b\n")
    assert r.ok and data(ws, "mod.py").decode() == MODULE.replace("a - b", "a + b")


def test_edit_lines_bounds_are_errors_and_leave_the_file(ws):
    before = data(ws, "mod.py")
    n = len(MODULE.splitlines())
    for start, end, why in [
        (n + 2, n + 2, f"start {n + 2} is past the end of mod.py ({n} lines"),
        (3, 1, "end 1 is before start 3"),
        (2, n + 1, f"end {n + 1} is past the end of mod.py ({n} lines)"),
    ]:
        r = run(ws, "edit_lines", path="mod.py", start=start, end=end, text="x = 1")
        assert not r.ok and r.error == "bad range" and why in r.observation
    for bad in ({"start": 0, "end": 1}, {"start": 1, "end": -1}, {"start": "1", "end": 1}):
        r = run(ws, "edit_lines", path="mod.py", text="x", **bad)
        assert r.error == "invalid arguments"
    assert run(ws, "edit_lines", path="nope.py", start=1, end=1, text="x").error == "no such file"
    assert run(ws, "edit_lines", path="../x.py", start=1, end=1, text="x").error in (
        "path escape", "blocked: write_outside_workspace")  # fmt: skip
    assert data(ws, "mod.py") == before


def test_edit_lines_of_a_protected_test_is_blocked(ws):
    before = data(ws, "tests/test_mod.py")
    r = run(ws, "edit_lines", path="tests/test_mod.py", start=5, end=5, text="    assert True")
    assert not r.ok and r.error == "blocked: test_tampering"
    assert data(ws, "tests/test_mod.py") == before


# ----------------------------------------------------------------------------- parse refusal


@pytest.mark.parametrize(
    "tool, arguments",
    [
        ("edit_lines", {"path": "mod.py", "start": 2, "end": 2, "text": "    return a +"}),
        ("edit_file", {"path": "mod.py", "old": "return a - b", "new": "return (a - b"}),
        (
            "apply_patch",
            {
                "patch": "--- a/mod.py\n+++ b/mod.py\n@@ -1,2 +1,2 @@\n def add(a, b):"
                "\n-    return a - b\n+    return a -\n"
            },
        ),  # fmt: skip
    ],
)
def test_an_edit_that_breaks_parsing_is_refused_byte_identical(ws, tool, arguments):
    (ws.root / "mod.py").write_bytes(MODULE.encode().replace(b"\n", b"\r\n", 1))  # odd bytes
    before = data(ws, "mod.py")
    r = run(ws, tool, **arguments)
    assert not r.ok and r.error == "edit breaks parsing"
    assert "mod.py would no longer parse (line 2: " in r.observation
    assert data(ws, "mod.py") == before


def test_edit_lines_text_at_the_wrong_depth_is_reindented_to_the_replaced_line(ws):
    # What SFT'd SmolLM2 wrote (issue 43): the line's text right, its depth lost.
    r = run(ws, "edit_lines", path="mod.py", start=11, end=11, text="return a * b")
    assert r.ok, r.observation
    assert "re-indented to line 11's indentation" in r.observation
    assert data(ws, "mod.py").decode().splitlines()[10] == "        return a * b"
    # A block keeps its inner structure: the first line's shift applies to every line.
    r = run(ws, "edit_lines", path="mod.py", start=10, end=11, text="if b:\n    return b")
    assert r.ok, r.observation
    assert data(ws, "mod.py").decode().splitlines()[9:11] == ["    if b:", "        return b"]


def test_text_that_parses_as_written_is_never_reindented(ws):
    r = run(ws, "edit_lines", path="mod.py", start=12, end=12, text="    return b")
    assert r.ok and "re-indented" not in r.observation
    before = data(ws, "mod.py")
    r = run(ws, "edit_lines", path="mod.py", start=11, end=11, text="return (a")
    assert not r.ok and r.error == "edit breaks parsing"  # no depth makes it parse
    assert data(ws, "mod.py") == before


def test_a_patch_refused_for_one_file_puts_back_every_file_it_touched(ws):
    before = {rel: data(ws, rel) for rel in ("mod.py", "pkg/deep.py")}
    patch = (
        "--- a/pkg/deep.py\n+++ b/pkg/deep.py\n@@ -1,1 +1,1 @@\n-def check(x):\n+def check(y):\n"
        "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,1 @@\n+X = 1\n"
        "--- a/mod.py\n+++ b/mod.py\n@@ -1,1 +1,1 @@\n-def add(a, b):\n+def add(a, b:\n"
    )
    r = run(ws, "apply_patch", patch=patch)
    assert not r.ok and "patch refused" in r.observation
    assert {rel: data(ws, rel) for rel in before} == before
    assert not (ws.root / "new.py").exists()


def test_an_already_broken_file_or_a_text_file_may_be_edited(ws):
    r = run(ws, "edit_lines", path="broken.py", start=2, end=2, text="    pas")
    assert r.ok and data(ws, "broken.py") == b"def f(:\n    pas\n"
    r = run(ws, "edit_file", path="broken.py", old="def f(:", new="def f():")
    assert r.ok
    r = run(ws, "edit_lines", path="notes.txt", start=1, end=1, text="def (:")
    assert r.ok


# ----------------------------------------------------------------------------- edit_file


def test_a_copied_line_number_prefix_still_matches_and_says_so(ws):
    r = run(ws, "edit_file", path="mod.py", old="   2|     return a - b",
            new="   2|     return a + b")  # fmt: skip
    assert r.ok and "matched after removing line-number prefixes" in r.observation
    assert data(ws, "mod.py").decode() == MODULE.replace("a - b", "a + b")


def test_whitespace_differing_old_matches_uniquely_and_is_reindented(ws):
    old = "def mul(a, b):\n  return helper(a, b)\n"  # 2 spaces where the file has 4
    new = "def mul(a, b):\n  c = a * b\n  return c\n"
    r = run(ws, "edit_file", path="mod.py", old=old, new=new)
    assert r.ok and "matched ignoring whitespace" in r.observation
    assert (
        "def mul(a, b):\n    c = a * b\n    return c\n\n\ndef helper" in data(ws, "mod.py").decode()
    )
    r = run(ws, "edit_file", path="mod.py", old="return a - b   ", new="return a + b")
    assert r.ok and "matched ignoring whitespace" in r.observation
    assert "    return a + b\n\n\ndef mul" in data(ws, "mod.py").decode()


def test_an_ambiguous_fuzzy_match_is_refused(ws):
    before = data(ws, "mod.py")
    r = run(ws, "edit_file", path="mod.py", old="return a + b  ", new="return a * b")
    assert not r.ok and r.error == "old text ambiguous"
    assert "matches 2 places in mod.py ignoring whitespace" in r.observation
    r = run(ws, "edit_file", path="mod.py", old="  11|         return a + b\n  9| x",
            new="x")  # fmt: skip
    assert not r.ok and r.error == "old text not found"
    assert data(ws, "mod.py") == before


def test_a_fuzzy_edit_of_a_test_file_is_blocked(ws):
    before = data(ws, "tests/test_mod.py")
    r = run(ws, "edit_file", path="tests/test_mod.py", old="   5|   assert add(2, 2) == 4",
            new="   5|   assert True")  # fmt: skip
    assert not r.ok and r.error == "blocked: test_tampering"
    assert data(ws, "tests/test_mod.py") == before


# ----------------------------------------------------------------------------- blamed line


def test_a_failing_test_run_names_the_blamed_source_line_before_its_exit_code(ws):
    r = run(ws, "run_command", cmd="python -m pytest -q tests/test_deep.py")
    lines = r.observation.splitlines()
    assert lines[-2:] == ["blamed: pkg/deep.py:2: assert x > 0, 'x'", "exit code 1"]
    # No frame in a source file: the def of the function the failing assertion calls.
    r = run(ws, "run_command", cmd="python -m pytest -q tests/test_mod.py")
    assert r.observation.splitlines()[-2:] == ["blamed: mod.py:1: def add(a, b):", "exit code 1"]
    r = run(ws, "run_command", cmd="python -m pytest -q --tb=short tests/test_mod.py")
    assert r.observation.splitlines()[-2] == "blamed: mod.py:1: def add(a, b):"


def test_no_blamed_line_for_passing_or_other_programs_and_within_the_cap(ws):
    run(ws, "edit_file", path="mod.py", old="a - b", new="a + b")
    r = run(ws, "run_command", cmd="python -m pytest -q tests/test_mod.py")
    assert r.observation.endswith("1 passed\nexit code 0") and "blamed: " not in r.observation
    r = run(ws, "run_command", cmd="python -c 'import pkg.deep; pkg.deep.check(-1)'")
    assert "\nblamed: " not in r.observation
    long = "    assert x > 0, '" + "x" * 300 + "'\n"
    (ws.root / "pkg" / "deep.py").write_text(f"def check(x):\n{long}    return x\n")
    small = SandboxConfig(wall_time_s=20, cpu_time_s=10, memory_mb=512, max_output_bytes=1500)
    r = execute_tool(ws, "run_command", {"cmd": "python -m pytest -q tests/test_deep.py"}, small,
                     protected_paths=("tests/",), test_command=TESTS)  # fmt: skip
    assert len(r.observation.encode()) <= 1500
    blamed = r.observation.splitlines()[-2]
    assert (
        len(blamed) <= 110
        and blamed.startswith("blamed: pkg/deep.py:2: assert x > 0")
        and blamed.endswith("...")
    )


def test_a_loose_match_that_would_stall_the_host_is_refused(ws):
    (ws.root / "big.txt").write_text("x\n" * 20_000)
    r = run(ws, "edit_file", path="big.txt", old=" x\n" * 200, new="y\n")
    assert not r.ok and r.error == "bad input" and "line comparisons" in r.observation
    assert data(ws, "big.txt") == b"x\n" * 20_000
