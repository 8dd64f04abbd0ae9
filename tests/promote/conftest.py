"""Promotion tests: one real MLflow SQLite store per session, one registered model per test.

Creating the SQLite schema takes seconds, so the store is shared; each test gets its own
registered model name and audit file, which isolates them as well as separate stores would.
"""

from __future__ import annotations

import uuid

import pytest
from promote_helpers import make_checkpoint

from components.promote.config import PromotionConfig


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlruns")
    # Anything that falls back to the process default lands here, never in the repository.
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'default.db'}")
    yield {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "artifact_root": str(root / "art")}
    mp.undo()


@pytest.fixture
def cfg(mlflow_store, tmp_path) -> PromotionConfig:
    return PromotionConfig(
        model_name=f"agentrl-test-{uuid.uuid4().hex[:8]}",
        audit_path=str(tmp_path / "audit.jsonl"),
        **mlflow_store,
    )


@pytest.fixture
def checkpoint(tmp_path):
    """A stand-in for a save_policy folder: config.json + tokenizer files, a few bytes."""
    return make_checkpoint(tmp_path / "ckpt")
