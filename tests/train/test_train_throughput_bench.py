"""bench/train_throughput.py through its command line with a tiny budget: every stage of
the comparison runs and prints its row, and the 1-vs-2-process and full-vs-LoRA tables
(slow: builds a tokenizer, samples, trains SFT/DPO, starts torchrun workers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "train_throughput", REPO / "bench" / "train_throughput.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_train_throughput_bench_smoke_writes_its_table(tmp_path, capsys):
    """Default tier, so the bench cannot rot between slow runs: sampling and the SFT step
    side by side with their bare loops, at a tiny budget; the table is written."""
    preset = str(REPO / "configs" / "cpu-demo.yaml")
    code = _bench().main(["--preset", preset, "--tasks", "1", "--k", "1", "--steps", "1",
                          "--max-new-tokens", "8", "--sft-tasks", "2", "--sft-steps", "1",
                          "--batch", "1", "--threads", "1", "--repeats", "1",
                          "--only", "sampling", "sft", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows if "---" not in row]
    assert [n.split(":")[0].split(" (")[0] for n in names] == [
        "what",
        "sampling",
        "sampling",
        "SFT step",
    ]
    for row in rows[2:]:  # ours / bare is a positive number
        assert float(row.split(" | ")[3].split()[0].rstrip("x")) > 0
    (table,) = tmp_path.glob("train-throughput-run-*.md")
    assert "| SFT step" in table.read_text()


@pytest.mark.slow
def test_train_throughput_bench_runs_on_a_tiny_budget(capsys, tmp_path):
    preset = str(REPO / "configs" / "cpu-demo.yaml")
    code = _bench().main(["--out", str(tmp_path), "--preset", preset, "--tasks", "1", "--k", "2", "--steps", "2",
                       "--max-new-tokens", "16", "--sft-tasks", "2", "--sft-steps", "2",
                       "--dpo-steps", "1", "--batch", "1", "--threads", "1", "--repeats", "2",
                       "--update-steps", "1", "--memory-hidden", "64", "--memory-layers", "1",
                       "--memory-steps", "1"])  # fmt: skip
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows if "---" not in row]
    assert [n.split(":")[0].split(" (")[0] for n in names] == [
        "what", "sampling", "sampling", "SFT step", "DPO step", "GRPO update",
        "update", "GRPO", "DPO", "SFT", "full", "lora"]  # fmt: skip
