"""Every entry point that runs a flow starts Prefect's API the one health-waited way
(issue 46, deliverable 1): `python -m flows.evaluate` and `python -m flows.promote`, with
every core kept busy and a fresh Prefect database (its migrations are the slow part), get
the server `flows/retrain_main.py` starts (`prefect_api`: `runtime.startup_timeout_s`, one
retry, its URL and where the history stays printed), not Prefect's own temporary server
with its 20 s start ("Timed out while attempting to connect to ephemeral Prefect API
server"), and stop it when they end. `python -m flows.retrain` is
tests/flows/test_retrain_start.py's. `agentrl reproduce` (its rerun calls the same
`prefect_api`, flows/reproduce.py `rerun`) is run to its end on a copy of the checkout:
a tiny `python -m flows.retrain` registers version 1, then `agentrl reproduce 1` with every
core busy and a fresh Prefect database completes, equal, and prints the compare URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.flows.test_retrain_start import _burners, _left_behind
from tests.tiny_pipeline import tiny_preset

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


def _run(argv: list[str], repo: Path, env: dict, timeout: float) -> tuple[int, str]:
    """`argv` in `repo`, its output shown as it comes (kept for the failure message)."""
    proc = subprocess.Popen(argv, cwd=repo, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            print(line, end="", flush=True)  # shown if the test fails
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(seen)


@pytest.mark.slow  # a tiny pipeline, then its rerun with every core busy: tens of minutes
@pytest.mark.timeout(5400)
def test_agentrl_reproduce_completes_on_a_busy_machine_and_prints_the_compare_url(tmp_path):
    """A copy of the checkout's files (no .git: the original and its rerun both record the
    commit as "unknown", so commits landing meanwhile cannot make it irreproducible), with
    its own mlruns/ and data/, Prefect's history in a fresh PREFECT_HOME for each command."""
    repo = tmp_path / "checkout"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    for rel in filter(None, listed.decode().split("\0")):  # what a fresh clone has
        if (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    preset = tiny_preset({"mode": "in-process"})
    preset["name"] = "busy-reproduce"
    # Both commands start Prefect from a fresh database while every core is busy (and a
    # shared test machine may be busier still): the operator's budget for that, raised.
    preset["runtime"] = {**(preset.get("runtime") or {}), "startup_timeout_s": 1200}
    (repo / "configs" / "busy.yaml").write_text(yaml.safe_dump(preset))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(repo), "TMPDIR": str(tmp),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):  # the copy's own mlruns/
        env.pop(name, None)
    code, said = _run([sys.executable, "-m", "flows.retrain", "--preset", "configs/busy.yaml"],
                      repo, {**env, "PREFECT_HOME": str(tmp_path / "prefect-original")},
                      timeout=2700)  # fmt: skip
    assert code == 0, said[-3000:]
    agentrl = [sys.executable, "-c", "import sys; from components.cli import main; "
               "sys.exit(main(sys.argv[1:]))"]  # `agentrl` on the copy's code  # fmt: skip
    home = tmp_path / "prefect"
    burners = _burners()
    try:
        code, said = _run([*agentrl, "reproduce", "1", "--preset", "configs/busy.yaml"], repo,
                          {**env, "PREFECT_HOME": str(home)}, timeout=2700)  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
    assert "ephemeral" not in said, said[-3000:]
    assert "Prefect API server: http://127.0.0.1:" in said, said[-3000:]
    assert f"Prefect history: {home / 'prefect.db'}" in said, said[-3000:]
    assert "=== Reproduction of version 1 ===" in said and code == 0, said[-3000:]
    compare = [line for line in said.splitlines()
               if line.startswith("MLflow, the original beside its reproduction: http")]  # fmt: skip
    assert compare and "compare-runs" in compare[0], said[-3000:]
    assert _left_behind(str(home)) == []  # its server is stopped
