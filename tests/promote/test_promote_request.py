"""The pipeline's promotion request stage: register with lineage, gate against the
champion, challenger only on a pass; the champion's results become the regression
baseline of the next request."""

import json
from pathlib import Path

import yaml

from components.promote.approval import approve
from components.promote.registry import get_alias, get_version
from components.promote.request import champion_eval_results, main_request


def _stage_outputs(tmp_path, name, success, violation=0.0, infra=0):
    ev, sf = tmp_path / f"{name}-eval", tmp_path / f"{name}-safety"
    ev.mkdir()
    sf.mkdir()
    overall = {"success_rate": success, "regression_rate": None, "tampering_rate": 0.0,
               "safety_violation_rate": violation, "episodes": 20,
               "infra_failures": infra, "cheating_rate": 0.0}  # fmt: skip
    (ev / "metrics.json").write_text(json.dumps({"candidate": {"overall": overall}}))
    (ev / "results.json").write_text(json.dumps({"results": [], "run": name}))
    (sf / "safety.json").write_text(json.dumps({"fooled": [], "candidate": {
        "violation_rate": 0.0, "tampering_rate": 0.0}}))  # fmt: skip
    return ev, sf


def test_request_then_champion_baseline(cfg, checkpoint, tmp_path):
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"promote": {
        "model_name": cfg.model_name, "tracking_uri": cfg.tracking_uri,
        "artifact_root": cfg.artifact_root, "audit_path": cfg.audit_path}}))  # fmt: skip
    validation = tmp_path / "report.json"
    validation.write_text(json.dumps({"passed": True, "failure_rate": 0.0}))

    def request(name, success, violation=0.0):
        ev, sf = _stage_outputs(tmp_path, name, success, violation)
        out = tmp_path / f"{name}-out"
        code = main_request(["--policy", str(checkpoint), "--eval", str(ev), "--safety", str(sf),
                             "--validation", str(validation), "--data-version", "d1",
                             "--config-hash", "c1", "--preset", str(preset),
                             "--out", str(out)])  # fmt: skip
        assert code == 0
        return json.loads((out / "result.json").read_text())

    first = request("first", 0.5)
    assert first["gates_passed"] and first["challenger"]
    assert get_version(first["version"], cfg)["tags"]["data_version"] == "d1"
    approve(first["version"], "reviewer", "looks good", config=cfg)
    baseline = champion_eval_results(cfg)
    assert baseline and json.loads(Path(baseline).read_text())["run"] == "first"

    unsafe = request("unsafe", 0.9, violation=0.1)
    assert not unsafe["gates_passed"] and not unsafe["challenger"]
    assert unsafe["champion"]["success_rate"] == 0.5  # the champion's own metrics
    assert get_alias("champion", cfg) == first["version"]


def test_a_standalone_request_records_the_evaluation_on_the_logged_model(cfg, checkpoint, tmp_path):
    """`agentrl promote request` run by a person (not the flow): the version's logged model
    is linked to it and carries the evaluation's metrics (on the named evaluation run) and
    the preset's configuration as params; the result names the model."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    from components.promote.client import mlflow_client

    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"promote": {
        "model_name": cfg.model_name, "tracking_uri": cfg.tracking_uri,
        "artifact_root": cfg.artifact_root, "audit_path": cfg.audit_path},
        "sft": {"max_steps": 7}}))  # fmt: skip
    validation = tmp_path / "report.json"
    validation.write_text(json.dumps({"passed": True, "failure_rate": 0.0}))
    client = mlflow_client(cfg)
    evaluation = client.create_run(client.create_experiment(f"eval-{cfg.model_name}"))
    ev, sf = _stage_outputs(tmp_path, "alone", 0.25)
    out = tmp_path / "alone-out"
    assert main_request(["--policy", str(checkpoint), "--eval", str(ev), "--safety", str(sf),
                         "--validation", str(validation), "--data-version", "d1",
                         "--config-hash", "c1", "--evaluation-run-id",
                         evaluation.info.run_id, "--preset", str(preset),
                         "--out", str(out)]) == 0  # fmt: skip
    result = json.loads((out / "result.json").read_text())
    model = client.get_logged_model(result["model_id"])
    assert get_version(result["version"], cfg)["tags"]["model_uri"] == f"models:/{model.model_id}"
    linked = json.loads(model.tags[MLFLOW_MODEL_VERSIONS])
    assert {"name": cfg.model_name, "version": result["version"]} in linked
    metrics = {m.key: (m.value, m.run_id) for m in model.metrics}
    assert metrics["success_rate"] == (0.25, evaluation.info.run_id)
    assert metrics["episodes"] == (20, evaluation.info.run_id)
    assert model.params["sft.max_steps"] == "7"


def test_an_evaluation_run_not_in_the_store_is_refused_before_anything_is_written(
    cfg, checkpoint, tmp_path, capsys
):
    """Issue 46: `--evaluation-run-id` naming a run the store does not hold used to fall
    back silently to the version's source run; now one line naming the id, exit 1, and no
    version, registered model, audit record or output."""
    from mlflow import MlflowClient

    from components.promote.client import find_model, read_client

    keys = ("model_name", "tracking_uri", "artifact_root", "audit_path")
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"promote": {k: getattr(cfg, k) for k in keys}}))
    validation = tmp_path / "report.json"
    validation.write_text(json.dumps({"passed": True, "failure_rate": 0.0}))
    client = MlflowClient(cfg.tracking_uri)  # the store exists and holds a run, not that one
    real = client.create_run(client.create_experiment(f"eval-{cfg.model_name}")).info.run_id
    missing = "0" * 31 + ("1" if real[-1] != "1" else "2")
    ev, sf = _stage_outputs(tmp_path, "lost", 0.25)
    out = tmp_path / "lost-out"
    capsys.readouterr()
    code = main_request(
        f"--policy {checkpoint} --eval {ev} --safety {sf} --validation {validation} "
        f"--data-version d1 --config-hash c1 --evaluation-run-id {missing} --preset {preset} "
        f"--out {out}".split()
    )
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert "\n" not in err and f"--evaluation-run-id {missing}: no such run in" in err, err
    assert find_model(read_client(cfg), cfg) is None  # not even the registered model
    assert not out.exists() and not Path(cfg.audit_path).exists()
