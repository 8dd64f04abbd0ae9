"""`agentrl reproduce ALIAS` (issue 45, finding 10): `--help` promises a version number or
an alias; an alias is resolved to its version in the registry, and one the registered model
does not have is one line naming the aliases it has, exit 2 (it was an internal error)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A real MLflow store with the registered model at version 1 and 2, `champion` on 1."""
    import mlflow

    from components.preset import DEFAULT_PRESET, load_preset

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = load_preset(DEFAULT_PRESET).section("promote")
    client = mlflow.MlflowClient(uri, uri)
    client.create_registered_model(config.model_name)
    for _ in range(2):
        client.create_model_version(config.model_name, source=str(tmp_path))
    client.set_registered_model_alias(config.model_name, "champion", "1")
    return config, uri


def test_an_alias_is_resolved_to_its_version(registry):
    from flows.reproduce import resolve_version

    config, _ = registry
    assert resolve_version("champion", config) == "1"
    assert resolve_version("2", config) == "2"
    with pytest.raises(ValueError) as refused:
        resolve_version("canary", config)
    store = config.resolved_tracking_uri()
    assert str(refused.value) == (
        f"model {config.model_name} in the MLflow store {store} has no alias 'canary' "
        "(aliases: champion -> v1)"
    )


def test_reproduce_of_a_missing_alias_is_one_line_exit_2(registry):
    _, uri = registry
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    out = subprocess.run(
        [sys.executable, "-m", "components.cli", "reproduce", "challenger"],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"agentrl reproduce: model agentrl-coder in the MLflow store {uri} has no alias "
        "'challenger' (aliases: champion -> v1)"
    ]
    assert not list(ROOT.glob("runs/reproduce-*challenger*"))  # nothing written
