"""The cluster's stateful services run for real (issue 47 item 5): MLflow's tracking server
and Prefect's API server on Debian's PostgreSQL (loopback), as infra/base/mlflow.yaml and
the Prefect server of docs/scale-out.md run them, driven by a pipeline run (the retrain
flow's own pieces, tests/postgres/mini_pipeline.py) while 8 stage processes log runs,
metric curves, traces and versions of one registered model at once
(tests/postgres/stage_writer.py). Reconciled afterwards: nothing lost, no error in any
writer ("database is locked" included), model versions 1..8 without a gap, and the same
results as the embedded default (MLflow on SQLite, Prefect's SQLite database).

Opt-in (`-m postgres`): `make test-postgres` installs Debian's postgresql and psycopg2
(pinned by infra/requirements-cluster.lock) and runs it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.postgres.local_postgres import local_postgres, postgres_bin

REPO = Path(__file__).resolve().parents[2]
# The driver the cluster's MLflow names (infra/base/mlflow.yaml): SQLAlchemy 2.1 reads a bare
# postgresql:// as psycopg 3, which the cluster's image does not have (psycopg2 is pinned).
MLFLOW_SCHEME = re.search(
    r"--backend-store-uri=([a-z0-9+]+)://", (REPO / "infra/base/mlflow.yaml").read_text()
)[1]
WRITERS, STEPS = 8, 40
# MLflow migrates a fresh database (~50 schema revisions) before it answers: on a busy
# 2-core machine that outlives runtime.startup_timeout_s's default.
START_BUDGET_S = 900.0
MODEL = "pg-tier-model"

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL not installed (make postgres)"),
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow(backend: str, artifacts: Path, log: Path):
    """`mlflow server` on `backend`, health-waited: (process, URL). One uvicorn worker: with
    two (the manifest's --workers=2) uvicorn's supervisor kills a worker that takes more than
    5 s to answer its ping, which a worker importing MLflow on a busy 2-core machine does
    every time. No job runner (its 8 consumer processes would only add load here)."""
    from components.runtime import RuntimeConfig, http_probe, start_service

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        backend,
        "--default-artifact-root",
        artifacts.as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    budget = max(START_BUDGET_S, RuntimeConfig().startup_timeout_s)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = start_service("mlflow server", argv, http_probe(url + "/health"), budget, log, env=env)
    return proc, url


def stop_tree(proc) -> None:
    """The server and every process below it (`mlflow server` leaves its uvicorn behind)."""
    import psutil

    from components.runtime import descendants

    procs = []
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=30)
    for left in alive:
        with contextlib.suppress(psutil.Error):
            left.kill()
    proc.wait()


def run_all_at_once(tracking: str, prefect_api: str, work: Path) -> tuple[dict, list[dict]]:
    """The pipeline run and the 8 stage writers, started together: their JSON lines."""
    import mlflow

    client = mlflow.MlflowClient(tracking)
    experiment = client.create_experiment(
        "pg-tier-stages", artifact_location=(work / "art").as_uri()
    )
    client.create_registered_model(MODEL)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking,
        "PREFECT_API_URL": prefect_api,
        "PREFECT_HOME": str(work / "prefect-home"),
    }
    spawn = dict(cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pipeline = subprocess.Popen(
        [sys.executable, "tests/postgres/mini_pipeline.py", str(work / "pipeline")], **spawn
    )
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "tests/postgres/stage_writer.py",
                tracking,
                experiment,
                MODEL,
                str(i),
                str(STEPS),
            ],
            **spawn,
        )
        for i in range(WRITERS)
    ]
    outs = []
    for proc in [pipeline, *writers]:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        assert "database is locked" not in stderr, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs[0], outs[1:]


def reconcile(tracking: str, prefect_api: str, pipeline: dict, writers: list[dict]) -> dict:
    """What the stores hold, without ids and times: the same for any backend."""
    import mlflow

    client = mlflow.MlflowClient(tracking)
    experiment = client.get_experiment_by_name("pg-tier-stages").experiment_id
    runs = client.search_runs([experiment], max_results=100)
    stages = sorted(
        (
            r.data.tags["mlflow.runName"],
            r.info.status,
            r.data.params["stage"],
            [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "loss")],
            r.data.metrics["reward"],
        )
        for r in runs
    )
    traces = client.search_traces(locations=[experiment])
    per_run = [
        len(client.search_traces(locations=[experiment], run_id=w["run_id"])) for w in writers
    ]
    versions = client.search_model_versions(f"name = '{MODEL}'")
    by_run = {v.run_id: int(v.version) for v in versions}
    assert by_run == {w["run_id"]: w["version"] for w in writers}  # what each writer was told
    parent = client.get_run(pipeline["run_id"])
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{pipeline['run_id']}'"
    )
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # this process imported Prefect during the first backend's run: name this one's server
    with (
        temporary_settings({PREFECT_API_URL: prefect_api}),
        get_client(sync_client=True) as prefect,
    ):
        flow_run = prefect.read_flow_run(pipeline["flow_run_id"])
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        task_runs = prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    return {
        "stages": stages,
        "traces": (sorted(t.data.spans[0].name for t in traces), per_run),
        "versions": sorted(by_run.values()),
        "pipeline": (
            parent.info.status,
            sorted(c.data.tags["mlflow.runName"] for c in children),
            parent.data.metrics.get("tasks"),
            parent.data.tags.get("prefect.flow_run_id") == pipeline["flow_run_id"],
        ),
        "prefect": (
            flow_run.state.type.value,
            sorted((t.task_key.split("-")[0], t.state.type.value) for t in task_runs),
        ),
    }


def _tier(tracking: str, work: Path, monkeypatch) -> dict:
    """Prefect's API server on whatever database the environment names, then the run."""
    from flows.retrain_main import start_prefect_server

    monkeypatch.setenv("PREFECT_HOME", str(work / "prefect-home"))
    server, api = start_prefect_server(START_BUDGET_S, work / "prefect.log")
    try:
        monkeypatch.setenv("PREFECT_API_URL", api)
        pipeline, writers = run_all_at_once(tracking, api, work)
        return reconcile(tracking, api, pipeline, writers)
    finally:
        stop_tree(server)


@pytest.mark.timeout(3600)
def test_mlflow_and_prefect_on_postgresql_reconcile_like_the_sqlite_default(tmp_path, monkeypatch):
    pytest.importorskip("psycopg2", reason="psycopg2 missing (make postgres)")
    with local_postgres() as pg:
        monkeypatch.setenv(
            "PREFECT_SERVER_DATABASE_CONNECTION_URL", pg.url("prefect", "postgresql+asyncpg")
        )
        server, tracking = start_mlflow(
            pg.url("mlflow", MLFLOW_SCHEME), tmp_path / "pg-art", tmp_path / "mlflow.log"
        )
        try:
            on_postgres = _tier(tracking, tmp_path / "pg", monkeypatch)
        finally:
            stop_tree(server)
        monkeypatch.delenv("PREFECT_SERVER_DATABASE_CONNECTION_URL")
        sqlite = f"sqlite:///{tmp_path / 'sqlite' / 'mlflow.db'}"
        (tmp_path / "sqlite").mkdir()
        on_sqlite = _tier(sqlite, tmp_path / "sqlite", monkeypatch)
    for name, summary in (("postgres", on_postgres), ("sqlite", on_sqlite)):
        (tmp_path / f"reconciled-{name}.json").write_text(json.dumps(summary, indent=1))
    assert on_postgres["versions"] == list(range(1, WRITERS + 1))
    assert len(on_postgres["stages"]) == WRITERS
    assert all(len(s[3]) == STEPS and s[1] == "FINISHED" for s in on_postgres["stages"])
    assert on_postgres["pipeline"][0] == "FINISHED" and on_postgres["prefect"][0] == "COMPLETED"
    assert on_postgres == on_sqlite
