"""MLflow's model-centric view (issue 46): what the UI shows, checked through MlflowClient
on a real SQLite store in a temporary folder. The browser checks the same facts
(scripts/ui_check.py, the `ui` tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components import tracking

GRPO_RESULT = {
    "iterations": 2,
    "policy_dir": "runs/x/grpo/policy",
    "last": {"iteration": 2, "mean_reward": 0.5, "loss": 0.1},
    "curves": {"iteration": [1, 2], "mean_reward": [0.25, 0.5], "loss": [0.3, 0.1]},
    "config": {"lr": 1e-5, "group_size": 4, "kl": {"beta": 0.0}},
}
SFT_RESULT = {
    "losses": [3.0, 2.0, 1.5],
    "eval_steps": [2, 3],
    "eval_losses": [2.5, 2.2],
    "steps": 3,
    "settings": {"max_steps": 3},
}
DATA_RESULT = {"counts": {"ingested": 10, "valid": 9, "family": {"sum": 4, "max": 5}}}


@pytest.fixture
def checkpoint(tmp_path):
    """A stand-in for a save_policy folder (config, tokenizer, weights file): registering
    copies it, nothing loads it."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (ckpt / "tokenizer.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    return ckpt


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tracking store and registry in a temporary folder, nothing in the checkout (one per
    module: creating the SQLite schema takes seconds)."""
    import mlflow

    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    (root / "mlruns").mkdir()
    patch = pytest.MonkeyPatch()
    patch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    patch.undo()


def test_curves_are_indexed_by_iteration_and_configuration_is_not_a_metric():
    grpo = tracking.metric_values(GRPO_RESULT)
    # One curve per name, at the iteration it belongs to; `last` repeats them: left out.
    assert grpo.curves == {"mean_reward": [(1, 0.25), (2, 0.5)], "loss": [(1, 0.3), (2, 0.1)]}
    assert grpo.scalars == {"iterations": 2.0}
    assert grpo.settings == {"config.lr": 1e-5, "config.group_size": 4, "config.kl.beta": 0.0}
    sft = tracking.metric_values(SFT_RESULT)
    # An optimizer counts its steps from 1; held-out losses sit at the steps they were taken.
    assert sft.curves == {
        "losses": [(1, 3.0), (2, 2.0), (3, 1.5)],
        "eval_losses": [(2, 2.5), (3, 2.2)],
    }
    assert sft.settings == {"settings.max_steps": 3} and "settings.max_steps" not in sft.scalars
    data = tracking.metric_values(DATA_RESULT)
    assert data.scalars == {"counts.ingested": 10.0, "counts.valid": 9.0}
    assert data.tables == {"counts.family": {"sum": 4, "max": 5}}


def test_a_stage_run_keeps_configuration_as_params_and_tables_readable(store):
    from mlflow import MlflowClient

    parent = tracking.start_pipeline_run("retrain test", {"grpo": {"iterations": 2}}, {})
    evaluation = {
        "candidate": {
            "overall": {"success_rate": 0.5, "success_ci95": [0.2, 0.8]},
            "by_split": {"test": {"success_rate": 0.5}},
            "by_family": {
                "sum": {
                    "success_rate": 1.0,
                    "cost": {"tokens": 12, "seconds": 1.5},
                    "reward_term_means": {"passed": 1.0},
                },
                "max": {
                    "success_rate": 0.0,
                    "cost": {"tokens": 30, "seconds": 2.5},
                    "reward_term_means": {"passed": 0.0},
                },
            },
        }
    }
    grpo = tracking.log_stage(parent, "grpo", {"grpo": {"iterations": 2}}, GRPO_RESULT, 1.0)
    ev = tracking.log_stage(parent, "evaluate", {}, evaluation, 1.0)
    client = MlflowClient()
    run = client.get_run(grpo)
    assert run.data.params["config.kl.beta"] == "0.0" and run.data.params["grpo.iterations"] == "2"
    assert not [k for k in run.data.metrics if k.startswith(("config", "last", "curves"))]
    history = client.get_metric_history(grpo, "mean_reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    # The whole result, once, as a JSON artifact.
    kept = json.loads(Path(client.download_artifacts(grpo, "result.json")).read_text())
    assert kept == GRPO_RESULT
    # A breakdown table: no dotted column (the UI shows those blank), `group` first, every
    # column with a value in every row.
    metrics = client.get_run(ev).data.metrics
    assert "candidate.overall.success_rate_lo" in metrics
    assert not [k for k in metrics if "by_split" in k or "by_family" in k]
    for name in ("candidate.by_family", "candidate.by_split"):
        table = json.loads(Path(client.download_artifacts(ev, f"tables/{name}.json")).read_text())
        assert table["columns"][0] == "group"
        assert not [c for c in table["columns"] if "." in c]
        assert all(v is not None for row in table["data"] for v in row), table
    table = json.loads(
        Path(client.download_artifacts(ev, "tables/candidate.by_family.json")).read_text()
    )
    rows = {r[0]: dict(zip(table["columns"], r, strict=True)) for r in table["data"]}
    assert rows["max"]["cost_tokens"] == 30 and rows["sum"]["reward_term_means_passed"] == 1.0


def test_the_logged_model_is_linked_to_its_version_with_metrics_params_and_reports(
    store, tmp_path, checkpoint
):
    """The model page shows its registered version (not "Not registered"), the evaluation's
    metrics (linked to the evaluate run), the training configuration, and report links
    that still resolve once the pipeline folder has been overwritten by the next run."""
    import mlflow
    from mlflow import MlflowClient

    from components.promote import registry
    from components.promote.config import PromotionConfig
    from components.promote.registry import Lineage

    config = PromotionConfig(
        model_name=tmp_path.name[-40:], audit_path=str(tmp_path / "audit.jsonl")
    )
    parent = tracking.start_pipeline_run("retrain test", {"sft": {"max_steps": 3}}, {})
    trained = tracking.log_stage(parent, "sft", {}, SFT_RESULT, 1.0)
    evaluated = tracking.log_stage(parent, "evaluate", {}, {"success_rate": 0.5}, 1.0)
    reports = tmp_path / "runs" / "pipeline"
    (reports / "eval").mkdir(parents=True)
    (reports / "safety").mkdir()
    (reports / "eval" / "report.md").write_text("# run 1 evaluation\n")
    (reports / "safety" / "safety.md").write_text("# run 1 safety\n")
    lineage = Lineage(
        data_version="data-v1",
        config_hash="cfg1",
        training_run_id=trained,
        pipeline_run_id=parent,
        eval_report_uri=str(reports / "eval" / "report.md"),
        safety_report_uri=str(reports / "safety" / "safety.md"),
    )
    version = registry.register_candidate(checkpoint, lineage, config)
    model_id = registry.record_evaluation(
        version,
        {"success_rate": 0.5, "success_ci95": [0.2, 0.8], "episodes": 4},
        evaluated,
        {"sft": {"max_steps": 3}},
        config,
    )
    client = MlflowClient()
    mv = client.get_model_version(config.model_name, version)
    assert mv.tags["model_uri"] == f"models:/{model_id}"
    model = client.get_logged_model(model_id)
    assert json.loads(model.tags["mlflow.modelVersions"]) == [
        {"name": config.model_name, "version": version}
    ]
    found = {m.key: (m.value, m.run_id) for m in model.metrics}
    assert found["success_rate"] == (0.5, evaluated)
    assert found["success_rate_lo"] == (0.2, evaluated) and found["episodes"][0] == 4
    assert model.params == {"sft.max_steps": "3"}
    assert model.tags["data_version"] == "data-v1"
    assert model.tags["training_run_uri"] == f"runs:/{trained}"
    # The reports by runs:/ URI of the pipeline run; the next run overwrites the folder.
    tags = mv.tags
    assert tags["eval_report_uri"] == f"runs:/{parent}/reports/report.md"
    assert tags["safety_report_uri"] == f"runs:/{parent}/reports/safety.md"
    (reports / "eval" / "report.md").write_text("# run 2 evaluation\n")
    (reports / "safety" / "safety.md").unlink()
    for key, text in (
        ("eval_report_uri", "# run 1 evaluation\n"),
        ("safety_report_uri", "# run 1 safety\n"),
    ):
        got = mlflow.artifacts.download_artifacts(
            artifact_uri=tags[key], tracking_uri=store, dst_path=str(tmp_path / key)
        )
        assert Path(got).read_text() == text


def test_a_report_path_where_no_file_is_is_left_out(store, tmp_path, checkpoint):
    """No report written: the tag stays empty, not a path that leads nowhere."""
    from mlflow import MlflowClient

    from components.promote import registry
    from components.promote.config import PromotionConfig
    from components.promote.registry import Lineage

    config = PromotionConfig(
        model_name=tmp_path.name[-40:], audit_path=str(tmp_path / "audit.jsonl")
    )
    lineage = Lineage(data_version="d", config_hash="c", eval_report_uri=str(tmp_path / "no.md"))
    version = registry.register_candidate(checkpoint, lineage, config)
    assert (
        MlflowClient().get_model_version(config.model_name, version).tags["eval_report_uri"] == ""
    )


def test_the_parent_run_has_a_description_the_reports_and_promotion_tags(store, tmp_path):
    from mlflow import MlflowClient

    parent = tracking.start_pipeline_run("retrain test", {}, {})
    report = tmp_path / "report.md"
    report.write_text("# evaluation\n")
    promotion = {
        "version": "3",
        "model": "agentrl-coder",
        "gates_passed": False,
        "challenger": False,
        "gate_checks": [
            {"name": "min_success_rate", "passed": False},
            {"name": "data_validation", "passed": True},
        ],
    }
    tags = tracking.promotion_tags(promotion, "m-123")
    assert tags == {
        "registered_model": "agentrl-coder",
        "registered_version": "3",
        "registered_model_uri": "models:/m-123",
        "gate_decision": "failed: min_success_rate",
        "approval": "not requested: the gates failed",
    }
    evaluation = {"candidate": {"overall": {"success_rate": 0.25, "success_ci95": [0.1, 0.5]}}}
    note = tracking.pipeline_note("retrain test", "FINISHED", "data-v7", evaluation, tags)
    uris = tracking.describe_pipeline_run(parent, note, [report, tmp_path / "absent.md"], tags)
    assert uris == {"report.md": f"runs:/{parent}/reports/report.md"}
    run = MlflowClient().get_run(parent)
    text = run.data.tags[tracking.NOTE_TAG]
    assert "data-v7" in text and "25.0% (95% CI 10.0% - 50.0%)" in text and "v3" in text
    assert run.data.tags["gate_decision"] == "failed: min_success_rate"
    assert run.data.tags["registered_version"] == "3"
    assert [a.path for a in MlflowClient().list_artifacts(parent, "reports")] == [
        "reports/report.md"
    ]
    assert tracking.promotion_tags({}) == {
        "gate_decision": "not requested",
        "approval": "not requested",
    }


def test_the_experiments_artifacts_sit_beside_its_database(store):
    """A store outside the checkout keeps its artifacts outside it too."""
    from mlflow import MlflowClient

    tracking.start_pipeline_run("retrain test", {}, {})
    exp = MlflowClient().get_experiment_by_name(tracking.EXPERIMENT)
    root = Path(store.removeprefix("sqlite:///")).parent
    assert exp.artifact_location == (root / "artifacts" / tracking.EXPERIMENT).as_uri()
