"""bench/train_scale.py's two tables at a tiny budget, through their real worker processes:
full vs LoRA SFT (two `train_scale.py --memory` processes) and GRPO/DPO updates with 1 vs 2
torchrun processes (slow: four torchrun launches). Each row must carry numbers, and what
the comparison rests on must hold: LoRA trains fewer parameters than full fine-tuning of
the same model, and 1 and 2 processes update on the same tokens.

On a GPU the memory worker measures CUDA's peak allocation instead of the CPU's peak RSS
(tests/gpu covers CUDA paths); these tests run the CPU path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_bench():
    spec = importlib.util.spec_from_file_location("train_scale", REPO / "bench" / "train_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _table(lines: list[str]) -> list[list[str]]:
    """The body rows of a markdown table, split into cells."""
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| ")]
    return [r for r in rows[1:] if not r[0].startswith("---")]


def _number(cell: str) -> float:
    return float(cell.split(" (")[0].replace(",", ""))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One generated task, its oracle transcript, and a tiny policy whose tokenizer is
    trained on it (saved: the workers load them from disk)."""
    from components.env.batch_eval import EvalConfig, evaluate_policy
    from components.env.config import EnvConfig
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy
    from components.sandbox.config import SandboxConfig
    from components.scripted.registry import make_policy
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    root = tmp_path_factory.mktemp("train_scale")
    generate_suite(root / "tasks", 3, 0)
    tasks = load_tasks(root / "tasks", split="train")[0][:1]
    expert = evaluate_policy(tasks, lambda: make_policy("oracle"), EnvConfig(),
                             SandboxConfig(), EvalConfig(workers=1))  # fmt: skip
    records = [r.record for r in expert]
    config = PolicyConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                          intermediate_size=64, vocab_size=512, tokenizer_stdlib_bytes=20_000,
                          max_position_embeddings=4096)  # fmt: skip
    model, tokenizer = build_policy(config, records=records)
    save_policy(model, tokenizer, root / "policy")
    return {"root": root, "tasks": tasks, "records": records, "model": model,
            "tokenizer": tokenizer}  # fmt: skip


def test_lora_table_on_a_tiny_budget(tiny, tmp_path):
    records_file = tmp_path / "records.jsonl"
    records_file.write_text("\n".join(json.dumps(r) for r in tiny["records"]))
    policy = {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
              "intermediate_size": 88, "max_position_embeddings": 4096}  # fmt: skip
    lines = _load_bench().lora_rows(tiny["root"] / "policy", records_file, policy, 1024, 1,
                                    tmp_path)  # fmt: skip
    (full, lora) = _table(lines)
    assert [full[0], lora[0]] == ["full", "lora"]
    for row in (full, lora):
        trainable, total, state, peak, tokens_per_s = map(_number, row[1:])
        assert 0 < trainable <= total and peak >= 0 and tokens_per_s > 0
        # fp32 weights (4 bytes each), gradient and AdamW moments (12 per trainable one).
        assert state == pytest.approx((4 * total + 12 * trainable) / 2**30, abs=5e-4)
    assert _number(full[1]) == _number(full[2]), "full fine-tuning trains every parameter"
    assert _number(lora[1]) < _number(full[1]), "LoRA trains fewer parameters"
    assert _number(lora[2]) > _number(full[2]), "the adapters add to the base model"


@pytest.mark.slow
def test_distributed_table_on_a_tiny_budget(tiny, tmp_path):
    from components.env.config import EnvConfig
    from components.rollout.config import RolloutConfig
    from components.rollout.engine import sample_episodes
    from components.sandbox.config import SandboxConfig
    from components.train.dpo import _pair_tokens

    model, tokenizer = tiny["model"], tiny["tokenizer"]
    rollout = RolloutConfig(temperature=1.0, max_new_tokens=8, samples_per_task=2,
                            batch_size=2, workers=1)  # fmt: skip
    rollouts = sample_episodes(tiny["tasks"], model.eval(), tokenizer, rollout,
                               EnvConfig(max_steps=1), SandboxConfig())  # fmt: skip
    # The oracle's transcript (chosen) against each sampled episode (rejected).
    pairs = [_pair_tokens({"chosen": tiny["records"][0], "rejected": r.result.record},
                          tokenizer, 2048) for r in rollouts]  # fmt: skip
    lines = _load_bench().distributed_rows(tiny["root"] / "policy", rollouts, pairs, 1, tmp_path)
    rows = _table(lines)
    assert [r[0] for r in rows] == ["GRPO (1 steps)", "DPO (1 steps)"]
    for _, one, two, ratio, tokens in rows:
        assert _number(one) > 0 and _number(two) > 0 and _number(ratio) > 0
        one_tokens, two_tokens = tokens.split(" / ")
        assert one_tokens == two_tokens and _number(one_tokens) > 0
