"""bench/rollout_throughput.py through its command line at a tiny budget: the engine's
generate calls and their bare replays sample the same tokens, and the table's three rows
(bare, engine calls, engine end to end) carry positive tokens/s and ratios, printed and
written to the output folder."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_rollout_throughput_bench_runs_on_a_tiny_budget(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "rollout_throughput", REPO / "bench" / "rollout_throughput.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        code = bench.main(["--tasks", "1", "--k", "2", "--batch", "2", "--steps", "1",
                           "--max-new-tokens", "8", "--tokenizer-bytes", "20000",
                           "--threads", "1", "--out", str(tmp_path)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    printed = capsys.readouterr().out
    sampled = re.search(r"(\d+) sampled tokens \(bare replay: (\d+)\)", printed)
    assert sampled and int(sampled[1]) > 0
    assert sampled[1] == sampled[2], "the bare replay must sample what the engine sampled"
    rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| ")]
    body = [r for r in rows[1:] if "---" not in r[0]]
    assert [r[0].removeprefix("| ").split(" (")[0] for r in body] == [
        "bare model.generate", "engine generate calls", "engine end to end"]  # fmt: skip
    for _, tokens_per_s, ratio in body:
        assert float(tokens_per_s.replace(",", "")) > 0
        assert float(ratio.removesuffix(" |")) > 0
    (written,) = tmp_path.glob("rollout-throughput-*.md")
    assert "| engine end to end (+tools, verify) |" in written.read_text()
