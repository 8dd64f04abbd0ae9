"""bench/grpo_sampling.py through its command line at a tiny budget: in-process and
`agentrl serve` sampling each train a LoRA GRPO run, the table has a row per engine with
the ratio to in-process, and it is written to the output folder (slow: starts `agentrl
serve` and runs two tiny GRPO runs; the vLLM engine is the same code path on real vLLM)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_grpo_sampling_bench_runs_on_a_tiny_budget(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("grpo_sampling",
                                                  REPO / "bench" / "grpo_sampling.py")  # fmt: skip
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    code = bench.main(["--engines", "in-process,agentrl-serve", "--iterations", "1", "--tasks",
                       "1", "--group", "2", "--max-new-tokens", "8", "--max-steps", "1",
                       "--lora-r", "4", "--threads", "1", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows if "---" not in row]
    assert names == ["engine", "in-process", "agentrl-serve"]
    assert rows[1].endswith("| **1.00x** |")  # in-process against itself
    (written,) = tmp_path.glob("grpo-sampling-*.md")
    assert "agentrl-serve" in written.read_text()


def test_an_unknown_engine_is_one_line():
    spec = importlib.util.spec_from_file_location("grpo_sampling",
                                                  REPO / "bench" / "grpo_sampling.py")  # fmt: skip
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit, match="unknown engine"):
        bench.main(["--engines", "sglang"])
