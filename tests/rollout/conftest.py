"""Shared fixtures of the rollout tests: a tiny model, its tokenizer, a few generated tasks.

Built once per session (tokenizer training dominates); torch uses one thread because the
test machine is shared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.served import ENGINES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def policy():
    import torch

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy

    torch.set_num_threads(1)
    config = PolicyConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
        vocab_size=512, tokenizer_stdlib_bytes=50_000, max_position_embeddings=2048,
    )  # fmt: skip
    return build_policy(config)


@pytest.fixture(scope="session")
def model(policy):
    return policy[0]


@pytest.fixture(scope="session")
def tokenizer(policy):
    return policy[1]


@pytest.fixture(scope="session")
def tasks(tmp_path_factory):
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    root = tmp_path_factory.mktemp("suite") / "tasks"
    generate_suite(root, 3, 0)
    loaded, errors = load_tasks(root)
    assert not errors
    return loaded[:2]


@pytest.fixture(scope="session")
def checkpoint(policy, tmp_path_factory):
    from components.policy.model import save_policy

    return save_policy(*policy, tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="session", params=ENGINES)
def engine(request):
    """Which server the served tests run on: `agentrl serve`, and real vLLM in the vllm tier."""
    return request.param


@pytest.fixture(scope="session")
def server_url(checkpoint, engine):
    """`python -m components.serve` (the real command line) on a free loopback port, or the
    session's vLLM on the same checkpoint."""
    from tests.serve.served import running_server

    with running_server(checkpoint, runtime_updates=False, engine=engine) as url:
        yield url
