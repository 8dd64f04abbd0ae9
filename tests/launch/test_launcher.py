"""The launcher's three modes; the Kubernetes one against kmock on loopback (kube_fake.py)."""

from __future__ import annotations

import sys

import kubernetes_validate
import pytest
from kube_fake import FakeCluster, LocalKubelet

from components.launch.config import LauncherConfig, launcher_config_from_dict
from components.launch.launcher import (
    StageFailed,
    build_job,
    expected_jobs_for,
    job_summary,
    run_stage,
    stage_key,
)

K8S_VERSION = "1.33.0"  # the oldest Kubernetes we support; see tests/infra


def kube_config(cluster: FakeCluster, **overrides) -> LauncherConfig:
    values = dict(mode="kubernetes", api_url=cluster.url, image="registry.example/agentrl:0.1.0",
                  poll_initial_s=0.02, poll_max_s=0.1, pending_timeout_s=5.0, run_id="run-1")  # fmt: skip
    return LauncherConfig(**{**values, **overrides})


# -- configuration ----------------------------------------------------------------------


def test_config_validates_where_defined():
    assert launcher_config_from_dict("kubernetes").mode == "kubernetes"
    assert launcher_config_from_dict(None).mode == "in-process"
    with pytest.raises(ValueError, match="mode"):
        LauncherConfig(mode="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a quantity"):
        LauncherConfig(resources={"gpu": {"memory": "64 GB"}})
    with pytest.raises(ValueError, match="unknown key"):
        launcher_config_from_dict({"namspace": "x"})
    with pytest.raises(ValueError, match="not in pools"):
        LauncherConfig(stage_pools={"train": "tpu"})


def test_stage_keys_and_pools():
    config = LauncherConfig()
    assert stage_key(["train", "grpo", "--out", "x"]) == "train grpo"
    assert stage_key(["serve", "--model", "m"]) == "serve"
    assert config.pool_for("train grpo") == "gpu"
    assert config.pool_for("env eval") == "sandbox"
    assert config.pool_for("data ingest") == "cpu"
    custom = LauncherConfig(resources={**config.resources, "train grpo": {"nvidia.com/gpu": "8"}})
    assert custom.resources_for("train grpo")["nvidia.com/gpu"] == "8"
    assert custom.resources_for("train sft")["nvidia.com/gpu"] == "1"


# -- in-process and subprocess ------------------------------------------------------------


def test_in_process_success_and_failure(capsys):
    result = run_stage("help", ["demo", "--help"], LauncherConfig())
    assert result.returncode == 0 and result.mode == "in-process"
    with pytest.raises(StageFailed, match="exit code 2") as failed:
        run_stage("bad", ["tasks", "frobnicate"], LauncherConfig())
    assert failed.value.result.returncode == 2


def test_subprocess_streams_and_fails_with_tail():
    lines: list[str] = []
    config = LauncherConfig(mode="subprocess")
    with pytest.raises(StageFailed) as failed:
        run_stage("bad", ["tasks", "frobnicate"], config, log=lines.append)
    assert failed.value.result.returncode == 2
    assert any("unknown command" in line for line in failed.value.result.log_tail)
    assert "--- last output ---" in str(failed.value)
    assert any("[bad]" in line for line in lines)


def test_subprocess_timeout_is_reported(tmp_path):
    # The child hangs before the CLI even starts: sitecustomize runs at interpreter start.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    config = LauncherConfig(mode="subprocess", timeout_s=0.5, env={"PYTHONPATH": str(tmp_path)})
    with pytest.raises(StageFailed, match="timed out after 0.5 s"):
        run_stage("slow", ["demo", "--help"], config, log=lambda _: None)


# -- kubernetes: the Job ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["train", "grpo", "--out", "/shared/runs/g"], ["data", "ingest"], ["env", "eval"]]
)
def test_built_jobs_are_valid_for_the_pinned_kubernetes(argv):
    config = LauncherConfig(mode="kubernetes", env={"MLFLOW_RUN": "x"}, owner_pod="flow-abc:uid-1")
    job = build_job("stage one", argv, config)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["agentrl", *argv]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 21600
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert job["metadata"]["labels"]["agentrl/stage"] == "stage-one"
    assert job["spec"]["template"]["metadata"]["labels"]["agentrl/stage"] == "stage-one"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"] == container["resources"]["limits"]
    if argv[0] == "train":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])
    if argv[0] == "env":
        assert pod["automountServiceAccountToken"] is False
        assert job["spec"]["template"]["metadata"]["labels"]["agentrl/role"] == "sandbox"
        assert "envFrom" not in container  # no credentials in the sandbox


# -- kubernetes: against the in-memory API --------------------------------------------------


def test_create_wait_stream_and_clean_up():
    lines: list[str] = []
    with FakeCluster() as cluster:
        result = run_stage("sft", ["train", "sft", "--out", "/shared/sft"], kube_config(cluster),
                           log=lines.append)  # fmt: skip
        assert cluster.live_jobs() == []  # deleted ...
    assert cluster.controller_error is None
    assert result.returncode == 0 and result.pool == "gpu"
    assert result.log_tail == [f"hello from {result.job_name}-x7k2p", "step 1 loss 2.0", "done"]
    assert any("step 1 loss 2.0" in line for line in lines)
    assert cluster.deletions() == [f"{result.job_name}?propagationPolicy=Background"]  # ... once
    assert cluster.live_pods() == []


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("oom", r"BackoffLimitExceeded.*OOMKilled \(exit code 137\)"),
        ("exit3", r"terminated: Error \(exit code 3\): task errors"),
        ("pending-image", r"ImagePullBackOff: Back-off pulling image"),
        ("unschedulable", r"unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu"),
    ],
)
def test_failure_carries_the_pods_reason_and_job_is_deleted(outcome, expected):
    with FakeCluster({"grpo": outcome}) as cluster:
        config = kube_config(cluster, pending_timeout_s=0.3)
        with pytest.raises(StageFailed, match=expected) as failed:
            run_stage("grpo", ["train", "grpo"], config, log=lambda _: None)
        assert cluster.live_jobs() == []
    assert failed.value.result.returncode == 1
    assert f"Job agentrl/{failed.value.result.job_name}" in str(failed.value)
    assert len(cluster.deletions()) == 1


def test_keep_job_leaves_it_for_inspection():
    with FakeCluster({"grpo": "oom"}) as cluster:
        with pytest.raises(StageFailed):
            run_stage(
                "grpo", ["train", "grpo"], kube_config(cluster, keep_job=True), log=lambda _: None
            )
        assert len(cluster.live_jobs()) == 1 and cluster.deletions() == []


def test_three_stage_sequence_submits_the_expected_jobs():
    """What a retrain with `launcher: kubernetes` does: stages one after another."""
    stages = [
        ("sft", ["train", "sft", "--out", "/shared/runs/r1/sft"]),
        ("evaluate", ["env", "eval", "--tasks", "/shared/tasks", "--policy", "oracle"]),
        ("grpo", ["train", "grpo", "--policy", "/shared/runs/r1/sft/policy", "--tasks",
                  "/shared/tasks", "--out", "/shared/runs/r1/grpo"]),
    ]  # fmt: skip
    with FakeCluster() as cluster:
        config = kube_config(cluster, env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
        results = [run_stage(name, argv, config, log=lambda _: None) for name, argv in stages]
        assert cluster.live_jobs() == []
    created = cluster.created_jobs()
    assert [job_summary(j) for j in created] == expected_jobs_for(stages, config)
    assert [j["metadata"]["name"] for j in created] == [r.job_name for r in results]
    assert [r.pool for r in results] == ["gpu", "sandbox", "gpu"]
    assert [job_summary(j)["gpu"] for j in created] == [True, False, True]
    assert all(j["metadata"]["labels"]["agentrl/run-id"] == "run-1" for j in created)
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"} in (
        created[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    )
    assert sorted(cluster.deletions()) == sorted(
        f"{r.job_name}?propagationPolicy=Background" for r in results
    )


# -- kubernetes: a LocalKubelet runs the pods ---------------------------------------------

SETTINGS = {"agentrl-settings": {}}
# The verdict key every stage pod's init container copies (docs/scale-out.md creates it).
VERDICT_KEY = {"agentrl-verdict-key": {"verdict-mac.key": "ab" * 32 + "\n"}}
SECRETS = {"agentrl-s3": {}, **VERDICT_KEY}


def test_kubelet_runs_the_command_and_the_launcher_streams_its_log(tmp_path):
    kubelet = LocalKubelet(tmp_path, config_maps=SETTINGS, secrets=SECRETS)
    lines: list[str] = []
    with FakeCluster(kubelet=kubelet) as cluster:
        argv = ["tasks", "generate", "--out", "tasks", "--n", "3"]
        result = run_stage("generate", argv, kube_config(cluster), log=lines.append)
    assert (tmp_path / "tasks" / "suite.json").is_file()  # in the kubelet's working folder
    assert result.returncode == 0 and result.log_tail[0].startswith("wrote 3 tasks to tasks")
    assert any(line.startswith("[generate] wrote 3 tasks") for line in lines)
    assert [run.returncode for run in kubelet.runs.values()] == [0]
    assert cluster.live_jobs() == [] and cluster.live_pods() == []


def test_kubelet_reports_the_exit_code_and_output_of_a_failing_command(tmp_path):
    kubelet = LocalKubelet(tmp_path, config_maps=SETTINGS, secrets=SECRETS)
    with FakeCluster(kubelet=kubelet) as cluster:
        with pytest.raises(StageFailed, match=r"terminated: Error \(exit code 2\)") as failed:
            run_stage("bad", ["tasks", "frobnicate"], kube_config(cluster), log=lambda _: None)
        assert cluster.live_jobs() == []
    assert "unknown command" in failed.value.result.log_tail[0]


def test_kubelet_needs_the_config_maps_the_pool_template_names(tmp_path):
    # no agentrl-settings: the cpu pool's envFrom fails
    kubelet = LocalKubelet(tmp_path, secrets=VERDICT_KEY)
    with FakeCluster(kubelet=kubelet) as cluster:
        expected = r'CreateContainerConfigError: configmap "agentrl-settings" not found'
        with pytest.raises(StageFailed, match=expected):
            run_stage("ingest", ["data", "ingest"], kube_config(cluster), log=lambda _: None)
        # The sandbox pool mounts no settings and no secret but the verdict key: it starts.
        argv = ["tasks", "check", "--tasks", "none"]
        with pytest.raises(StageFailed, match="exit code"):
            run_stage("gate", argv, kube_config(cluster), log=lambda _: None)
    assert [run.process is None for run in kubelet.runs.values()] == [True, False]


def test_kubelet_waits_for_the_verdict_key_secret_every_pool_mounts(tmp_path):
    """Without the Secret agentrl-verdict-key no stage pod starts (its volume cannot be
    mounted: the pod stays in ContainerCreating), in every pool, the sandbox's included."""
    kubelet = LocalKubelet(tmp_path, config_maps=SETTINGS, secrets={"agentrl-s3": {}})
    with FakeCluster(kubelet=kubelet) as cluster:
        config = kube_config(cluster, pending_timeout_s=1.0)
        for name, argv in (
            ("gate", ["tasks", "check", "--tasks", "none"]),
            ("ingest", ["data", "ingest"]),
        ):
            with pytest.raises(StageFailed, match="no pod started within 1 s"):
                run_stage(name, argv, config, log=lambda _: None)
        assert cluster.live_jobs() == []
    reasons = [run.reason for run in kubelet.runs.values()]
    assert (
        reasons
        == [
            'MountVolume.SetUp failed for volume "verdict-secret" : '
            'secret "agentrl-verdict-key" not found'
        ]
        * 2
    )
    assert all(run.process is None for run in kubelet.runs.values())


def test_a_stage_that_overruns_is_killed_with_its_job(tmp_path):
    # The process hangs before the CLI starts (sitecustomize), past timeout_s = the Job's
    # activeDeadlineSeconds: the launcher gives up, deletes the Job, the process dies.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    kubelet = LocalKubelet(tmp_path, config_maps=SETTINGS, secrets=SECRETS)
    config_env = {"PYTHONPATH": str(tmp_path)}
    with FakeCluster(kubelet=kubelet) as cluster:
        config = kube_config(cluster, timeout_s=1.0, env=config_env)
        with pytest.raises(StageFailed, match="timed out|DeadlineExceeded"):
            run_stage("slow", ["demo", "--help"], config, log=lambda _: None)
    (run,) = kubelet.runs.values()
    assert run.finished.wait(10) and run.returncode == 137


def test_launcher_does_not_import_kubernetes_at_cli_start():
    import subprocess

    probe = subprocess.run(
        [sys.executable, "-c", "import sys, components.cli, components.launch.launcher; "
         "print(sorted(m for m in ('kubernetes', 'prefect', 'torch') if m in sys.modules))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "[]"


def test_partial_resources_keep_the_other_pools_defaults():
    from components.launch.config import launcher_config_from_dict

    config = launcher_config_from_dict({"resources": {"gpu": {"nvidia.com/gpu": "4"}}})
    assert config.resources_for("train grpo") == {"nvidia.com/gpu": "4"}  # the entry replaced
    assert config.resources_for("env eval") == {"cpu": "2", "memory": "4Gi"}  # sandbox kept
    assert config.resources_for("data validate") == {"cpu": "2", "memory": "4Gi"}  # cpu kept


def test_a_presets_launcher_section_keeps_the_other_pools_defaults(tmp_path):
    """The preset's `launcher` section is built by the generic loader; the same merge holds."""
    from components.preset import load_preset

    path = tmp_path / "preset.yaml"
    path.write_text("launcher: {namespace: ci, resources: {gpu: {nvidia.com/gpu: '4'}}}\n")
    config = load_preset(path).section("launcher")
    assert config.namespace == "ci"
    assert config.resources_for("train grpo") == {"nvidia.com/gpu": "4"}
    assert config.resources_for("env eval") == {"cpu": "2", "memory": "4Gi"}
