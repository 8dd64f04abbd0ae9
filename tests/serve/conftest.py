"""Fixtures of the serve tests: a tiny checkpoint, and policy versions of it on disk (LoRA
adapters and full-weight snapshots with weights other than the checkpoint's)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def policy():
    import torch

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy

    torch.set_num_threads(1)
    # Head size 32 (64 / 2): the smallest vLLM's CPU attention takes (the vllm tier).
    config = PolicyConfig(
        hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
        vocab_size=512, tokenizer_stdlib_bytes=20_000, max_position_embeddings=1024,
    )  # fmt: skip
    return build_policy(config)


@pytest.fixture(scope="session")
def checkpoint(policy, tmp_path_factory):
    from components.policy.model import save_policy

    return save_policy(*policy, tmp_path_factory.mktemp("ckpt"))


def perturbed(model, seed: int, scale: float = 0.5):
    """A copy of `model` whose trainable weights moved by seeded noise (a stand-in for an
    update: greedy output changes)."""
    import copy

    import torch

    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * scale)
    return out.eval()


@pytest.fixture(scope="session")
def adapters(checkpoint, tmp_path_factory):
    """{version: (adapter model in memory, its folder)} for versions 1 and 2: LoRA on a
    fresh load of the checkpoint, moved away from zero so each changes the output."""
    from components.policy.config import LoRAConfig
    from components.policy.lora import add_adapters
    from components.policy.model import load_policy

    out = {}
    root = tmp_path_factory.mktemp("adapters")
    for version in (1, 2):
        base, _ = load_policy(checkpoint)
        model = perturbed(add_adapters(base, LoRAConfig(r=4, alpha=8)), seed=version)
        folder = root / f"v{version}"
        model.save_pretrained(folder)  # PEFT: the adapter files only, what a sync writes
        out[version] = (model, folder)
    return out
