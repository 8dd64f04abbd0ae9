"""Every entry point that runs a flow starts Prefect's API the one health-waited way
(issue 46, deliverable 1): `python -m flows.evaluate` and `python -m flows.promote`, with
every core kept busy and a fresh Prefect database (its migrations are the slow part), get
the server `flows/retrain_main.py` starts (`prefect_api`: `runtime.startup_timeout_s`, one
retry, its URL and where the history stays printed), not Prefect's own temporary server
with its 20 s start ("Timed out while attempting to connect to ephemeral Prefect API
server"), and stop it when they end. `python -m flows.retrain` is
tests/flows/test_retrain_start.py's; `agentrl reproduce`'s rerun calls the same
`prefect_api` (flows/reproduce.py `rerun`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.test_retrain_start import _burners, _left_behind

ROOT = Path(__file__).resolve().parents[2]

ENTRY_POINTS = {
    # a model no registry has: the flow starts, then ends on that, one line
    "evaluate": [
        "-m",
        "flows.evaluate",
        "--model",
        "no-such-alias",
        "--preset",
        str(ROOT / "configs" / "cpu-demo.yaml"),
        "--out",
        "out",
    ],
    # no approval comes: the flow waits its 1 s and says so
    "promote": [
        "-m",
        "flows.promote",
        "--version",
        "1",
        "--timeout-s",
        "1",
        "--preset",
        str(ROOT / "configs" / "cpu-demo.yaml"),
    ],
}


@pytest.mark.slow  # a fresh Prefect database on a machine whose cores are all busy: minutes
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_flow_entry_point_starts_prefect_health_waited_on_a_busy_machine(tmp_path, entry):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}",
        "TMPDIR": str(tmp_path),
    }
    env.pop("PREFECT_API_URL", None)
    (tmp_path / "not-a-checkpoint").mkdir()
    burners = _burners()
    try:
        out = subprocess.run(
            [sys.executable, *ENTRY_POINTS[entry]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    finally:
        for burner in burners:
            burner.kill()
    said = out.stdout + out.stderr
    assert "ephemeral" not in said, said[-3000:]
    assert "Prefect API server: http://127.0.0.1:" in out.stdout, said[-3000:]
    assert f"Prefect history: {tmp_path / 'prefect' / 'prefect.db'}" in out.stdout
    assert _left_behind(str(tmp_path / "prefect")) == []  # its server is stopped
    # the flow ran against it, to its own ending: a failed stage, a version not requested
    assert out.returncode == 1, said[-3000:]
    assert "internal error" not in out.stderr
    if entry == "evaluate":
        import mlflow

        client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs = [
            r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
        ]
        assert [r.info.status for r in runs if r.info.run_name.startswith("evaluate")] == ["FAILED"]
    else:
        assert "version 1" in out.stderr, said[-3000:]
