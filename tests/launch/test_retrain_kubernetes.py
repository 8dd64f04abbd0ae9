"""`retrain` with the Kubernetes launcher, against kmock on loopback (kube_fake.py).

- fast tier: the flow's own code with its Prefect tasks and MLflow tracking stubbed out
  and canned stage results, so no stage computes: the default preset, with `launcher:
  kubernetes`, submits exactly the expected Jobs (one per stage, in order, each a valid
  batch/v1 Job), and each is deleted;
- integration tier: the real flow (Prefect, MLflow) on a tiny preset, where a LocalKubelet
  runs every Job's container command on this machine; the Jobs are the stages of the
  preset with the preset's image, namespace, labels and pool resources, and the results
  equal those of the same flow run in-process.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml
from kube_fake import FakeCluster, LocalKubelet, build_image

from components.launch.config import launcher_config_from_dict
from components.launch.launcher import MANAGED_BY, expected_jobs_for, job_summary, stage_key
from components.preset import load_preset
from tests.tiny_pipeline import tiny_preset

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"  # as in test_launcher.py
STAGES = ["generate", "gate", "expert", "ingest", "validate", "snapshot", "policy-init", "sft",
          "grpo", "evaluate", "safety", "promote-request"]  # fmt: skip
POOLS = ["cpu", "sandbox", "sandbox", "cpu", "cpu", "cpu", "cpu", "gpu", "gpu", "cpu", "cpu",
         "cpu"]  # fmt: skip


def expected_stages(preset_path: str, results: dict[str, dict], run_id: str,
                    training_run_id: str = "",
                    evaluation_run_id: str = "") -> list[tuple]:  # fmt: skip
    """(stage, argv) of a `retrain` of a GRPO-only preset, given the stages' results: the
    contract of flows/retrain.py, written out. Every stage reads its settings from the
    preset file (`--preset`, appended last); the command lines carry only paths, splits and
    the pipeline's wiring."""
    from flows.retrain import _fingerprint

    p = load_preset(preset_path)
    pipe = p.section("pipeline")
    w = pipe.workdir
    grpo = f"{w}/grpo-{_fingerprint(results['sft'])}"
    candidate = results["grpo"]["policy_dir"]
    stages = [
        ("generate", ["tasks", "generate", "--out", f"{w}/tasks", "--overwrite"]),
        ("gate", ["tasks", "check", "--tasks", f"{w}/tasks", "--report", f"{w}/gate.json"]),
        ("expert", ["env", "eval", "--tasks", f"{w}/tasks", "--split", "train", "--policy",
                    pipe.expert_policy, "--out", f"{w}/expert/results.json", "--trajectories-out",
                    f"{w}/expert/expert.jsonl", "--quiet"]),
        ("ingest", ["data", "ingest", f"{w}/expert/expert.jsonl", "--overwrite"]),
        ("validate", ["data", "validate", "--eval-tasks", f"{w}/tasks"]),
        ("snapshot", ["data", "snapshot", "-m", f"retrain {p.name}"]),
        ("policy-init", ["policy", "init", "--records", f"{w}/expert/expert.jsonl", "--out",
                         f"{w}/policy0"]),
        ("sft", ["train", "sft", "--policy", results["policy-init"]["policy_dir"], "--records",
                 "data/validated", "--out", f"{w}/sft"]),
        ("grpo", ["train", "grpo", "--policy", results["sft"]["policy_dir"], "--tasks",
                  f"{w}/tasks", "--split", "train", "--out", grpo]),
        ("evaluate", ["evaluate", "run", "--tasks", f"{w}/tasks", "--model", candidate, "--out",
                      f"{w}/eval", "--title", f"Candidate ({p.name})"]),
        ("safety", ["evaluate", "safety", "--out", f"{w}/safety", "--model", candidate]),
        ("promote-request", ["promote", "request", "--policy", candidate, "--eval", f"{w}/eval",
                             "--safety", f"{w}/safety", "--validation",
                             "reports/data_validation/report.json", "--data-version",
                             results["snapshot"]["version"], "--config-hash", p.config_hash(),
                             "--training-run-id", training_run_id, "--evaluation-run-id",
                             evaluation_run_id, "--pipeline-run-id", run_id,
                             "--fingerprints",
                             f"{w}/fingerprints.json", "--out", f"{w}/promote"]),
    ]  # fmt: skip
    return [(name, [str(a) for a in [*argv, "--preset", preset_path]]) for name, argv in stages]


def expected_labels(stage: str, pool: str, run_id: str, extra: dict) -> dict:
    return {**extra, "app.kubernetes.io/part-of": "agentrl",
            "app.kubernetes.io/managed-by": MANAGED_BY, "agentrl/stage": stage,
            "agentrl/pool": pool, "agentrl/run-id": run_id}  # fmt: skip


def assert_jobs_cleaned_up(cluster: FakeCluster) -> None:
    created = [j["metadata"]["name"] for j in cluster.created_jobs()]
    assert cluster.live_jobs() == [] and cluster.live_pods() == []
    assert cluster.deletions() == [f"{name}?propagationPolicy=Background" for name in created]
    assert cluster.controller_error is None


# -- fast tier: the flow's wiring, stages not executed -------------------------------------

CANNED = {
    "snapshot": {"version": "0123456789abcdef0123456789abcdef"},
    "policy-init": {"policy_dir": "runs/pipeline/policy0/policy"},
    "sft": {"policy_dir": "runs/pipeline/sft/policy", "losses": [2.0, 1.0]},
    "grpo": {"policy_dir": "runs/pipeline/grpo-x/policy"},
    "evaluate": {"candidate": {"overall": {"success_rate": 0.25}}},
    "promote-request": {"version": 1, "challenger": False},
}


class CannedStage:
    """Stands in for the Prefect task `stages.run`: writes the stage's canned result where
    the stage would, then runs the task's real body (the launcher, against a fake cluster
    that "succeeds" every Job without running it). Keeps what the flow got, by stage."""

    def __init__(self):
        self.results: dict[str, dict] = {}

    def with_options(self, **_):
        return self

    def __call__(self, name, argv, result_file, *, return_state, **kw):
        from flows import stages

        path = Path(result_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(CANNED.get(name, {})) + "\n")
        self.results[name] = stages.run.fn(name, argv, result_file, **kw)
        return SimpleNamespace(name="Completed", result=lambda: self.results[name])


def test_default_preset_submits_one_job_per_stage(tmp_path, monkeypatch):
    from components.promote import request
    from flows import retrain as retrain_module

    monkeypatch.chdir(tmp_path)
    canned = CannedStage()
    fake_stages = SimpleNamespace(run=canned, open_run=lambda *a: "run-1", track=lambda *a: "",
                                  close_run=lambda *a: None, log_traces=lambda *a: 0,
                                  fingerprints=lambda *a: {}, runtime_tags=dict,
                                  link_runs=lambda run_id: {"mlflow_run_url": run_id})  # fmt: skip
    monkeypatch.setattr(retrain_module, "stages", fake_stages)
    # The parent run's model-centric record is tracking, faked with `stages` above.
    monkeypatch.setattr(retrain_module, "describe_parent", lambda *a, **k: None)
    monkeypatch.setattr(request, "champion_eval_results", lambda config: None)
    preset = yaml.safe_load((ROOT / "configs" / "cpu-demo.yaml").read_text())
    with FakeCluster() as cluster:
        # The preset says how to reach the API server; `launcher_mode` switches to it.
        preset["launcher"] = {"api_url": cluster.url, "poll_initial_s": 0.01, "poll_max_s": 0.05}
        Path("preset.yaml").write_text(yaml.safe_dump(preset))
        summary = retrain_module.retrain.fn("preset.yaml", launcher_mode="kubernetes")
    created = cluster.created_jobs()
    assert summary["promotion"] == canned.results["promote-request"]
    stages = expected_stages("preset.yaml", canned.results, "run-1")
    assert [name for name, _ in stages] == STAGES == list(canned.results)
    # Each stage runs where the flow reads its results: the Job's workingDir.
    cwd = str(tmp_path.resolve())
    config = launcher_config_from_dict({**preset["launcher"], "mode": "kubernetes", "cwd": cwd})
    assert {job_summary(j)["working_dir"] for j in created} == {cwd}
    assert [job_summary(j) for j in created] == expected_jobs_for(stages, config)
    assert [job_summary(j)["pool"] for j in created] == POOLS
    for job, name, pool in zip(created, STAGES, POOLS, strict=True):
        assert job["metadata"]["labels"] == expected_labels(name, pool, "run-1", {})
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert_jobs_cleaned_up(cluster)


def test_launcher_settings_are_the_presets_section_checked_before_any_stage(tmp_path):
    from flows.retrain import launcher_settings

    path = tmp_path / "preset.yaml"
    path.write_text("launcher: {mode: kubernetes, namespace: ci}\n")
    assert launcher_settings(load_preset(path)) == {"mode": "kubernetes", "namespace": "ci"}
    assert launcher_settings(load_preset(path), "subprocess")["mode"] == "subprocess"
    path.write_text("launcher: {namspace: ci}\n")
    with pytest.raises(ValueError, match="unknown key.*namspace"):
        launcher_settings(load_preset(path))


# -- integration tier: the real flow, every Job's command run by a LocalKubelet ------------

# Keys whose values are measurements (timings, throughput) and differ from run to run.
TIMING_KEY = re.compile(r"(^|_)(s|seconds|second|runtime)(_total|_mean)?$|_at$|^timings?$")
# Data bytes differ too: expert trajectories carry pytest's measured durations ("1 failed
# in 0.03s"), so the content hashes and sizes of data/ (the data version) do.
DATA_KEY = {"size", "dvc_file"}
HASH = re.compile(r"\b[0-9a-f]{32}(?:[0-9a-f]{32})?\b")  # md5s, data versions, MLflow run ids
FINGERPRINT = re.compile(r"grpo-[0-9a-f]{8}")  # _fingerprint() of a result with its timing


def comparable(value, workdir: Path):
    """A stage result without what legitimately differs between two runs of the flow."""
    if isinstance(value, dict):
        return {k: comparable(v, workdir) for k, v in value.items()
                if not TIMING_KEY.search(k) and k not in DATA_KEY}  # fmt: skip
    if isinstance(value, list | tuple):
        return [comparable(v, workdir) for v in value]
    if isinstance(value, str):
        text = value.replace(str(workdir), "<workdir>")
        return FINGERPRINT.sub("grpo-<fp>", HASH.sub("<hash>", text))
    return value


class Collect(logging.Handler):
    """Keeps the messages of a logger."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_retrain(workdir: Path, preset: dict, monkeypatch, launcher_mode: str = ""):
    """`retrain` of `preset` in `workdir`, with its own MLflow store and promotion files
    there. Returns its summary, the (stage, argv) launched and the stage results, in stage
    order, and the messages of its task runs' loggers (the run's log in Prefect)."""
    from components.launch import launcher as launcher_module
    from components.promote import config as promote_config
    from flows import stages
    from flows.retrain import retrain

    workdir.mkdir()
    (workdir / "mlruns").mkdir()
    (workdir / "preset.yaml").write_text(yaml.safe_dump(preset))
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")
    monkeypatch.setattr(promote_config, "REPO_ROOT", workdir)  # audit log, kept evaluations
    launched, results = [], []
    run_stage, read_result = launcher_module.run_stage, stages._read_result

    def spy_run_stage(name, argv, config, log=print):
        launched.append((name, list(argv)))
        return run_stage(name, argv, config, log)

    def spy_read_result(path):
        results.append(read_result(path))
        return results[-1]

    monkeypatch.setattr(launcher_module, "run_stage", spy_run_stage)
    monkeypatch.setattr(stages, "_read_result", spy_read_result)
    logs = Collect()
    logging.getLogger("prefect.task_runs").addHandler(logs)
    try:
        summary = retrain("preset.yaml", launcher_mode=launcher_mode)
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(logs)
        monkeypatch.undo()
    return SimpleNamespace(summary=summary, launched=launched, results=results,
                           logs=logs.messages)  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_retrain_on_kubernetes_runs_the_expected_jobs_with_in_process_results(
    tmp_path, monkeypatch, prefect_harness
):
    tmp_path = tmp_path.resolve()  # the flow passes its resolved folder as workingDir
    inproc_dir, kube_dir = tmp_path / "in-process", tmp_path / "kubernetes"
    # The image: a copy of the source tree (its root is the stages' repository root, as
    # /app is in the image) and its WORKDIR, an empty folder: a stage finds the flow's
    # files only if its Job says where they are (workingDir).
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    kubelet = LocalKubelet(
        workspace,
        image_root=build_image(tmp_path / "image"),
        config_maps={"agentrl-settings": {
            "MLFLOW_TRACKING_URI": f"sqlite:///{kube_dir / 'mlruns' / 'mlflow.db'}"}},
        secrets={"agentrl-s3": {}, "agentrl-verdict-key": {"verdict-mac.key": "3c" * 32}},
    )  # fmt: skip
    with FakeCluster(kubelet=kubelet, poll_s=0.2) as cluster:
        launcher = {
            "mode": "kubernetes", "api_url": cluster.url, "namespace": "agentrl-ci",
            "image": "registry.example/agentrl:0.1.0-ci", "labels": {"team": "rl"},
            "env": {"TOKENIZERS_PARALLELISM": "false"},
            "resources": {"cpu": {"cpu": "1", "memory": "2Gi"},
                          "sandbox": {"cpu": "1", "memory": "1Gi"},
                          "gpu": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                          "train grpo": {"nvidia.com/gpu": "2"}},
            "poll_initial_s": 0.1, "poll_max_s": 1.0, "pending_timeout_s": 60,
        }  # fmt: skip
        preset = tiny_preset(launcher)
        t0 = time.perf_counter()
        reference = run_retrain(inproc_dir, preset, monkeypatch, launcher_mode="in-process")
        t1 = time.perf_counter()
        kube = run_retrain(kube_dir, preset, monkeypatch)
        t2 = time.perf_counter()
    summary, launched, results = kube.summary, kube.launched, kube.results
    print(f"in-process flow {t1 - t0:.0f} s, kubernetes flow {t2 - t1:.0f} s")
    created = cluster.created_jobs()
    run_id = summary["run_id"]

    # The Jobs: one per stage of the preset, in order, each from its pool's template with the
    # preset's image, namespace, labels, environment and resources.
    config = launcher_config_from_dict({**launcher, "run_id": run_id, "cwd": str(kube_dir)})
    monkeypatch.chdir(kube_dir)
    # The candidate's MLflow model is logged from the run of the stage that trained it.
    import mlflow

    grpo_runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.mlflow.parentRunId = '{run_id}' and tags.stage = 'grpo'",
        output_format="list",
    )
    evaluate_runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.mlflow.parentRunId = '{run_id}' and tags.stage = 'evaluate'",
        output_format="list",
    )
    assert len(grpo_runs) == 1 and len(evaluate_runs) == 1
    stages = expected_stages("preset.yaml", dict(zip(STAGES, results, strict=True)), run_id,
                             grpo_runs[0].info.run_id, evaluate_runs[0].info.run_id)  # fmt: skip
    assert [name for name, _ in launched] == STAGES
    assert launched == stages
    assert [job_summary(j) for j in created] == expected_jobs_for(stages, config)
    for job, name, pool in zip(created, STAGES, POOLS, strict=True):
        pod = job["spec"]["template"]
        container = pod["spec"]["containers"][0]
        assert job["metadata"]["namespace"] == "agentrl-ci"
        assert container["image"] == "registry.example/agentrl:0.1.0-ci"
        assert job["metadata"]["labels"] == expected_labels(name, pool, run_id, {"team": "rl"})
        assert pod["metadata"]["labels"]["agentrl/role"] == pool
        assert container["resources"]["limits"] == container["resources"]["requests"]
        assert container["resources"]["limits"] == config.resources_for(
            stage_key(container["command"][1:])
        )
        assert {"name": "TOKENIZERS_PARALLELISM", "value": "false"} in container["env"]
    assert created[STAGES.index("grpo")]["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["nvidia.com/gpu"] == "2"  # fmt: skip

    # Every Job ran (the kubelet's processes all exited 0), its log reached the task run's
    # log, and it was deleted with its pod.
    assert [run.returncode for run in kubelet.runs.values()] == [0] * len(STAGES)
    for stage, run in zip(STAGES, kubelet.runs.values(), strict=True):
        first_line = run.output.decode().split("\n")[0]
        assert f"[{stage}] {first_line}" in kube.logs
    assert_jobs_cleaned_up(cluster)
    assert list(workspace.iterdir()) == []

    # The outputs: those of the same flow run in-process.
    assert comparable(launched, kube_dir) == comparable(reference.launched, inproc_dir)
    assert comparable(results, kube_dir) == comparable(reference.results, inproc_dir)
    keys = ("candidate", "evaluation", "promotion")
    assert comparable({k: summary[k] for k in keys}, kube_dir) == comparable(
        {k: reference.summary[k] for k in keys}, inproc_dir
    )
    assert summary["promotion"]["challenger"] is True
    assert str(summary["promotion"]["version"]) == "1"
    # The promotion stage wrote where the image's root is, not into this checkout.
    assert (tmp_path / "image" / "mlruns" / "evaluations" / "agentrl-coder-v1.json").is_file()
