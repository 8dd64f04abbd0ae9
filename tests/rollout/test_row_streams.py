"""Per-episode sampling streams (issue 32.2): what an episode samples does not depend on
which episodes share its batch, nor on their order; the row sampler draws from
softmax(logits / T) and never a masked token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from components.env.config import EnvConfig
from components.policy.chat import prompt_ids
from components.rollout.config import RolloutConfig
from components.rollout.engine import RowSampler, generate_transformers, sample_episodes
from components.sandbox.config import SandboxConfig

CONFIG = RolloutConfig(max_new_tokens=16, max_episode_tokens=1200, batch_size=4,
                       samples_per_task=2, workers=2, temperature=1.0, seed=3)  # fmt: skip
ENV = EnvConfig(max_steps=2)


def test_row_sampler_draws_from_the_tempered_softmax_and_respects_masks():
    logits = torch.tensor([[2.0, 1.0, 0.0, float("-inf")]])
    expected = torch.softmax(logits / 0.7, dim=-1)[0]
    sampler = RowSampler([11], temperature=0.7, top_p=1.0)
    counts = torch.zeros(4)
    for _ in range(4000):
        out = sampler(None, logits.clone())
        assert torch.isfinite(out).sum() == 1  # exactly one token is left
        counts[out[0].argmax()] += 1
    assert counts[3] == 0  # a masked token is never drawn
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03)
    top = RowSampler([11], temperature=1.0, top_p=0.5)  # the first token alone has >= 0.5
    assert all(top(None, logits.clone())[0].argmax() == 0 for _ in range(50))


def test_a_row_samples_the_same_whatever_shares_its_batch(model, tokenizer, tasks):
    from components.env.episode import EpisodeEnv

    prompts = [
        prompt_ids(tokenizer, EpisodeEnv(t, ENV, SandboxConfig(), policy_name="t").events)
        for t in tasks
    ]
    alone = generate_transformers(model, tokenizer, prompts[:1], [12], temperature=1.0,
                                  top_p=1.0, seed=[7])  # fmt: skip
    batch = generate_transformers(model, tokenizer, [prompts[1], prompts[0]], [12, 12],
                                  temperature=1.0, top_p=1.0, seed=[8, 7])  # fmt: skip
    assert len(alone[0].token_ids) > 0 and batch[1].token_ids == alone[0].token_ids


def test_episodes_do_not_depend_on_the_batch_size(model, tokenizer, tasks):
    def tokens(batch_size: int):
        config = dataclasses.replace(CONFIG, batch_size=batch_size)
        out = sample_episodes(tasks, model, tokenizer, config, ENV, SandboxConfig())
        return [(r.group_id, r.sample_index, r.input_ids) for r in out]

    assert tokens(1) == tokens(4)


@pytest.mark.parametrize("temperature", [0.0])
def test_greedy_rows_need_no_stream(model, tokenizer, tasks, temperature):
    from components.env.episode import EpisodeEnv

    ids = prompt_ids(tokenizer, EpisodeEnv(tasks[0], ENV, SandboxConfig(), policy_name="t").events)
    a = generate_transformers(model, tokenizer, [ids], [8], temperature=temperature, top_p=1.0,
                              seed=[1])  # fmt: skip
    b = generate_transformers(model, tokenizer, [ids], [8], temperature=temperature, top_p=1.0,
                              seed=5)  # fmt: skip
    assert a[0].token_ids == b[0].token_ids
