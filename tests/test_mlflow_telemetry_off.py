"""MLflow's telemetry is off unless the user opts in (issue 45, item 12): MLflow 3.x starts a
telemetry client at `import mlflow` that writes an installation id to
~/.config/mlflow/telemetry.json; an agentrl command that uses MLflow writes nothing there.
MLflow switches itself off under pytest and CI (PYTEST_CURRENT_TEST, CI, ...), so the
command runs here without those variables, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.cli import mlflow_telemetry_default

ROOT = Path(__file__).resolve().parents[1]
# What MLflow reads as "a test or CI run, no telemetry" (mlflow/telemetry/utils.py)
NOT_A_USER = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "CIRCLECI", "GITLAB_CI",
              "JENKINS_URL", "TRAVIS", "BUILDKITE", "CODEBUILD_BUILD_ID", "TF_BUILD",
              "BITBUCKET_BUILD_NUMBER", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")  # fmt: skip


def _promote_status(home: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in NOT_A_USER}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), **extra,
               MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")  # fmt: skip
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run([sys.executable, "-m", "components.cli", "promote", "status"],
                          env=env, cwd=home, capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.timeout(900)  # two MLflow stores created on a loaded machine
def test_an_mlflow_command_writes_no_installation_id_unless_asked(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    result = _promote_status(home)
    assert "internal error" not in result.stderr  # it ran (no model registered: one line)
    assert not (home / ".config" / "mlflow").exists()
    # the user opts in: MLflow's own switch, as MLflow documents it
    _promote_status(home, MLFLOW_DISABLE_TELEMETRY="false")
    assert (home / ".config" / "mlflow" / "telemetry.json").is_file()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "true"),  # off unless asked
        ({"MLFLOW_DISABLE_TELEMETRY": "false"}, "false"),  # the user's opt-in stands
        ({"MLFLOW_DISABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1"}, "true"),  # DO_NOT_TRACK wins
        ({"DO_NOT_TRACK": "0"}, "true"),
    ],
)
def test_the_switch_is_set_unless_the_user_set_it(monkeypatch, given, expected):
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    mlflow_telemetry_default()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == expected
