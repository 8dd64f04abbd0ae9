"""Golden per-step numbers of plain SFT, DPO and GRPO on the tiny policy, and the digest of
the weights each run saves: the evidence that a change of the training code's structure
left its arithmetic alone.

tests/fixtures/golden_losses.json holds the values of a fixed run of each (seeded init,
seeded data order, one CPU thread: float32 is deterministic on one machine). On the kind of
CPU they were recorded on (`machine`: its model, vector capability and flags, torch's
version) they are compared exactly, weights digest included. Elsewhere another CPU's kernels
round differently (1e-6 relative was seen between two Xeons on identical code), so numbers
are compared to a relative 1e-4 and the weights by their sum and norm to the same
tolerance: a change of what training computes moves them far more. Keys a run reports that
the file does not hold (metrics added later) are not compared.
Record them anew (AGENTRL_RECORD_GOLDEN=1) only for a deliberate change of what training
computes, named in the commit message; never to make a failing test pass.
Another CPU kind whose kernels move a run further than that (an AMD EPYC against the Xeon
of the record: GRPO with the entropy bonus 1% off in loss, identical code) has its own
record under `other_machines`, compared exactly, made from the same code as the main one
(AGENTRL_RECORD_GOLDEN=other, the commit named in the message that adds it).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import pytest

from components.lineage import weights_sha256
from components.train.config import DPOConfig, GRPOConfig, SFTConfig
from components.train.data import preference_pairs

# The GRPO runs are test_grpo.py's: its scripted episodes and settings.
from tests.train.test_grpo import ENV, ROLLOUT, TIMING, SandboxConfig, scripted_generate

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden_losses.json"
RECORD = os.environ.get("AGENTRL_RECORD_GOLDEN") == "1"
RECORD_OTHER = os.environ.get("AGENTRL_RECORD_GOLDEN") == "other"  # this CPU kind's own


def machine() -> str:
    """The CPU kind whose kernels decide float32's last bits: model, capability, flags, torch."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    model = fields.get("model name\t", "").strip()
    flags = hashlib.sha256(fields.get("flags\t\t", "").strip().encode()).hexdigest()[:12]
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()}|{model}|{capability}|flags {flags}|torch {torch.__version__}"


def weights_summary(checkpoint_dir: Path) -> dict:
    """Sum and L2 norm over every saved tensor: what a run on another CPU is compared by."""
    from safetensors.torch import load_file

    tensors = [t.double() for f in sorted(Path(checkpoint_dir).glob("*.safetensors"))
               for t in load_file(str(f)).values()]  # fmt: skip
    return {"sum": float(sum(t.sum() for t in tensors)),
            "l2": float(sum((t * t).sum() for t in tensors) ** 0.5)}  # fmt: skip


def _close(got, stored, exact: bool, where: str) -> None:
    """`got` equals `stored` (exactly, or to a relative 1e-4 for floats), key by key of
    `stored`: keys `got` has beyond those are not compared."""
    if isinstance(stored, dict):
        assert isinstance(got, dict), where
        for key, value in stored.items():
            if key == "weights_sha256" and not exact:
                continue  # another CPU's rounding: the summary below stands for it
            assert key in got, f"{where}.{key}: missing"
            _close(got[key], value, exact, f"{where}.{key}")
    elif isinstance(stored, list):
        assert isinstance(got, list) and len(got) == len(stored), where
        for i, (a, b) in enumerate(zip(got, stored, strict=True)):
            _close(a, b, exact, f"{where}[{i}]")
    elif isinstance(stored, float) and not exact:
        assert got == pytest.approx(stored, rel=1e-4, abs=1e-7), where
    else:
        assert got == stored, where


def _check(name: str, got: dict, checkpoint_dir: Path) -> None:
    """Compare `got` and the checkpoint's weights with the stored values of `name` (or store
    them when recording)."""
    got = {**got, "weights_sha256": weights_sha256(checkpoint_dir),
           "weights_summary": weights_summary(checkpoint_dir)}  # fmt: skip
    got = json.loads(json.dumps(got))  # what the file can hold: lists, floats, strings
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    others = stored.get("other_machines", {})
    if RECORD or RECORD_OTHER:
        if RECORD:
            stored = {**stored, name: got, "machine": machine()}
        else:
            others = {**others, machine(): {**others.get(machine(), {}), name: got}}
            stored = {**stored, "other_machines": others}
        GOLDEN.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        return
    assert name in stored, f"no golden values of {name}: record them (AGENTRL_RECORD_GOLDEN=1)"
    if name in others.get(machine(), {}):
        _close(got, others[machine()][name], exact=True, where=f"{name} on {machine()}")
        return
    _close(got, stored[name], exact=stored.get("machine") == machine(), where=name)


def test_sft_golden(tiny_policy, expert_records, tmp_path):
    from components.train.sft import train_sft

    model, tokenizer = tiny_policy
    config = SFTConfig(max_steps=4, batch_size=2, grad_accum=2, learning_rate=1e-3,
                       max_seq_len=768, lr_scheduler="cosine", warmup_steps=1, seed=0,
                       use_cpu=True, output_dir=str(tmp_path / "sft"))  # fmt: skip
    result = train_sft(model, tokenizer, expert_records, config)
    _check("sft", {"losses": result.losses, "grad_norms": result.grad_norms,
                   "learning_rates": result.learning_rates, "tokens": result.tokens},
           Path(result.checkpoint_dir))  # fmt: skip


def test_dpo_golden(tiny_policy, expert_records, failed_records, tmp_path):
    from components.train.dpo import train_dpo

    model, tokenizer = tiny_policy
    pairs = preference_pairs(expert_records + failed_records, max_pairs_per_task=2, seed=0)
    config = DPOConfig(max_steps=3, batch_size=2, grad_accum=2, learning_rate=1e-3, beta=0.1,
                       warmup_steps=1, max_seq_len=640, use_cpu=True,
                       output_dir=str(tmp_path / "dpo"))  # fmt: skip
    result = train_dpo(model, None, tokenizer, pairs, config)
    _check("dpo", {"losses": result.losses, "chosen_rewards": result.chosen_rewards,
                   "rejected_rewards": result.rejected_rewards,
                   "accuracies": result.accuracies}, Path(result.checkpoint_dir))  # fmt: skip


@pytest.mark.parametrize("variant", ["kl_token", "turn_credit_entropy"])
def test_grpo_golden(variant, tiny_policy, suite, tmp_path):
    from components.train.grpo import train_grpo

    model, tokenizer = tiny_policy
    _, tasks = suite
    options = {
        "kl_token": {"beta": 0.05, "loss_type": "token", "minibatch_size": 1},
        # Two micro-batches per step: the "grpo" reduction weighs each by its share.
        "turn_credit_entropy": {"turn_credit": True, "top_entropy_quantile": 0.5,
                                "leave_one_out": True, "loss_type": "grpo",
                                "minibatch_size": 2},
    }[variant]  # fmt: skip
    config = GRPOConfig(iterations=2, tasks_per_iteration=1, group_size=2, learning_rate=1e-3,
                        ppo_epochs=2, micro_batch_size=1, output_dir=str(tmp_path / "grpo"),
                        **options)  # fmt: skip
    result = train_grpo(model, tokenizer, tasks, config, ROLLOUT, ENV, SandboxConfig(),
                        generate_fn=scripted_generate(model, tokenizer, tasks))  # fmt: skip
    rows = [{k: v for k, v in row.items() if k not in TIMING} for row in result.metrics]
    _check(f"grpo_{variant}", {"metrics": rows}, Path(result.policy_dir))
