"""Issue 44 item 7: apply_patch's work is bounded whatever the patch. The hunk search counts
the lines of files the same patch created earlier (a 73 KiB patch searched one for 20 s),
and no staged file may pass the file limit (nothing written, the file unchanged)."""

from __future__ import annotations

import time

import pytest

from components.env.tool_sets.shared import execute_tool
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import Workspace
from components.tasks.patching import (
    DEFAULT_MAX_FILE_BYTES,
    MAX_COMPARISONS,
    PatchError,
    apply_unified_diff,
)


def _create_then_search(lines: int) -> str:
    """The issue's shape: a file of 2 x `lines` lines created by the patch, then a hunk on
    it that matches nowhere, `lines` long (each of ~`lines` positions compares ~all)."""
    body = "".join("+a\n" for _ in range(2 * lines))
    context = "".join(" a\n" for _ in range(lines - 1))
    return (
        f"--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,{2 * lines} @@\n{body}"
        f"--- a/big.txt\n+++ b/big.txt\n@@ -1,{lines} +1,{lines} @@\n{context}-b\n+c\n"
    )


def test_a_search_over_a_file_the_patch_created_is_bounded(tmp_path):
    patch = _create_then_search(8_000)
    assert 60_000 < len(patch) < 100_000  # the 73 KiB argument
    start = time.process_time()
    with pytest.raises(PatchError, match="line comparisons"):
        apply_unified_diff(tmp_path, patch)
    spent = time.process_time() - start
    # Stopped at the budget: the full search is ~8k x 8k = 64M comparisons, 32 budgets.
    small = time.process_time()
    with pytest.raises(PatchError):
        apply_unified_diff(tmp_path, _create_then_search(1_000))  # 1M: within the budget, no match
    assert spent <= 10 * (time.process_time() - small) + 0.5
    assert not (tmp_path / "big.txt").exists()


def test_the_budget_counts_every_line_compared(tmp_path):
    with pytest.raises(PatchError, match="line comparisons"):
        apply_unified_diff(tmp_path, _create_then_search(400), max_comparisons=10_000)
    assert MAX_COMPARISONS >= 400 * 400  # an ordinary patch of a large module fits
    apply_unified_diff(tmp_path, _create_then_search(2)[: _create_then_search(2).index("--- a")])
    assert (tmp_path / "big.txt").read_text() == "a\na\na\na\n"


def test_a_staged_file_over_the_file_limit_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "m.py").write_text("x = 1\n")
    grow = "".join(f"+y{i} = {i}\n" for i in range(200))
    patch = (
        "--- a/m.py\n+++ b/m.py\n@@ -1 +1,201 @@\n x = 1\n" + grow
        + "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+z = 1\n"
    )  # fmt: skip
    with pytest.raises(PatchError, match="1024-byte file limit"):
        apply_unified_diff(tmp_path, patch, max_file_bytes=1024)
    assert (tmp_path / "m.py").read_text() == "x = 1\n" and not (tmp_path / "new.py").exists()
    assert apply_unified_diff(tmp_path, patch) == ["m.py", "new.py"]
    assert SandboxConfig().max_file_bytes == DEFAULT_MAX_FILE_BYTES


def test_the_tool_reports_the_bounded_search_in_one_line(tmp_path):
    (tmp_path / "repo").mkdir()
    ws = Workspace.create(tmp_path / "repo")
    try:
        result = execute_tool(ws, "apply_patch", {"patch": _create_then_search(8_000)},
                              SandboxConfig())  # fmt: skip
        assert not result.ok and result.error == "patch failed"
        assert "line comparisons" in result.observation and "\n" not in result.observation
        assert not (ws.root / "big.txt").exists()
    finally:
        ws.cleanup()


def test_the_tool_holds_the_sandboxs_own_file_limit(tmp_path):
    """apply_patch passes the episode's `max_file_bytes`, not the module default."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "m.py").write_text("x = 1\n")
    grow = "".join(f"+y{i} = {i}\n" for i in range(200))
    patch = "--- a/m.py\n+++ b/m.py\n@@ -1 +1,201 @@\n x = 1\n" + grow
    ws = Workspace.create(tmp_path / "repo")
    try:
        strict = execute_tool(
            ws, "apply_patch", {"patch": patch}, SandboxConfig(max_file_bytes=1024)
        )
        assert not strict.ok and "1024-byte file limit" in strict.observation
        assert (ws.root / "m.py").read_text() == "x = 1\n"
        assert execute_tool(ws, "apply_patch", {"patch": patch}, SandboxConfig()).ok
    finally:
        ws.cleanup()
