"""Fixtures of the environment-server tests: a few generated tasks and a running server."""

from __future__ import annotations

import pytest

from tests.env_service.served_env import served


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    """Three generated tasks (folder, loaded tasks)."""
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    root = tmp_path_factory.mktemp("env-service-suite") / "tasks"
    generate_suite(root, 3, 0)
    loaded, errors = load_tasks(root)
    assert not errors
    return root, loaded


@pytest.fixture(scope="session")
def server(suite):
    """A server with two workers on the suite, shared by the session: its URL."""
    with served(suite[0], workers=2) as (url, _proc):
        yield url


@pytest.fixture(scope="session")
def tiny_policy():
    """A tiny model and its tokenizer (the rollout tests' size): the engine's token side."""
    import torch

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy

    torch.set_num_threads(1)
    config = PolicyConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=512,
        tokenizer_stdlib_bytes=50_000,
        max_position_embeddings=4096,
    )
    return build_policy(config)
