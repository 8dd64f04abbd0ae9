"""SFT through DeepSpeed ZeRO-2 and ZeRO-3: two processes, gloo on CPU, a few steps.

Slow (opt-in, `pytest -m slow`): the first DeepSpeed start compiles its CPU shared-memory
communication op (minutes on two cores; cached in ~/.cache/torch_extensions afterwards,
~20 s a run then).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_two_processes_loss_falls(stage, tiny_config, expert_records, tmp_path):
    from components.policy.model import build_policy, load_policy

    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in expert_records))
    policy_config = tiny_config
    (tmp_path / "policy.json").write_text(json.dumps(dataclasses.asdict(policy_config)))
    sft = {"max_steps": 6, "batch_size": 1, "grad_accum": 2, "learning_rate": 1e-3,
           "max_seq_len": 640, "lr_scheduler": "constant", "output_dir": str(tmp_path / "out"),
           "deepspeed": {"zero_stage": stage}}  # fmt: skip
    (tmp_path / "sft.json").write_text(json.dumps(sft))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(29500 + stage), "-m", "components.train.deepspeed_launch",
               "--records", str(records), "--policy-config", str(tmp_path / "policy.json"),
               "--sft-config", str(tmp_path / "sft.json"), "--result", str(tmp_path / "r.json")]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["steps"] == 6
    assert {k: result["metrics"][k] for k in ("world_size", "zero_stage")} == {
        "world_size": 2,
        "zero_stage": stage,
    }
    assert result["losses"][-1] < result["losses"][0] - 0.3
    initial, _ = build_policy(policy_config)
    trained, _ = load_policy(result["checkpoint_dir"])
    for name, value in initial.state_dict().items():
        assert trained.state_dict()[name].shape == value.shape
        assert not torch.equal(trained.state_dict()[name], value), name
