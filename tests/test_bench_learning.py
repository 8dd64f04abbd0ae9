"""bench/learning.py's paired comparison: hand-checked differences and interval sanity."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_learning", Path(__file__).resolve().parents[1] / "bench" / "learning.py"
)
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def test_paired_difference_is_the_mean_of_per_task_differences():
    a = {"t1": True, "t2": True, "t3": False, "t4": True}
    b = {"t1": False, "t2": True, "t3": False, "t4": False, "t5": True}  # t5 not shared
    mean, (lo, hi) = learning.paired_difference(a, b)
    assert mean == pytest.approx(0.5)  # (+1 + 0 + 0 + 1) / 4
    assert -1.0 <= lo <= mean <= hi <= 1.0
    same, (lo, hi) = learning.paired_difference(a, a)
    assert same == 0.0 and lo == hi == 0.0
    assert learning.paired_difference(a, {"x": True}) is None


def test_interval_excludes_zero_only_for_a_consistent_gain():
    n = 60
    better = {f"t{i}": i % 2 == 0 for i in range(n)}  # 50%
    worse = {f"t{i}": i % 6 == 0 for i in range(n)}  # 17%, a subset of better's wins
    _, (lo, _) = learning.paired_difference(better, worse)
    assert lo > 0
    _, (_, hi) = learning.paired_difference(worse, better)
    assert hi < 0
    shifted = {f"t{i}": i % 2 == 1 for i in range(n)}  # 50% too, on the other tasks
    _, (lo, hi) = learning.paired_difference(shifted, better)
    assert lo < 0 < hi


def _row(method, split, wins):
    return {"method": method, "split": split, "pass1": sum(wins.values()) / len(wins),
            "pass1_by_task": wins}  # fmt: skip


def test_best_learned_is_chosen_on_val_and_compared_per_split_with_the_searches():
    n = 40
    rows = [
        _row("sft", "val", {f"v{i}": i < 10 for i in range(n)}),
        _row("sft+rs", "val", {f"v{i}": i < 30 for i in range(n)}),
        _row("sft", "quixbugs", {f"q{i}": True for i in range(6)}),  # better, but not on val
        _row("sft+rs", "quixbugs", {f"q{i}": i < 2 for i in range(6)}),
        _row("prior-fixes", "val", {f"v{i}": i < 5 for i in range(n)}),
        _row("random-fixes", "val", {f"v{i}": i < 30 for i in range(n)}),
        _row("prior-fixes", "quixbugs", {f"q{i}": i < 3 for i in range(6)}),
    ]
    assert learning.best_learned(rows) == "sft+rs"
    text = learning.comparisons(rows)
    lines = {tuple(c.strip() for c in ln.split("|")[1:3]): ln for ln in text.splitlines()}
    assert "+62.5 pts" in lines[("val", "prior-fixes")]  # 30/40 - 5/40, paired
    assert lines[("val", "prior-fixes")].endswith("| yes, above |")
    assert "+0.0 pts [+0.0, +0.0]" in lines[("val", "random-fixes")]  # same tasks won
    assert lines[("val", "random-fixes")].endswith("| no |")
    assert "-16.7 pts" in lines[("quixbugs", "prior-fixes")]  # 2/6 - 3/6
    assert ("quixbugs", "random-fixes") not in lines  # not evaluated there
    assert learning.comparisons([rows[-1]]) == "(no learned method evaluated on val)"


def test_learning_bench_runs_on_a_tiny_budget(tmp_path):
    """The whole bench at a tiny budget, so it cannot rot: a scripted search, SFT and GRPO
    sampling asynchronously on `agentrl serve` (issue 20's comparison), evaluated."""
    out = tmp_path / "run"
    tiny = ["--n-tasks", "12", "--expert-limit", "3", "--sft-steps", "2", "--hidden-size", "32",
            "--layers", "1", "--grpo-iterations", "1", "--grpo-tasks", "1", "--grpo-group", "2",
            "--max-steps", "2", "--max-new-tokens", "24", "--eval-limit", "1", "--k", "1",
            "--passk-limit", "1", "--splits", "val"]  # fmt: skip
    methods = "prior-fixes,sft,sft+grpo-async"
    assert learning.main(["--out", str(out), "--methods", methods, *tiny]) == 0
    report = (out / "results.md").read_text()
    for method in methods.split(","):
        assert f"| {method} | val | 1 |" in report
    result = learning.json.loads((out / "results.json").read_text())
    assert (Path(result["policies"]["sft+grpo-async"]) / "config.json").exists()
    assert "best learned method" in report
    # Evaluate the same policies again (say, on a split converted later) without training.
    again = tmp_path / "again"
    argv = ["--out", str(again), "--reuse-training", str(out), "--methods", "prior-fixes,sft",
            "--splits", "quixbugs", "--eval-limit", "1", "--k", "1", "--passk-limit", "1"]  # fmt: skip
    assert learning.main(argv) == 0
    report = (again / "results.md").read_text()
    assert "| sft | quixbugs | 1 |" in report and "| sft+grpo-async |" not in report
    assert "training reused from" in report and "sft_steps=2" in report  # what trained them
    sft_row = next(line for line in report.splitlines() if line.startswith("| sft | quixbugs"))
    first = (out / "results.md").read_text().splitlines()
    sft_first = next(line for line in first if line.startswith("| sft | val"))
    assert sft_row.split(" | ")[7] == sft_first.split(" | ")[7]  # training CPU, carried over
