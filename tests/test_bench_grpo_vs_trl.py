"""bench/grpo_vs_trl.py at a tiny budget through its main, on a tiny from-scratch policy:
both trainers run 2 steps, the table, plot and numbers are written, the ratio lines are
printed, each reward curve has one point per step, and the same batch through our update
and TRL's loss gives the same gradient. Nothing is timed here: the bench prints its wall
ratio, the test only checks it is there."""

from __future__ import annotations

import json

import pytest

from bench import grpo_vs_trl, grpo_vs_trl_task

STEPS = 2


def test_grpo_vs_trl_bench_runs_on_a_tiny_budget(tmp_path, capsys):
    out = tmp_path / "out"
    code = grpo_vs_trl.main([
        "--model", "tiny", "--steps", str(STEPS), "--group-size", "2",
        "--prompts-per-step", "2", "--eval-prompts", "4", "--eval-samples", "2",
        "--lora-r", "4", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    (table,) = out.glob("grpo-vs-trl-*.md")
    (numbers,) = out.glob("grpo-vs-trl-*.json")
    (plot,) = out.glob("grpo-vs-trl-*.png")
    assert plot.stat().st_size > 0
    assert table.read_text() in printed
    for line in ("- final held-out mean reward, ours / TRL's: ",
                 "- training mean reward of the last steps, ours / TRL's: ",
                 "- wall per step, ours / TRL's: "):  # fmt: skip
        assert line in printed.split(table.read_text())[-1]  # printed again after the table
    assert "- same batch, one update: gradient cosine " in table.read_text()
    results = json.loads(numbers.read_text())
    for name in ("ours", "trl"):
        run = results["runs"][name]
        assert len(run["mean_reward_per_step"]) == len(run["step_wall_s"]) == STEPS
        assert [len(r) for r in run["rewards"]] == [2 * 2] * STEPS  # prompts x G per step
        assert len(run["held_out"]) == 4
    assert results["ratios"]["wall_per_step"] > 0
    check = results["same_batch_gradients"]
    assert check["grad_norm_ours"] > 0 and check["cosine"] > 0.9999
    assert check["relative_difference"] < 1e-4
    for step in range(1, STEPS + 1):
        assert f"\n| {step} | " in table.read_text()


def test_the_reward_reads_the_last_integer():
    reward = grpo_vs_trl_task.last_number_reward
    assert reward("5 + 7 = 12", "12") == reward("12", "12") == 1.0
    assert reward("12 13", "12") == reward("The answer is", "12") == reward("112", "12") == 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "many"], "--steps: invalid"),
        (["--group-size", "1"], "--group-size: must be >= 2"),
        (["--loss-type", "ppo"], "--loss-type: invalid choice"),
        (["--model", "no/such/folder"], "--model: no/such/folder is not a HF checkpoint"),
        (["--lr", "0"], "--lr: must be positive"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        grpo_vs_trl.main([*argv, "--out", str(tmp_path / "out")])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
