"""Flow building blocks: stage tasks (bodies via .fn()), MLflow tracking of stage results
and episode traces, against a real MLflow SQLite store in a temporary folder."""

import json

import pytest

from components import tracking
from flows import stages


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.create_experiment(tracking.EXPERIMENT, artifact_location=(tmp_path / "a").as_uri())
    return mlflow


def test_stage_runs_a_cli_command_and_reads_its_result(tmp_path):
    out = tmp_path / "tasks"
    result = stages.run.fn("generate", ["tasks", "generate", "--out", str(out), "--n", "3"],
                           str(out / "suite.json"))  # fmt: skip
    assert result["n_tasks"] == 3 and result["_stage_seconds"] >= 0
    log = tmp_path / "log.jsonl"
    log.write_text('{"version": "a"}\n{"version": "b"}\n')
    assert stages._read_result(log) == {"version": "b"}


def test_failing_stage_raises_with_the_stage_name(tmp_path):
    from components.launch.launcher import StageFailed

    with pytest.raises(StageFailed, match="gate"):
        stages.run.fn("gate", ["tasks", "check", "--tasks", str(tmp_path / "none")],
                      str(tmp_path / "r.json"))  # fmt: skip


def test_pipeline_run_with_nested_stage_runs_metrics_and_traces(mlflow_store, tmp_path):
    parent = tracking.start_pipeline_run("retrain test", {"sft": {"max_steps": 3}},
                                         {"config_hash": "abc"})  # fmt: skip
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    child = stages.track.fn("sft", parent, {"max_steps": 3},
                            {"losses": [3.0, 2.0, 1.5], "tokens_per_second": 100.0,
                             "policy_dir": "x", "_stage_seconds": 1.0}, [str(report)])  # fmt: skip
    client = mlflow_store.MlflowClient()
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.metrics["tokens_per_second"] == 100.0
    assert [m.value for m in client.get_metric_history(child, "losses")] == [3.0, 2.0, 1.5]
    assert [a.path for a in client.list_artifacts(child)] == ["report.md"]
    record = {"task_id": "t1", "task": "fix it", "reward": 1.0, "metadata": {"wall_s": 2.0},
              "trajectory": [{"role": "user", "content": "fix"},
                             {"role": "assistant", "action": "run_command",
                              "arguments": {"cmd": "python -m pytest"}},
                             {"role": "environment", "observation": "1 failed"}]}  # fmt: skip
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps(record) + "\n")
    assert stages.log_traces.fn(parent, str(traj), 5) == 1
    traces = mlflow_store.search_traces(run_id=parent, return_type="list")
    assert len(traces) == 1
    spans = {s.span_type for s in traces[0].data.spans}
    assert {"AGENT", "LLM", "TOOL"} <= spans
    tracking.end_pipeline_run(parent, "FINISHED", {"data_version": "v1"})
    assert client.get_run(parent).data.tags["data_version"] == "v1"
