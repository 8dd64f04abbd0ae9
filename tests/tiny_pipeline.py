"""The shipped default preset shrunk to a short CPU run: what the end-to-end pipeline tests
(tests/launch, tests/flows) share; their Prefect server is tests/conftest.py's
`prefect_harness`."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def tiny_preset(launcher: dict) -> dict:
    """configs/cpu-demo.yaml with every budget at its smallest (bench/pipeline_overhead.py
    shrinks it the same way)."""
    preset = yaml.safe_load((ROOT / "configs" / "cpu-demo.yaml").read_text())
    preset["name"] = "tiny-kube"
    preset["pipeline"].update(workdir="runs/pipeline", algorithms=["grpo"])
    preset["evaluate"].update(limit=2, safety_n_tasks=1)
    preset["tasks"].update(n_tasks=20, seed=0)
    preset["policy"].update(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, vocab_size=512, tokenizer_stdlib_bytes=20000)  # fmt: skip
    preset["sft"].update(max_steps=2, batch_size=2, max_seq_len=512, warmup_steps=0)
    preset["rollout"].update(max_new_tokens=16, max_episode_tokens=1024)
    preset["env"] = {**preset["env"], "max_steps": 2}
    preset["grpo"].update(iterations=1, tasks_per_iteration=1, group_size=2)
    preset["launcher"] = launcher
    return preset
