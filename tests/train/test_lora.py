"""LoRA for SFT, RS, DPO and GRPO: only the adapters train, the reference is the base with
its adapters off (no second copy), adapters are saved with the base they belong to, load
back, resume exactly, and merge into a plain checkpoint that computes the same logits."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from components.cli_args import CommandError
from components.policy.config import LoRAConfig
from components.policy.lora import ADAPTER_META, is_adapter_model, merge_adapters, weights_sha256
from components.sandbox.config import SandboxConfig
from components.train.config import DPOConfig, GRPOConfig, RejectionSamplingConfig, SFTConfig
from tests.train.test_grpo import ENV, ROLLOUT, scripted_generate

LORA = LoRAConfig(r=4, alpha=8)


def _base_weights(model) -> dict[str, torch.Tensor]:
    """The base model's own weights inside an adapter model (not lora_A / lora_B)."""
    base = model.get_base_model() if is_adapter_model(model) else model
    return {k.replace(".base_layer", ""): v.clone() for k, v in base.state_dict().items()
            if "lora_" not in k}  # fmt: skip


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def _no_second_copy(monkeypatch, *modules):
    real = copy.deepcopy

    def refuse(value, *args, **kwargs):
        if isinstance(value, torch.nn.Module):
            raise AssertionError("a LoRA run must not copy the model for its reference")
        return real(value, *args, **kwargs)

    for module in modules:
        monkeypatch.setattr(module.copy, "deepcopy", refuse)


def test_an_adapters_base_sha256_is_the_digest_policy_fetch_records(tiny_policy, tmp_path):
    """ADAPTER_META's base_sha256 is components/lineage.py's weights_sha256 (what `agentrl
    policy fetch` checks and a registered LoRA version's `base_sha256` tag carries), not a
    digest of the files' bytes, which differs for the same tensors."""
    from components.lineage import weights_sha256 as tensors_sha256
    from components.policy.lora import add_adapters, save_adapters
    from components.policy.model import load_policy, save_policy

    model, tokenizer = tiny_policy
    base_dir = save_policy(model, tokenizer, tmp_path / "base")
    model, tokenizer = load_policy(base_dir)
    adapter_dir = save_adapters(add_adapters(model, LORA), tokenizer, tmp_path / "adapters")
    meta = json.loads((adapter_dir / ADAPTER_META).read_text())
    assert meta["base_path"] == str(base_dir.resolve())
    assert meta["base_sha256"] == tensors_sha256(base_dir)


def test_sft_trains_the_adapters_only_and_saves_them_with_their_base(
    tiny_policy, expert_records, tmp_path
):
    from components.policy.model import load_policy, save_policy
    from components.train.sft import train_sft

    model, tokenizer = tiny_policy
    base_dir = save_policy(model, tokenizer, tmp_path / "base")  # the base is on disk
    model, tokenizer = load_policy(base_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = SFTConfig(max_steps=6, batch_size=2, learning_rate=5e-3, max_seq_len=768,
                       use_cpu=True, output_dir=str(tmp_path / "sft"), lora=LORA)  # fmt: skip
    result = train_sft(model, tokenizer, expert_records, config)

    assert result.losses[-1] < result.losses[0]
    trainable, total = result.metrics["trainable_parameters"], result.metrics["total_parameters"]
    assert 0 < trainable < total / 10
    trained, _ = load_policy(result.checkpoint_dir)
    for name, value in _base_weights(trained).items():
        assert torch.equal(value, before[name]), name  # the base did not move
    meta = json.loads((tmp_path / "sft" / "policy" / ADAPTER_META).read_text())
    assert meta["base_path"] == str(base_dir.resolve())
    assert meta["base_sha256"] == weights_sha256(base_dir) and meta["r"] == 4
    assert meta["trainable_parameters"] == trainable
    ids = tokenizer("def add(a, b): return a - b", add_special_tokens=False)["input_ids"]
    result_model = _logits(trained, ids)
    assert not torch.allclose(result_model, _logits(load_policy(base_dir)[0], ids))

    merged_dir = save_policy(merge_adapters(trained), tokenizer, tmp_path / "merged")
    assert not (merged_dir / ADAPTER_META).exists()
    merged, _ = load_policy(merged_dir)
    torch.testing.assert_close(_logits(merged, ids), result_model, rtol=1e-4, atol=1e-4)


def test_an_in_memory_base_is_saved_next_to_the_adapters(tiny_policy, expert_records, tmp_path):
    from components.policy.model import load_policy
    from components.train.sft import train_sft

    model, tokenizer = tiny_policy  # built in memory: no folder to point at
    start = {k: v.clone() for k, v in model.state_dict().items()}
    config = SFTConfig(max_steps=2, batch_size=2, max_seq_len=768, use_cpu=True,
                       output_dir=str(tmp_path / "sft"), lora=LORA)  # fmt: skip
    result = train_sft(model, tokenizer, expert_records, config)
    meta = json.loads((tmp_path / "sft" / "policy" / ADAPTER_META).read_text())
    assert meta["base_path"] == "base"
    base, _ = load_policy(tmp_path / "sft" / "policy" / "base")
    for name, value in base.state_dict().items():
        assert torch.equal(value, start[name]), name
    reloaded, _ = load_policy(result.checkpoint_dir)
    assert [k for k, p in reloaded.named_parameters() if p.requires_grad]  # trainable again


def test_rejection_sampling_takes_lora_from_its_sft_section(tiny_policy, expert_records, tmp_path):
    from components.train.rejection_sampling import train_rejection_sampling

    model, tokenizer = tiny_policy
    config = RejectionSamplingConfig(sft=SFTConfig(max_steps=1, batch_size=2, max_seq_len=768,
                                                   use_cpu=True, lora=LORA,
                                                   output_dir=str(tmp_path / "rs")))  # fmt: skip
    result = train_rejection_sampling(model, tokenizer, expert_records, config)
    assert result.sft.metrics["trainable_parameters"] < result.sft.metrics["total_parameters"]
    assert (tmp_path / "rs" / "policy" / ADAPTER_META).is_file()


def test_dpo_reference_is_the_base_with_adapters_off(
    tiny_policy, expert_records, failed_records, tmp_path, monkeypatch
):
    import components.train.dpo as dpo
    from components.train.data import preference_pairs

    model, tokenizer = tiny_policy
    start = _base_weights(model)
    _no_second_copy(monkeypatch, dpo)
    pairs = preference_pairs(expert_records + failed_records, max_pairs_per_task=1, seed=0)
    config = DPOConfig(max_steps=6, batch_size=2, learning_rate=5e-3, max_seq_len=640,
                       use_cpu=True, output_dir=str(tmp_path / "dpo"), lora=LORA)  # fmt: skip
    result = dpo.train_dpo(model, None, tokenizer, pairs, config)
    # Adapters start at zero (B = 0): step 1's policy is exactly the reference.
    assert abs(result.margins[0]) < 1e-6 and abs(result.losses[0] - 0.693147) < 1e-5
    assert result.margins[-1] > result.margins[0]
    from components.policy.model import load_policy

    trained, _ = load_policy(result.checkpoint_dir)
    for name, value in _base_weights(trained).items():
        assert torch.equal(value, start[name]), name


def _grpo(model, tokenizer, tasks, out, iterations, **overrides):
    from components.train.grpo import train_grpo

    config = GRPOConfig(iterations=iterations, tasks_per_iteration=1, group_size=2,
                        learning_rate=1e-2, beta=0.05, micro_batch_size=1, output_dir=str(out),
                        lora=LORA, **overrides)  # fmt: skip
    return train_grpo(model, tokenizer, tasks, config, ROLLOUT, ENV, SandboxConfig(),
                      generate_fn=scripted_generate(model, tokenizer, tasks))  # fmt: skip


def test_grpo_with_lora_updates_adapters_and_resumes_exactly(
    tiny_config, suite, tmp_path, monkeypatch
):
    import components.train.devices as devices
    from components.policy.model import build_policy

    _, tasks = suite
    _no_second_copy(monkeypatch, devices)
    straight, tokenizer = build_policy(tiny_config)
    start = _base_weights(straight)
    result = _grpo(straight, tokenizer, tasks, tmp_path / "straight", 3)
    assert all(row["kl"] >= 0 for row in result.metrics)
    trained = {k: v for k, v in straight.state_dict().items() if "lora_B" in k}
    assert any(v.abs().sum() > 0 for v in trained.values())  # the adapters moved
    for name, value in _base_weights(straight).items():
        assert torch.equal(value, start[name]), name

    first, tokenizer = build_policy(tiny_config)
    _grpo(first, tokenizer, tasks, tmp_path / "killed", 2)
    del first
    fresh, tokenizer = build_policy(tiny_config)
    resumed = _grpo(fresh, tokenizer, tasks, tmp_path / "killed", 3)
    assert resumed.resumed_from == 2
    for (name, a), (_, b) in zip(straight.state_dict().items(), fresh.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name


def test_lora_settings_are_validated():
    for bad in ({"r": 0}, {"alpha": 0}, {"dropout": 1.0}, {"target_modules": ()}):
        with pytest.raises(ValueError):
            LoRAConfig(**bad)
    assert SFTConfig(lora={"r": 2, "target_modules": ["q_proj"]}).lora.target_modules == ("q_proj",)
    assert copy.deepcopy(GRPOConfig(lora={"r": 2})).lora.r == 2


def test_merge_command(tiny_policy, expert_records, tmp_path, capsys):
    from components.cli import main as agentrl
    from components.policy.model import load_policy
    from components.train.sft import train_sft

    model, tokenizer = tiny_policy
    config = SFTConfig(max_steps=1, batch_size=2, max_seq_len=768, use_cpu=True,
                       output_dir=str(tmp_path / "sft"), lora=LORA)  # fmt: skip
    adapters = train_sft(model, tokenizer, expert_records, config).checkpoint_dir
    assert agentrl(["policy", "merge", "--policy", adapters, "--out", str(tmp_path / "m")]) == 0
    merged, _ = load_policy(tmp_path / "m" / "policy")
    assert not is_adapter_model(merged)
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["adapters"] == adapters
    with pytest.raises(CommandError, match="not an adapter policy"):
        agentrl(["policy", "merge", "--policy", str(tmp_path / "m" / "policy"), "--out",
                 str(tmp_path / "x")])  # fmt: skip
    # a base whose weights are not the ones the adapters were trained on: refused, unwritten
    from safetensors.torch import load_file, save_file

    from components.policy.lora import base_directory

    base = base_directory(adapters)
    (weights,) = sorted(base.glob("*.safetensors"))
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(CommandError, match="is not the one it was trained on"):
        agentrl(["policy", "merge", "--policy", adapters, "--out", str(tmp_path / "wrong")])
    assert not (tmp_path / "wrong").exists()
