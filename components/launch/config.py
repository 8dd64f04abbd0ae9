"""Where a stage runs: in this process, in a child process, or as a Kubernetes Job.

No Kubernetes (or Prefect) import here: flows and the CLI read this module to validate a
config file, and `agentrl --help` must stay fast. The values are checked in
`__post_init__`, where they are defined; the pool templates are read when a Job is built
(a config written on a laptop validates on a cluster).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from components.typed_config import config_from_dict, doc

# Repository root: pool templates ship in infra/prefect/ (also copied into the image).
ROOT = Path(__file__).resolve().parents[2]

Mode = Literal["in-process", "subprocess", "kubernetes"]
MODES = ("in-process", "subprocess", "kubernetes")

# A Kubernetes resource quantity ("500m", "4Gi", "1"); a typo is caught here, not by the
# API server after the image was pulled.
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _default_pools() -> dict[str, str]:
    return {
        "cpu": "infra/prefect/cpu-pool.json",
        "gpu": "infra/prefect/gpu-pool.json",
        "sandbox": "infra/prefect/sandbox-pool.json",
    }


# Stages that execute agent actions (tools, commands, verdicts): on Kubernetes each runs
# in the sandbox pool, or behind the environment server (`env_server_stages`).
AGENT_STAGES = (
    "tasks check",
    "tasks import",
    "env eval",
    "train grpo",
    "rollout sample",
    "evaluate run",
    "evaluate safety",
)
# Set in a stage pod outside the sandbox pool that must not run an agent's action itself:
# components/env_service/client.py refuses an in-process episode where it is set.
REQUIRE_ENV_REMOTE = "AGENTRL_REQUIRE_ENV_REMOTE"


def _default_stage_pools() -> dict[str, str]:
    # Training holds the GPUs; stages that execute agent-written code and need nothing
    # else run in the sandbox pool (deny-all network); everything else is CPU work.
    return {
        "train": "gpu",
        "tasks check": "sandbox",
        "tasks import": "sandbox",
        "env eval": "sandbox",
    }


def _default_env_server_stages() -> tuple[str, ...]:
    # They need what the sandbox pool lacks (GPUs, the policy server, MLflow): their
    # episodes run on the environment server (infra/base/env-service.yaml) instead.
    return ("train grpo", "rollout sample", "evaluate run", "evaluate safety")


def _default_resources() -> dict[str, dict[str, str]]:
    # Requests = limits: a stage is scheduled only where it fits, and a ResourceQuota
    # counts exactly what it may use (Guaranteed QoS, evicted last).
    return {
        "cpu": {"cpu": "2", "memory": "4Gi"},
        "sandbox": {"cpu": "2", "memory": "4Gi"},
        "gpu": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }


@dataclass(frozen=True)
class LauncherConfig:
    """How `run_stage` runs an `agentrl` command line; one instance per pipeline run."""

    mode: Mode = field(
        default="in-process",
        metadata=doc(
            "in-process: call components.cli.main here; subprocess: `python -m "
            "components.cli` as a child; kubernetes: a batch/v1 Job from the pool template"
        ),
    )
    namespace: str = field(default="agentrl", metadata=doc("namespace the Jobs run in"))
    image: str = field(
        default="agentrl:0.1.0",
        metadata=doc("the components image (Dockerfile), pinned by tag or digest"),
    )
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = field(
        default="IfNotPresent", metadata=doc("Kubernetes imagePullPolicy of stage pods")
    )
    pools: dict[str, str] = field(
        default_factory=_default_pools,
        metadata=doc(
            "pool name -> Prefect Kubernetes base job template (JSON); relative paths "
            "are taken from the repository root"
        ),
    )
    stage_pools: dict[str, str] = field(
        default_factory=_default_stage_pools,
        metadata=doc(
            "'group command' or 'group' -> pool name; the most specific key wins, "
            "unlisted stages go to `default_pool`"
        ),
    )
    default_pool: str = field(default="cpu", metadata=doc("pool of stages not listed"))
    env_server_stages: tuple[str, ...] = field(
        default_factory=_default_env_server_stages,
        metadata=doc(
            "'group command' of stages that execute agent actions outside the sandbox pool: "
            "as Jobs they get AGENTRL_REQUIRE_ENV_REMOTE, so they run episodes only through "
            "the environment server (the preset's env.remote), never in their own pod"
        ),
    )
    resources: dict[str, dict[str, str]] = field(
        default_factory=_default_resources,
        metadata=doc(
            "pool or stage key -> {resource: quantity}, set as requests and limits; "
            "a stage key ('train grpo') overrides its pool's entry; an entry replaces the "
            "default entry of its key, keys not named keep their defaults"
        ),
    )
    service_account: str = field(
        default="agentrl-stage",
        metadata=doc("service account of stage pods (no API token mounted: see infra/base)"),
    )
    env: dict[str, str] = field(
        default_factory=dict,
        metadata=doc("extra environment of the stage (e.g. MLFLOW_TRACKING_URI)"),
    )
    torch_threads: int = field(
        default=2,
        metadata=doc(
            "intra-op threads of every stage (torch.set_num_threads in-process, "
            "OMP_NUM_THREADS / MKL_NUM_THREADS otherwise): set here, not by the machine's "
            "core count, so the same preset gives the same weights and evaluation on any "
            "CPU of the same ISA; 0 leaves torch's default (the machine's cores)"
        ),
    )
    labels: dict[str, str] = field(
        default_factory=dict, metadata=doc("extra labels on the Job and its pods")
    )
    run_id: str = field(
        default="",
        metadata=doc("pipeline run id, set as label agentrl/run-id (find a run's Jobs)"),
    )
    owner_pod: str = field(
        default="",
        metadata=doc(
            "'name:uid' of the pod that launches (downward API); set as the Jobs' "
            "ownerReference so deleting a flow run's pod garbage-collects its stages"
        ),
    )
    timeout_s: float = field(
        default=6 * 3600.0,
        metadata=doc("wall-clock limit of one stage; also the Job's activeDeadlineSeconds"),
    )
    pending_timeout_s: float = field(
        default=900.0,
        metadata=doc(
            "how long a pod may stay unschedulable or waiting before the stage fails "
            "(long enough for a cluster autoscaler to add a GPU node)"
        ),
    )
    poll_initial_s: float = field(default=0.5, metadata=doc("first status poll interval"))
    poll_max_s: float = field(default=10.0, metadata=doc("poll interval cap (backoff x1.5)"))
    ttl_after_finished_s: int = field(
        default=3600,
        metadata=doc(
            "Job TTL after it finishes: Kubernetes removes what a crashed launcher could not delete"
        ),
    )
    keep_job: bool = field(
        default=False, metadata=doc("leave the Job (and its pods) for inspection")
    )
    api_url: str = field(
        default="",
        metadata=doc(
            "API server URL used without credentials (kubectl proxy, a test server); "
            "'' = in-cluster service account, else the kubeconfig"
        ),
    )
    kube_context: str = field(default="", metadata=doc("kubeconfig context ('' = current)"))
    cwd: str = field(
        default="",
        metadata=doc(
            "working directory of the stage: a subprocess's, or a Job container's workingDir "
            "(then a path on the shared volume); '' = the current one / the image's WORKDIR"
        ),
    )
    log_tail_lines: int = field(
        default=50, metadata=doc("lines of stage output kept in StageResult / errors")
    )

    def __post_init__(self) -> None:
        # A partial `resources` must not leave the pools it does not name unbounded.
        object.__setattr__(self, "resources", {**_default_resources(), **self.resources})
        if self.mode not in MODES:
            raise ValueError(f"LauncherConfig.mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.torch_threads, int) or self.torch_threads < 0:
            raise ValueError(
                f"LauncherConfig.torch_threads must be >= 0, got {self.torch_threads!r}"
            )
        if not _DNS_LABEL.match(self.namespace):
            raise ValueError(f"LauncherConfig.namespace {self.namespace!r} is not a DNS label")
        if not self.image:
            raise ValueError("LauncherConfig.image is empty")
        if self.default_pool not in self.pools:
            raise ValueError(f"default_pool {self.default_pool!r} is not in pools")
        for key, pool in self.stage_pools.items():
            if pool not in self.pools:
                raise ValueError(f"stage_pools[{key!r}] = {pool!r} is not in pools")
        for key in AGENT_STAGES:  # no pod beside the trainer runs an agent's action
            if self.pool_for(key) != "sandbox" and key not in self.env_server_stages:
                raise ValueError(
                    f"LauncherConfig: {key!r} executes agent actions in pool "
                    f"{self.pool_for(key)!r}: put it in the sandbox pool or in env_server_stages"
                )
        for key, values in self.resources.items():
            for name, quantity in values.items():
                if not _QUANTITY.match(str(quantity)):
                    raise ValueError(f"resources[{key!r}][{name!r}] = {quantity!r}: not a quantity")
        if self.owner_pod and len(self.owner_pod.split(":")) != 2:
            raise ValueError("owner_pod must be 'name:uid'")
        for name in ("timeout_s", "pending_timeout_s", "poll_initial_s", "poll_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LauncherConfig.{name} must be > 0")
        if self.poll_max_s < self.poll_initial_s:
            raise ValueError("poll_max_s must be >= poll_initial_s")

    def pool_for(self, stage_key: str) -> str:
        """The pool of 'group command': an exact key first, then the group, then the default."""
        group = stage_key.split(" ")[0]
        return self.stage_pools.get(stage_key, self.stage_pools.get(group, self.default_pool))

    def resources_for(self, stage_key: str) -> dict[str, str]:
        pool = self.pool_for(stage_key)
        return {**self.resources.get(pool, {}), **self.resources.get(stage_key, {})}

    def template_path(self, pool: str) -> Path:
        path = Path(self.pools[pool])
        return path if path.is_absolute() else ROOT / path


def launcher_config_from_dict(values: dict | str | None) -> LauncherConfig:
    """From a flow parameter or YAML: `"kubernetes"` (just the mode) or a dict of fields.

    Unknown keys are an error, so a misspelt `namspace` does not silently run elsewhere.
    """
    if values is None:
        return LauncherConfig()
    if isinstance(values, str):
        return LauncherConfig(mode=values)  # type: ignore[arg-type]
    return config_from_dict(LauncherConfig, values, "launcher")


def stage_environment(config: LauncherConfig) -> dict[str, str]:
    """The extra environment of a stage: `env` plus the thread count (`torch_threads`):
    OpenMP's and MKL's, which a child's torch reads at start but caps at the core count,
    and AGENTRL_TORCH_THREADS, which the `agentrl` command line sets torch to
    (components/cli.py)."""
    if not config.torch_threads:
        return dict(config.env)
    n = str(config.torch_threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "AGENTRL_TORCH_THREADS": n,
            **config.env}  # fmt: skip
