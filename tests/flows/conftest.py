"""Fixtures of the flow tests."""

from __future__ import annotations

import pytest

from components import tracking


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.create_experiment(tracking.EXPERIMENT, artifact_location=(tmp_path / "a").as_uri())
    return mlflow
