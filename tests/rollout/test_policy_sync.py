"""Sampling a saved policy on `agentrl serve` (and real vLLM, in the vllm tier) outside GRPO
(the sample stage feeding RS and DPO): `serve_checkpoint` loads it by name, and the episodes
sampled on the server are token for token the in-process ones of that policy, each turn
recording the name. A full-weight candidate needs `agentrl serve`: on vLLM the sync stops
with one line."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from components.env.config import EnvConfig
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.rollout.policy_sync import PolicySync, PolicySyncError, serve_checkpoint
from components.sandbox.config import SandboxConfig
from tests.serve.served import ENGINES, running_server

GREEDY = RolloutConfig(
    temperature=0.0, max_new_tokens=16, max_episode_tokens=1500, batch_size=2,
    samples_per_task=1, workers=2,
)  # fmt: skip
ENV = EnvConfig(max_steps=1)


def moved(model, seed: int):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


def assert_served_equals_local(local_model, tokenizer, tasks, config):
    tasks = tasks[:1]
    local = sample_episodes(tasks, local_model, tokenizer, GREEDY, ENV, SandboxConfig())
    remote = sample_episodes(tasks, None, tokenizer, config, ENV, SandboxConfig())
    for a, b in zip(local, remote, strict=True):
        assert not b.infra_failure, b.result.infra_detail
        assert a.input_ids == b.input_ids and a.assistant_mask == b.assistant_mask
        assert b.policy_versions and set(b.policy_versions) == {config.model}


@pytest.mark.slow  # its own server, two policies sampled twice: ~30 s on 2 shared cores
@pytest.mark.parametrize("engine", ENGINES)
def test_sampling_a_saved_policy_on_the_server(model, tokenizer, tasks, checkpoint, tmp_path,
                                               engine):  # fmt: skip
    from components.policy.config import LoRAConfig
    from components.policy.lora import add_adapters
    from components.policy.model import load_policy, save_policy

    with running_server(checkpoint, engine=engine) as url:
        base = dataclasses.replace(GREEDY, backend="openai", base_url=url)
        # A LoRA candidate: loaded as an adapter on the server's base.
        fresh, _ = load_policy(checkpoint)
        adapter = moved(add_adapters(fresh, LoRAConfig(r=4, alpha=8)), seed=1)
        folder = save_policy(adapter, tokenizer, tmp_path / "candidate-lora")
        config = serve_checkpoint(base, folder)
        assert config.model == "candidate-lora"
        assert_served_equals_local(adapter, tokenizer, tasks, config)
        PolicySync(url, "lora").unload("candidate-lora")
        # A full-weight candidate: the server's weights are replaced, under its name.
        full = moved(copy.deepcopy(model), seed=2)
        folder = save_policy(full, tokenizer, tmp_path / "candidate-full")
        if engine == "vllm":
            with pytest.raises(PolicySyncError, match="no full-weight reload"):
                serve_checkpoint(base, folder)
            return
        config = serve_checkpoint(base, folder)
        assert PolicySync(url, "full").served() == ["candidate-full"]
        assert_served_equals_local(full, tokenizer, tasks, config)
