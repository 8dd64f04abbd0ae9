"""Data-parallel updates: two processes (torchrun, gloo on CPU) compute the same loss and
the same gradient as one process on the same batch, for GRPO, DPO and SFT; under DeepSpeed
ZeRO-2 and ZeRO-3 too (slow), and a 2-process ZeRO-3 GRPO run killed and resumed ends with the
weights of an uninterrupted one (slow).

Tolerance: the gradient a rank applies is the mean of per-rank sums, the same float32 terms
added in another order than one process adds them: |difference| <= 1e-6 + 1e-5 x |value|.
Metrics are float64 sums of float32 values: 1e-6 relative.

The batches deal unevenly over the ranks on purpose (5 episodes, 3 pairs or 3 SFT
micro-batches over 2 ranks), so the zero-weight pass that keeps ZeRO-3's collectives in step
is exercised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train import parallel_driver

DRIVER = Path(parallel_driver.__file__)
REPO = DRIVER.parents[2]


# Each run its own master port (a port just closed may still be held).
PORT_OFFSET = {"grpo-step": 0, "dpo-step": 10, "sft-step": 20}


@pytest.fixture
def policy_dir(tiny_policy, tmp_path):
    from components.policy.model import save_policy

    return save_policy(*tiny_policy, tmp_path / "policy")


def _torchrun(nproc: int, args: list[str], tmp_path: Path, port: int, timeout: int = 600):
    out = tmp_path / f"out-{nproc}-{port}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0",
           "AGENTRL_USE_CPU": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", str(port), str(DRIVER), *args, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out, weights_only=False)


def _assert_same(one: dict, two: dict) -> None:
    assert sorted(one["grads"]) == sorted(two["grads"]) and one["grads"]
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=name)
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


@pytest.mark.parametrize("mode, loss_type", [("grpo-step", "token"), ("grpo-step", "grpo"),
                                             ("dpo-step", ""), ("sft-step", "")])  # fmt: skip
def test_two_processes_give_the_one_process_gradient(mode, loss_type, policy_dir, tmp_path):
    args = ["--policy", str(policy_dir), "--mode", mode]
    args += ["--loss-type", loss_type] if loss_type else []
    one = parallel_driver.run(args)  # this process, no process group
    two = _torchrun(2, args, tmp_path, 29620 + len(loss_type) + PORT_OFFSET[mode])
    _assert_same(one, two)
    assert any(g.abs().sum() > 0 for g in one["grads"].values())


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero2", "zero3"])
@pytest.mark.parametrize("mode", ["grpo-step", "dpo-step", "sft-step"])
def test_deepspeed_two_processes_give_the_one_process_gradient(engine, mode, policy_dir, tmp_path):
    _deepspeed_step(engine, mode, policy_dir, tmp_path)


def _deepspeed_step(engine, mode, policy_dir, tmp_path):
    args = ["--policy", str(policy_dir), "--mode", mode]
    one = parallel_driver.run(args)
    two = _torchrun(2, [*args, "--engine", engine], tmp_path,
                    29640 + PORT_OFFSET[mode] + len(engine))  # fmt: skip
    _assert_same(one, two)


@pytest.mark.slow
def test_zero3_grpo_killed_and_resumed_ends_like_an_uninterrupted_run(policy_dir, tmp_path):
    from components.policy.model import load_policy
    from components.tasks.generate import generate_suite

    generate_suite(tmp_path / "tasks", 3, 0)
    common = ["--policy", str(policy_dir), "--mode", "grpo-run", "--engine", "zero3",
              "--tasks", str(tmp_path / "tasks")]  # fmt: skip
    straight = _torchrun(2, [*common, "--run-dir", str(tmp_path / "a"), "--iterations", "3"],
                         tmp_path, 29660, timeout=1200)  # fmt: skip
    _torchrun(2, [*common, "--run-dir", str(tmp_path / "b"), "--iterations", "2"], tmp_path, 29661,
              timeout=1200)  # fmt: skip
    resumed = _torchrun(2, [*common, "--run-dir", str(tmp_path / "b"), "--iterations", "3"],
                        tmp_path, 29662, timeout=1200)  # fmt: skip
    assert resumed["resumed_from"] == 2 and [r["iteration"] for r in resumed["metrics"]] == [3]
    a, _ = load_policy(straight["policy_dir"])
    b, _ = load_policy(resumed["policy_dir"])
    start, _ = load_policy(policy_dir)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, start.state_dict()[n]) for n, x in a.state_dict().items())
    timing = {"sample_seconds", "update_seconds", "iteration_seconds", "tokens_per_s",
              "sample_tokens_per_s", "rollout_wait_seconds"}  # fmt: skip
    rows = [{k: v for k, v in r.items() if k not in timing} for r in straight["metrics"][2:]]
    assert rows == [{k: v for k, v in r.items() if k not in timing} for r in resumed["metrics"]]
    logged = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in logged] == [1, 2, 3]
