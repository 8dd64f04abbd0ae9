"""The training sections' lora and deepspeed settings reach their stages through the real
command lines (tests/test_preset_stages.py style: a stand-in records what the stage passes
on and stops it). What the stages do with them: tests/train/test_lora.py, test_parallel.py."""

from __future__ import annotations

import json

import pytest
import yaml

from components.cli import main as agentrl

LORA = {"r": 4, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
PRESET = {
    "sft": {"lora": LORA, "deepspeed": {"zero_stage": 3}, "max_steps": 3},
    "rejection_sampling": {"sft": {"lora": {"r": 2}}},
    "dpo": {"lora": LORA, "deepspeed": {"zero_stage": 2}},
    "grpo": {"lora": {"r": 8, "init_seed": 5}, "deepspeed": {"zero_stage": 3}},
}


class Seen(Exception):
    pass


def _record(into: dict):
    def stand_in(*args, **kwargs):
        into["args"] = args
        raise Seen

    return stand_in


@pytest.fixture
def setup(tiny_policy, expert_records, failed_records, tmp_path):
    from components.policy.model import save_policy

    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(PRESET))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in expert_records + failed_records))
    return str(preset), str(save_policy(*tiny_policy, tmp_path / "policy")), str(samples)


def test_sft_rs_and_dpo_get_lora_and_deepspeed(setup, tmp_path, monkeypatch):
    import components.train.dpo as dpo
    import components.train.rejection_sampling as rs
    import components.train.sft as sft

    preset, policy, samples = setup
    seen: dict = {"sft": {}, "rs": {}, "dpo": {}}
    monkeypatch.setattr(sft, "train_sft", _record(seen["sft"]))
    monkeypatch.setattr(rs, "train_rejection_sampling", _record(seen["rs"]))
    monkeypatch.setattr(dpo, "train_dpo", _record(seen["dpo"]))
    common = ["--preset", preset, "--policy", policy, "--out", str(tmp_path / "o")]
    for argv in (["train", "sft", *common, "--records", samples],
                 ["train", "rs", *common, "--samples", samples],
                 ["train", "dpo", *common, "--samples", samples]):  # fmt: skip
        with pytest.raises(Seen):
            agentrl(argv)
    sft_config = seen["sft"]["args"][3]
    assert sft_config.lora.target_modules == ("q_proj", "v_proj") and sft_config.lora.alpha == 16
    assert sft_config.lora.dropout == 0.05 and sft_config.deepspeed.zero_stage == 3
    assert seen["rs"]["args"][3].sft.lora.r == 2
    dpo_config = seen["dpo"]["args"][4]
    assert dpo_config.lora.r == 4 and dpo_config.deepspeed.zero_stage == 2


def test_grpo_gets_lora_and_deepspeed(setup, suite, tmp_path, monkeypatch):
    import components.train.grpo.cli as grpo

    preset, policy, _ = setup
    seen: dict = {}
    monkeypatch.setattr(grpo, "train_grpo", _record(seen))
    root, _ = suite
    with pytest.raises(Seen):
        agentrl(["train", "grpo", "--preset", preset, "--policy", policy, "--tasks", str(root),
                 "--out", str(tmp_path / "g")])  # fmt: skip
    config = seen["args"][3]
    assert (config.lora.r, config.lora.init_seed, config.deepspeed.zero_stage) == (8, 5, 3)
