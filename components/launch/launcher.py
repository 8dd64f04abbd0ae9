"""Run one pipeline stage (an `agentrl` command line) where the configuration says.

    run_stage("grpo", ["train", "grpo", "--policy", ...], LauncherConfig(mode="kubernetes"))

- in-process: `components.cli.main(argv)` here (the laptop default: nothing to start);
- subprocess: `python -m components.cli ...` as a child, output streamed line by line;
- kubernetes: a batch/v1 Job built from the stage's pool template (the same Prefect
  base job template the pool's worker uses, rendered with Prefect's own templating),
  created with the official client; the launcher polls its status with backoff, streams
  the pod's log, and on failure raises `StageFailed` with the pod's reason (OOMKilled,
  ImagePullBackOff, exit code ...). The Job is always deleted (propagation Background, so
  its pods go too) unless `keep_job`; its TTL covers a launcher that dies first.

Every mode returns a `StageResult` on success and raises `StageFailed` (carrying the
result) otherwise, so a Prefect task that calls `run_stage` fails the same way wherever
the stage ran. `kubernetes` and `prefect` are imported only when a Job is built.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from components.launch.config import REQUIRE_ENV_REMOTE, LauncherConfig, stage_environment

LogSink = Callable[[str], None]

# Waiting reasons after which a pod never starts by itself: fail now instead of at the
# deadline. ErrImagePull is left out: it is also what a brief registry hiccup looks like,
# and it turns into ImagePullBackOff when it persists.
FATAL_WAITING = {
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
}
MANAGED_BY = "agentrl-launcher"


@dataclass
class StageResult:
    stage: str
    mode: str
    returncode: int
    seconds: float
    log_tail: list[str] = field(default_factory=list)
    job_name: str = ""  # kubernetes mode only
    pool: str = ""  # kubernetes mode only
    reason: str = ""  # why it failed ('' on success)


class StageFailed(RuntimeError):
    """A stage ended without success; `.result` has the return code, reason and log tail."""

    def __init__(self, message: str, result: StageResult):
        super().__init__(message)
        self.result = result


def stage_key(argv: Sequence[str]) -> str:
    """'group command' of an agentrl command line (the key of cli.COMMANDS)."""
    from components.cli import COMMANDS

    if not argv:
        raise ValueError("empty agentrl command line")
    group = argv[0]
    if (group, "") in COMMANDS or len(argv) < 2 or argv[1].startswith("-"):
        return group
    return f"{group} {argv[1]}"


def run_stage(
    stage_name: str, argv: Sequence[str], config: LauncherConfig, log: LogSink = print
) -> StageResult:
    """Run `agentrl ARGV` as stage `stage_name`; raise StageFailed unless it succeeds."""
    argv = list(argv)
    stage_key(argv)  # an empty command line fails here, in every mode
    if config.mode == "in-process":
        return _run_in_process(stage_name, argv, config)
    if config.mode == "subprocess":
        return _run_subprocess(stage_name, argv, config, log)
    return _run_kubernetes(stage_name, argv, config, log)


# ---------------------------------------------------------------------------------------
# in-process and subprocess


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fix_torch_threads(n: int) -> None:
    """torch's intra-op threads set to `n` in this process (0: left as they are)."""
    if n:
        import torch

        torch.set_num_threads(n)


def _run_in_process(stage: str, argv: list[str], config: LauncherConfig) -> StageResult:
    from components.cli import main
    from components.cli_args import CommandError

    started = time.perf_counter()
    result = StageResult(stage=stage, mode="in-process", returncode=0, seconds=0.0)
    fix_torch_threads(config.torch_threads)
    try:
        with _environ(stage_environment(config)):
            result.returncode = int(main(argv) or 0)
    except SystemExit as exc:  # argparse errors and commands that exit
        code = exc.code
        result.returncode = code if isinstance(code, int) else (0 if code is None else 1)
        result.reason = "" if result.returncode == 0 else str(code)
    except CommandError as exc:  # a refused argument or operation: its one line and status
        result.returncode, result.reason = exc.code, f"exit code {exc.code}: {exc}"
    except Exception as exc:
        result.seconds = time.perf_counter() - started
        result.returncode, result.reason = 1, repr(exc)
        raise StageFailed(f"stage {stage!r} raised {exc!r}", result) from exc
    result.seconds = time.perf_counter() - started
    if result.returncode != 0:
        result.reason = result.reason or f"exit code {result.returncode}"
        raise StageFailed(f"stage {stage!r} failed: {result.reason}", result)
    return result


def _run_subprocess(stage: str, argv: list[str], config: LauncherConfig, log: LogSink):
    started = time.perf_counter()
    tail: deque[str] = deque(maxlen=config.log_tail_lines)
    process = subprocess.Popen(
        [sys.executable, "-m", "components.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **stage_environment(config)},
        cwd=config.cwd or None,
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        process.kill()

    timer = threading.Timer(config.timeout_s, kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip("\n"))
            log(f"[{stage}] {tail[-1]}")
        returncode = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:  # interrupted (e.g. Prefect cancelled the task)
            process.kill()
            process.wait()
    result = StageResult(
        stage=stage, mode="subprocess", returncode=returncode,
        seconds=time.perf_counter() - started, log_tail=list(tail),
    )  # fmt: skip
    if timed_out.is_set():
        result.reason = f"timed out after {config.timeout_s:g} s"
    elif returncode != 0:
        result.reason = f"exit code {returncode}"
    if result.reason:
        raise StageFailed(_message(stage, result.reason, result.log_tail), result)
    return result


def _message(stage: str, reason: str, tail: list[str], where: str = "") -> str:
    last = "\n".join(tail[-10:])
    return f"stage {stage!r}{where} failed: {reason}" + (
        f"\n--- last output ---\n{last}" if last else ""
    )


# ---------------------------------------------------------------------------------------
# kubernetes: build the Job


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return "-".join(p for p in out.split("-") if p) or "stage"


def job_name_for(stage_name: str) -> str:
    """agentrl-<stage>-<5 hex>: unique per launch, and <= 63 characters, since Kubernetes
    copies it into the pods' `job-name` label."""
    return f"agentrl-{_slug(stage_name)[:48]}-{uuid.uuid4().hex[:5]}"


def load_pool_template(config: LauncherConfig, pool: str) -> dict:
    return json.loads(config.template_path(pool).read_text())


def render_pool_template(template: dict, values: dict) -> dict:
    """The Job manifest of a Prefect Kubernetes base job template, rendered as the worker
    does: variable defaults, overridden by `values`, through Prefect's `apply_values`
    (a placeholder without a value is removed; one whose value is None stays None)."""
    from prefect.utilities.templating import apply_values

    variables = {
        name: spec["default"]
        for name, spec in template["variables"]["properties"].items()
        if "default" in spec
    }
    variables.update(values)
    manifest = copy.deepcopy(template["job_configuration"]["job_manifest"])
    return apply_values(manifest, variables, remove_notset=True)


def build_job(
    stage_name: str, argv: Sequence[str], config: LauncherConfig, job_name: str = ""
) -> dict:
    """The batch/v1 Job that runs `agentrl ARGV` for `stage_name` (a plain dict)."""
    key = stage_key(argv)
    pool = config.pool_for(key)
    name = job_name or job_name_for(stage_name)
    labels = {
        **config.labels,
        "app.kubernetes.io/part-of": "agentrl",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "agentrl/stage": _slug(stage_name)[:63],
        "agentrl/pool": pool,
    }
    if config.run_id:
        labels["agentrl/run-id"] = _slug(config.run_id)[:63]
    job = render_pool_template(
        load_pool_template(config, pool),
        {
            "name": name,
            "namespace": config.namespace,
            "image": config.image,
            "image_pull_policy": config.image_pull_policy,
            "service_account_name": config.service_account,
            "backoff_limit": 0,  # retries belong to Prefect's task, not to a half-run stage
            "finished_job_ttl": config.ttl_after_finished_s,
            "labels": labels,
            "annotations": {"agentrl/command": " ".join(["agentrl", *argv])},
            "command": None,  # set below as a list; the worker's string form is shlex-split
            "env": None,
        },
    )
    meta = job["metadata"]
    meta.pop("generateName", None)  # an explicit name: we follow and delete this very Job
    meta["name"] = name
    if config.owner_pod:
        owner_name, owner_uid = config.owner_pod.split(":")
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner_name, "uid": owner_uid}
        ]
    spec = job["spec"]
    spec["activeDeadlineSeconds"] = int(config.timeout_s)
    pod_template = spec["template"]
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = {**pod_meta.get("labels", {}), **labels}
    pod = pod_template["spec"]
    # Prefect's worker insists on these two keys in the *pod* spec (its manifest check);
    # Kubernetes has no such fields there and strict field validation rejects them.
    pod.pop("parallelism", None)
    pod.pop("completions", None)
    container = pod["containers"][0]
    container.pop("args", None)
    container["command"] = ["agentrl", *argv]
    if config.cwd:  # relative paths in argv then mean the files the caller means
        container["workingDir"] = config.cwd
    resources = config.resources_for(key)
    container["resources"] = {"requests": dict(resources), "limits": dict(resources)}
    extra = stage_environment(config)
    env = [e for e in container.get("env") or [] if e["name"] not in extra]
    env += [{"name": k, "value": v} for k, v in sorted(extra.items())]
    env.append({"name": "AGENTRL_STAGE", "value": stage_name})
    if key in config.env_server_stages and pool != "sandbox":  # agent actions: the server's
        env.append({"name": REQUIRE_ENV_REMOTE, "value": "1"})
    container["env"] = env
    return job


def job_summary(job: dict) -> dict:
    """The facts of a Job that a pipeline test compares (see `expected_jobs_for`)."""
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    return {
        "stage": job["metadata"]["labels"]["agentrl/stage"],
        "pool": job["metadata"]["labels"]["agentrl/pool"],
        "namespace": job["metadata"]["namespace"],
        "image": container["image"],
        "command": container["command"],
        "working_dir": container.get("workingDir", ""),
        "limits": container["resources"]["limits"],
        "gpu": "nvidia.com/gpu" in container["resources"]["limits"],
        "service_account": pod.get("serviceAccountName", ""),
    }


def expected_jobs_for(
    stages: Sequence[tuple[str, Sequence[str]]], config: LauncherConfig
) -> list[dict]:
    """`job_summary` of the Job each (stage_name, argv) would be launched as, in order.

    A retrain flow run with `launcher: kubernetes` against a fake API server should have
    created exactly these: `[job_summary(j) for j in created] == expected_jobs_for(...)`.
    """
    return [job_summary(build_job(name, argv, config, job_name="x")) for name, argv in stages]


# ---------------------------------------------------------------------------------------
# kubernetes: run the Job


def kube_api_client(config: LauncherConfig):
    """An ApiClient of its own (the kubernetes package's global configuration is untouched)."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    if config.api_url:
        configuration.host = config.api_url.rstrip("/")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)
    else:
        kube_config.load_kube_config(
            context=config.kube_context or None, client_configuration=configuration
        )
    return client.ApiClient(configuration)


def _pods_of(core, namespace: str, job_name: str) -> list:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
    # Filtered again here: the selector is the server's job, this costs nothing, and a
    # test server that ignores selectors stays honest.
    return [p for p in pods if (p.metadata.labels or {}).get("job-name") == job_name]


def _condition(job, kind: str):
    for cond in (job.status and job.status.conditions) or []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def _container_states(pod) -> Iterator[tuple[str, object]]:
    status = pod.status
    for cs in [*((status and status.init_container_statuses) or []),
               *((status and status.container_statuses) or [])]:  # fmt: skip
        yield cs.name, cs.state


def pod_failure_reason(pod) -> str:
    """'pod P: container C terminated: OOMKilled (exit code 137)' and the like."""
    parts = []
    for name, state in _container_states(pod):
        if state is None:
            continue
        if state.terminated is not None and state.terminated.exit_code != 0:
            t = state.terminated
            text = f"container {name} terminated: {t.reason or 'Error'} (exit code {t.exit_code})"
            parts.append(text + (f": {t.message.strip()}" if t.message else ""))
        elif state.waiting is not None and state.waiting.reason:
            w = state.waiting
            parts.append(
                f"container {name} waiting: {w.reason}" + (f": {w.message}" if w.message else "")
            )
    status = pod.status
    if status is not None and status.reason:  # Evicted, DeadlineExceeded, ...
        parts.append(f"{status.reason}" + (f": {status.message}" if status.message else ""))
    return f"pod {pod.metadata.name}: " + "; ".join(parts) if parts else ""


def _fatal_waiting(pods: list) -> str:
    for pod in pods:
        for _, state in _container_states(pod):
            waiting = state.waiting if state is not None else None
            if waiting is not None and waiting.reason in FATAL_WAITING:
                return pod_failure_reason(pod)
    return ""


def _unschedulable(pods: list) -> str:
    for pod in pods:
        for cond in (pod.status and pod.status.conditions) or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                return f"pod {pod.metadata.name} unschedulable: {cond.message or cond.reason}"
    return ""


def _started(pod) -> bool:
    return any(
        state is not None and (state.running is not None or state.terminated is not None)
        for _, state in _container_states(pod)
    )


def _stream_logs(core, namespace: str, pod_name: str, stage: str, tail: deque, log: LogSink):
    """Follow the pod's log until the container ends; never fails the stage."""
    try:
        response = core.read_namespaced_pod_log(
            pod_name, namespace, follow=True, _preload_content=False
        )
        buffer = ""
        for chunk in response.stream(4096):
            buffer += chunk.decode("utf-8", errors="replace")
            *lines, buffer = buffer.split("\n")
            for line in lines:
                tail.append(line)
                log(f"[{stage}] {line}")
        if buffer:
            tail.append(buffer)
            log(f"[{stage}] {buffer}")
        response.release_conn()
    except Exception as exc:  # a log we cannot read is a missing log, not a failed stage
        log(f"[{stage}] (log stream of {pod_name} ended: {exc!r})")


def _run_kubernetes(stage: str, argv: list[str], config: LauncherConfig, log: LogSink):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    job = build_job(stage, argv, config)
    name, namespace = job["metadata"]["name"], config.namespace
    result = StageResult(stage=stage, mode="kubernetes", returncode=-1, seconds=0.0,
                         job_name=name, pool=job["metadata"]["labels"]["agentrl/pool"])  # fmt: skip
    tail: deque[str] = deque(maxlen=config.log_tail_lines)
    api = kube_api_client(config)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    started = time.perf_counter()
    log_thread: threading.Thread | None = None
    try:
        batch.create_namespaced_job(namespace, job)
        log(f"[{stage}] created Job {namespace}/{name} (pool {result.pool}, image {config.image})")
        delay, pending_since = config.poll_initial_s, time.monotonic()
        while True:
            current = batch.read_namespaced_job(name, namespace)
            pods = _pods_of(core, namespace, name)
            if log_thread is None:
                running = [p for p in pods if _started(p)]
                if running:
                    log_thread = threading.Thread(
                        target=_stream_logs,
                        args=(core, namespace, running[0].metadata.name, stage, tail, log),
                        daemon=True,
                    )
                    log_thread.start()
            if _condition(current, "Complete") is not None:
                result.returncode = 0
                break
            failed = _condition(current, "Failed")
            if failed is not None:
                why = [pod_failure_reason(p) for p in pods]
                result.reason = "; ".join(
                    [f"Job {failed.reason or 'Failed'}" + (f": {failed.message}" if failed.message else ""),
                     *[w for w in why if w]]
                )  # fmt: skip
                break
            fatal = _fatal_waiting(pods)
            if fatal:
                result.reason = fatal
                break
            if log_thread is None:  # still pending: how long may it wait?
                blocked = _unschedulable(pods)
                if time.monotonic() - pending_since > config.pending_timeout_s:
                    result.reason = blocked or (
                        f"no pod started within {config.pending_timeout_s:.0f} s"
                    )
                    break
            if time.perf_counter() - started > config.timeout_s:
                result.reason = f"timed out after {config.timeout_s:g} s"
                break
            time.sleep(delay)
            delay = min(delay * 1.5, config.poll_max_s)
        if log_thread is not None:
            log_thread.join(timeout=30.0)  # the log ends with the container
    finally:
        result.seconds = time.perf_counter() - started
        result.log_tail = list(tail)
        if not config.keep_job:
            try:
                batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
                log(f"[{stage}] deleted Job {namespace}/{name}")
            except ApiException as exc:
                if exc.status != 404:
                    log(f"[{stage}] could not delete Job {namespace}/{name}: {exc.reason}")
        api.close()
    if result.returncode != 0:
        result.returncode = 1 if result.returncode == -1 else result.returncode
        where = f" (Job {namespace}/{name})"
        raise StageFailed(_message(stage, result.reason, result.log_tail, where), result)
    return result
