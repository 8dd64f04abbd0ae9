"""The retrain run stops the Prefect server it started only after Prefect's background
workers have sent what they hold: otherwise the run's last words were '--- Error logging
to API --- All connection attempts failed' (seen at the end of a real pipeline run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A flow that logs, run against a server started as flows/retrain_main.py starts one, and
# the run's own shutdown order: drain (unless told not to), then stop the server.
PROBE = """
import os, sys
from pathlib import Path
from flows.retrain_main import RunScope, drain_prefect_workers, start_prefect_server

scope = RunScope()
try:
    scope.server, url = start_prefect_server(180, Path(sys.argv[1]))
    os.environ["PREFECT_API_URL"] = url
    from prefect import flow, task

    @task
    def step(i):
        print(f"step {i}")
        return i

    @flow(log_prints=True)
    def tiny():
        return sum(step(i) for i in range(5))

    tiny()
finally:
    if sys.argv[2] == "drain":
        drain_prefect_workers()
    scope.close()
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME":
           str(tmp_path / "prefect-home")}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / f"{mode}.log"), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)  # fmt: skip


def test_the_run_drains_prefects_workers_before_stopping_its_server(tmp_path):
    out = _run(tmp_path, "drain")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Error logging to API" not in out.stdout + out.stderr
    assert "step 4" in out.stdout + out.stderr  # the flow did log
