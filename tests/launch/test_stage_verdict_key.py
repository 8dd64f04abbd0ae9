"""Every stage pod gets the environment server's verdict key, the server's way (issue 47).

The key (components/verifier/provenance.py) signs each episode's verdict where the episode
is judged (the environment server, or a sandbox-pool stage that runs its episodes itself:
`tasks check`, `tasks import`, `env eval`) and is checked wherever records are read for
training or ingested (`train *`, `data ingest`, `rescore`, ...). A stage pod with a key of
its own would sign records no trainer accepts, and quarantine every record the server
signed. So every pool template (infra/prefect/, the launcher's stage Jobs and Prefect's
flow-run pods alike) and the multi-node trainer Job do what env-service.yaml does: the
Secret agentrl-verdict-key mounted only into an init container, copied (umask 077) into a
memory-backed folder that the stage reads through AGENTRL_STATE_DIR, outside every path a
sandboxed command sees. Before this, the stage Jobs had none of it (104c002 gave it to the
server only).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kube_fake import LocalKubelet

from components.cli import COMMANDS
from components.launch.config import LauncherConfig
from components.launch.launcher import build_job
from components.sandbox.bubblewrap import SYSTEM_PATHS
from components.verifier import provenance
from components.verifier.provenance import KEY_FILE, STATE_DIR_ENV

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"  # as tests/infra
SECRET = "agentrl-verdict-key"
# The documented key (docs/scale-out.md: `openssl rand -hex 32`), as the Secret holds it.
SECRET_VALUE = {KEY_FILE: "5f" * 32 + "\n"}


def _server_pod() -> dict:
    docs = yaml.safe_load_all((ROOT / "infra/base/env-service.yaml").read_text())
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def _state_dir(container: dict) -> str:
    return next(e["value"] for e in container.get("env") or [] if e["name"] == STATE_DIR_ENV)


def assert_gets_the_verdict_key(pod: dict, where: str) -> None:
    """`pod` (a pod spec) reads the Secret the environment server reads, at the server's
    state folder, only through its init container's 0600 copy in a memory-backed folder."""
    server = _server_pod()
    state = _state_dir(server["containers"][0])
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    secrets = {n: v["secret"]["secretName"] for n, v in volumes.items() if "secret" in v}
    assert list(secrets.values()) == [SECRET], where  # the one Secret a stage mounts
    (secret_volume,) = secrets
    main = pod["containers"][0]
    assert _state_dir(main) == state, where
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    assert secret_volume not in mounts, f"{where}: the Secret itself is mounted in the stage"
    state_volume = next(n for n, m in mounts.items() if m["mountPath"] == state)
    assert mounts[state_volume].get("readOnly") is True, where
    assert volumes[state_volume]["emptyDir"]["medium"] == "Memory", where
    (init,) = [c for c in pod.get("initContainers") or [] if c["name"] == "verdict-key"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mounts[state_volume] == state and secret_volume in init_mounts, where
    script = " ".join(init["args"])
    assert script.startswith("umask 077 && ") and f"> {state}/{KEY_FILE}" in script, where
    assert init["securityContext"]["allowPrivilegeEscalation"] is False, where
    assert not any(state == p or state.startswith(p + "/") for p in SYSTEM_PATHS), where
    # the same copy the server's init container makes
    (server_init,) = server["initContainers"]
    assert init["args"] == server_init["args"], where


def _argv(key: str) -> list[str]:
    return key.split(" ")  # 'group command' or 'group': the command line's first words


STAGE_KEYS = sorted(f"{g} {c}".strip() for g, c in COMMANDS)


@pytest.mark.parametrize("key", STAGE_KEYS)
def test_every_stage_job_gets_the_servers_verdict_key(key):
    job = build_job(key.replace(" ", "-"), _argv(key), LauncherConfig())
    pool = job["metadata"]["labels"]["agentrl/pool"]
    assert_gets_the_verdict_key(job["spec"]["template"]["spec"], f"{key} ({pool} pool)")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize("pool", ["cpu", "gpu", "sandbox"], ids=lambda p: f"pool-{p}")
def test_prefect_flow_run_pods_get_it_too(pool):
    """A flow run started by the pool's Prefect worker (which may run stages in-process)
    gets the key, and Prefect's own environment beside it."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as JobConfig

    template = json.loads((ROOT / "infra" / "prefect" / f"{pool}-pool.json").read_text())
    variables = JobConfig._get_base_config_defaults(template["variables"]["properties"])
    variables.update({"image": "agentrl:0.1.0", "env": {"AGENTRL_RUN": "r1"}})
    config = JobConfig(**apply_values(template["job_configuration"], variables))
    config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="brave-fox"))
    pod = config.job_manifest["spec"]["template"]["spec"]
    assert_gets_the_verdict_key(pod, f"{pool} flow run")
    assert {"name": "AGENTRL_RUN", "value": "r1"} in pod["containers"][0]["env"]
    assert pod["initContainers"][0]["image"] == "agentrl:0.1.0"  # the stage's own image


def test_a_stage_without_its_copy_step_is_found():
    """The check fails on a stage pod as 271619e..104c002 built it (no init container, no
    state folder): the pod made a key of its own."""
    job = build_job("grpo", ["train", "grpo"], LauncherConfig())
    pod = job["spec"]["template"]["spec"]
    pod.pop("initContainers")
    pod["volumes"] = [v for v in pod["volumes"] if not v["name"].startswith("verdict-")]
    main = pod["containers"][0]
    main["env"] = [e for e in main["env"] if e["name"] != STATE_DIR_ENV]
    with pytest.raises(AssertionError):
        assert_gets_the_verdict_key(pod, "old grpo stage")


def _key_dir(kubelet: LocalKubelet, pod: dict, root: Path) -> str:
    """Run `pod`'s init containers as a kubelet would; the folder its main container's
    AGENTRL_STATE_DIR names then."""
    folders, error = kubelet.pod_folders(pod, root)
    assert error == ""
    failed, code, output = kubelet.init(pod, folders)
    assert (failed, code) == ("", 0), output
    return _state_dir(kubelet.mounted(pod["containers"][0], folders))


def test_the_servers_signature_verifies_in_every_stage_pod(tmp_path, monkeypatch):
    """End to end on this machine: the init containers' own commands (LocalKubelet: the
    Secret's file, the memory folder, the copy) give the server and each stage pod a key
    that provenance reads (owner, mode 0600, length), and a record the server signed is
    accepted there; a pod that made its own key (as every stage did before) rejects it."""
    kubelet = LocalKubelet(tmp_path, secrets={SECRET: SECRET_VALUE})
    server_dir = _key_dir(kubelet, _server_pod(), tmp_path / "server")
    record = {
        "id": "e1",
        "task_id": "t1",
        "reward": 1.0,
        "reward_terms": {"tests": 1.0},
        "final_diff": "--- a\n+++ b\n",
        "trajectory": [{"role": "user", "content": "x"}],
        "metadata": {"success": True, "verifier_version": "v1"},
    }
    monkeypatch.setenv(STATE_DIR_ENV, server_dir)
    assert provenance.sign_record(record)
    for key in ("train grpo", "train sft", "data ingest", "env eval", "rescore"):
        job = build_job("s", _argv(key), LauncherConfig())
        stage_dir = _key_dir(
            kubelet, job["spec"]["template"]["spec"], tmp_path / key.replace(" ", "-")
        )
        assert (
            stage_dir != server_dir and (Path(stage_dir) / KEY_FILE).stat().st_mode & 0o777 == 0o600
        )
        monkeypatch.setenv(STATE_DIR_ENV, stage_dir)
        assert provenance.unverified_reason(record, current="v1") is None, key
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "a-key-of-its-own"))
    assert provenance.unverified_reason(record, current="v1").startswith("bad verdict MAC")
