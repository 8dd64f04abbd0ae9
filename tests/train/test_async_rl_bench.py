"""bench/async_rl.py through its command line at a tiny budget: both modes run, the table
has a row per mode and the ratio row, and it is written to the output folder (slow: starts
`agentrl serve` and runs four tiny GRPO runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_async_rl_bench_runs_on_a_tiny_budget(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("async_rl", REPO / "bench" / "async_rl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    code = bench.main(["--iterations", "2", "--repeats", "2", "--tasks", "1", "--group", "2",
                       "--max-new-tokens", "8", "--max-steps", "1", "--hidden", "32",
                       "--layers", "1", "--ppo-epochs", "1", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows if "---" not in row]
    assert names == ["mode", "sync", "async (max_staleness 1)", "**async / sync**"]
    (written,) = tmp_path.glob("async-rl-*.md")
    assert "x** |" in written.read_text()
