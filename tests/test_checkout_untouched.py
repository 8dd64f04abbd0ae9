"""Tests leave the checkout untouched (issue 46 item 4): `make test` once registered a test
model in the checkout's own mlruns/. The suite's fixtures and the stores' defaults run
here, and the paths a test could write (the git-ignored stores and folders, the data
version files) must be as they were.

Only those paths are compared, so edits made meanwhile to tracked sources (other people's
work in the same checkout) do not count; a new folder under runs/ or models/ does, files
inside one that was already there (a benchmark writing its own run) do not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Wholly compared: the stores a default configuration writes to.
STORES = ("mlruns", "data", "reports", ".dvc-remote", ".dvc", "data.dvc", "data-versions.jsonl")
# Compared by their entries: folders where long runs of their own live.
RUN_FOLDERS = ("runs", "models")


def checkout_state() -> dict:
    """What the paths a test could write hold now: each file's size and mtime under the
    stores, the entry names of the run folders, and git's word on the tracked ones."""
    files = {}
    for name in STORES:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for f in found:
            stat = f.lstat()
            files[str(f.relative_to(ROOT))] = (stat.st_size, stat.st_mtime_ns)
    entries = {
        name: sorted(p.name for p in (ROOT / name).iterdir())
        for name in RUN_FOLDERS
        if (ROOT / name).is_dir()
    }
    git = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--", *STORES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {"files": files, "entries": entries, "git": git}


def changed(before: dict, after: dict) -> list[str]:
    out = [
        f"{k}: {before['files'].get(k)} -> {after['files'].get(k)}"
        for k in sorted(before["files"].keys() | after["files"].keys())
        if before["files"].get(k) != after["files"].get(k)
    ]
    for name in RUN_FOLDERS:
        new = set(after["entries"].get(name, [])) - set(before["entries"].get(name, []))
        out += [f"{name}/{entry}: new" for entry in sorted(new)]
    if before["git"] != after["git"]:
        out.append(f"git status: {before['git']!r} -> {after['git']!r}")
    return out


def test_a_pipeline_run_folder_keeps_a_stages_files_in_it(pipeline_workdir):
    """The `pipeline_workdir` fixture: a stage's relative paths land in the run folder."""
    from flows import stages

    before = checkout_state()
    out = stages.run.fn(
        "generate",
        ["tasks", "generate", "--out", "runs/pipeline/tasks", "--n", "2"],
        "runs/pipeline/tasks/suite.json",
    )
    assert out["n_tasks"] == 2 and (pipeline_workdir / "runs" / "pipeline" / "tasks").is_dir()
    assert changed(before, checkout_state()) == []


def test_the_stores_a_test_gets_without_naming_one_are_not_the_checkouts(tmp_path):
    """What a test gets by default (tests/conftest.py): a parent and stage run, a model
    registered with the registry's defaults, its audit log: none in the checkout."""
    from components import tracking
    from components.promote import registry
    from components.promote.config import PromotionConfig
    from components.promote.registry import Lineage

    before = checkout_state()
    defaults = PromotionConfig()
    for path in (
        tracking.tracking_uri().removeprefix("sqlite:///"),
        defaults.resolved_tracking_uri().removeprefix("sqlite:///"),
        defaults.resolved_audit_path(),
    ):
        assert not Path(path).resolve().is_relative_to(ROOT), path
    parent = tracking.start_pipeline_run("checkout test", {"sft": {"max_steps": 1}}, {})
    trained = tracking.log_stage(parent, "sft", {}, {"losses": [1.0, 0.5]}, 0.1)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (ckpt / "tokenizer.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    version = registry.register_candidate(
        ckpt,
        Lineage(
            data_version="d1", config_hash="c1", training_run_id=trained, pipeline_run_id=parent
        ),
        defaults,
    )
    assert version and defaults.resolved_audit_path().is_file()
    assert changed(before, checkout_state()) == []


def test_an_experiment_created_without_an_artifact_folder_keeps_its_files_out(tmp_path):
    """MLflow's default for such an experiment is ./mlruns/<id> of the working directory
    (the checkout, under pytest): tests/conftest.py moves it to the session's folder."""
    from mlflow import MlflowClient

    before = checkout_state()
    client = MlflowClient()
    experiment = client.create_experiment(f"no-artifact-folder-{tmp_path.name}")
    run = client.create_run(experiment)
    (tmp_path / "note.txt").write_text("a file")
    client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
    assert (
        not Path(client.get_experiment(experiment).artifact_location.removeprefix("file://"))
        .resolve()
        .is_relative_to(ROOT)
    )
    assert changed(before, checkout_state()) == []
