"""An in-memory Kubernetes API on loopback (kmock) plus a fake Job controller and kubelet.

kmock's KubernetesEmulator stores objects and serves list / get / create / patch / delete
over real HTTP, so the launcher talks to it through the official `kubernetes` client
exactly as it would to a cluster. It has no controllers, so `FakeCluster` plays the Job
controller and the kubelet: for every new Job it creates one pod and sets the outcome
that the test chose for that stage (by the Job's `agentrl/stage` label); when a Job is
deleted it deletes the Job's pods, like the garbage collector does for propagation
Background. It also serves each pod's log (`GET .../pods/NAME/log`).

With a `LocalKubelet`, the pod really runs: its container's command and environment
(`env`, `envFrom` of the ConfigMaps/Secrets the test provides) are executed on this
machine, with this venv standing in for the image, and the pod's status, exit code and
followed log are the process's own (see LocalKubelet).

What this does not emulate: label/field selectors (kmock ignores them; the launcher
filters again), watches' resourceVersions, admission (quota, RBAC, schema), scheduling.
Those are for a real cluster (docs/scale-out.md).

Usage (sync tests; the server runs on its own event loop in a thread):

    with FakeCluster({"grpo": "oom"}) as cluster:
        run_stage("grpo", [...], LauncherConfig(mode="kubernetes", api_url=cluster.url))
    cluster.created_jobs()  # the Job bodies as POSTed, in order
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import kmock

JOBS = "batch/v1/jobs"
PODS = "v1/pods"

# outcome -> (pod status, Job status); "pending-image" never finishes by itself.
OUTCOMES = {
    "succeed": (
        {"phase": "Succeeded", "containerStatuses": [
            {"name": "stage", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
        {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    ),
    "oom": (
        {"phase": "Failed", "containerStatuses": [
            {"name": "stage", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]},
        {"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                      "reason": "BackoffLimitExceeded",
                                      "message": "Job has reached the specified backoff limit"}]},
    ),
    "exit3": (
        {"phase": "Failed", "containerStatuses": [
            {"name": "stage", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 3, "reason": "Error",
                                      "message": "task errors: ['t1']"}}}]},
        {"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                      "reason": "BackoffLimitExceeded"}]},
    ),
    "pending-image": (
        {"phase": "Pending", "containerStatuses": [
            {"name": "stage", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"waiting": {"reason": "ImagePullBackOff",
                                   "message": 'Back-off pulling image "agentrl:missing"'}}}]},
        {"active": 1},
    ),
    "unschedulable": (
        {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]},
        {"active": 1},
    ),
}  # fmt: skip


ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile copies into /app (the image's source tree); infra/prefect is read by
# the launcher, configs/ by the stages.
IMAGE_PATHS = ("components", "flows", "configs", "infra/prefect")


def build_image(dest: Path) -> Path:
    """A copy of this checkout's source tree laid out like the image's /app. Stages that
    run from it resolve repository-relative defaults (e.g. the promotion audit log under
    `<root>/mlruns`) inside the copy, as they would inside the image, not in this checkout."""
    import compileall

    for rel in IMAGE_PATHS:
        shutil.copytree(ROOT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    # Compiled once here: with PYTHONDONTWRITEBYTECODE (the image's ENV) every stage would
    # otherwise compile the sources again.
    compileall.compile_dir(dest, quiet=1)
    return dest


JOB_FAILURES = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "DeadlineExceeded": "Job was active longer than specified deadline",
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Run:
    """One pod's container process, its output so far, and how it ended."""

    job: str
    namespace: str
    output: bytearray = field(default_factory=bytearray)
    process: subprocess.Popen | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None
    reason: str = ""


class LocalKubelet:
    """Runs a pod's single container as a local process: a tiny kubelet for tests.

    - the image: this venv's `bin/` first on PATH (so the command `agentrl ...` is the venv's
      entry point) and, with `image_root`, the source tree there first on PYTHONPATH;
    - the environment: what the Dockerfile sets, then the container's `envFrom` (from the
      `config_maps` / `secrets` given here; a missing one leaves the pod waiting with
      CreateContainerConfigError, as a real kubelet does), then its `env` (values only);
    - the working directory: the container's `workingDir`, else `workdir` (the image's
      WORKDIR); this machine's file system stands in for the shared volume;
    - `activeDeadlineSeconds` kills the process (Job Failed, DeadlineExceeded), and deleting
      the Job kills it too (the pod is garbage-collected);
    - the pod's own folders: each `secret` volume (its keys written as files with its
      `defaultMode`, from `secrets`; a missing one leaves the pod waiting in
      ContainerCreating, as a real kubelet's failed mount does) and each memory-backed
      `emptyDir` is a folder of this pod's, and every occurrence of its `mountPath` in a
      container's command, args and env values is replaced by that folder (a process
      cannot mount); the `initContainers` run first, in order, and one that fails fails
      the pod (Job Failed), as on a cluster.

    Not emulated: resources/limits, the security context, the other volumes and mounts
    (this machine's file system stands in for the shared volume and /tmp), the network
    policy. `runs` keeps every pod's process by pod name.
    """

    # The image's ENV (Dockerfile); HOME is this user's, so caches stay where they are.
    IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip

    def __init__(self, workdir: Path, image_root: Path | None = None,
                 config_maps: dict[str, dict[str, str]] | None = None,
                 secrets: dict[str, dict[str, str]] | None = None):  # fmt: skip
        self.workdir = Path(workdir)
        self.image_root = image_root
        self.sources = {"configMapRef": config_maps or {}, "secretRef": secrets or {}}
        self.runs: dict[str, _Run] = {}

    def environment(self, container: dict) -> tuple[dict[str, str], str]:
        """(environment, '' or why the container cannot be created)."""
        bin_dir = str(Path(sys.executable).parent)
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.defpath}", "HOME": os.environ.get("HOME", "/tmp"),
               **self.IMAGE_ENV}  # fmt: skip
        if self.image_root is not None:
            env["PYTHONPATH"] = str(self.image_root)
        for source in container.get("envFrom") or []:
            for kind, values in self.sources.items():
                if kind in source:
                    name = source[kind]["name"]
                    if name not in values and not source[kind].get("optional"):
                        what = "configmap" if kind == "configMapRef" else "secret"
                        return env, f'{what} "{name}" not found'
                    env.update(values.get(name, {}))
        for item in container.get("env") or []:
            if "valueFrom" in item:
                return env, f"env {item['name']}: valueFrom is not supported by LocalKubelet"
            env[item["name"]] = item.get("value", "")
        return env, ""

    def pod_folders(self, pod: dict, root: Path) -> tuple[dict[str, Path], str]:
        """(volume name -> this pod's folder, '' or why the volumes cannot be set up) for
        the volumes emulated here (class docstring), written under `root`."""
        folders: dict[str, Path] = {}
        for volume in pod.get("volumes") or []:
            name = volume["name"]
            if "secret" in volume:
                secret = volume["secret"]
                values = self.sources["secretRef"].get(secret["secretName"])
                if values is None and not secret.get("optional"):
                    return folders, (
                        f'MountVolume.SetUp failed for volume "{name}" : '
                        f'secret "{secret["secretName"]}" not found'
                    )
                folder = folders[name] = root / name
                folder.mkdir(parents=True)
                for key, value in (values or {}).items():
                    (folder / key).write_text(value)
                    (folder / key).chmod(secret.get("defaultMode", 0o644))
            elif (volume.get("emptyDir") or {}).get("medium") == "Memory":
                folders[name] = root / name
                folders[name].mkdir(parents=True)
        return folders, ""

    @staticmethod
    def mounted(container: dict, folders: dict[str, Path]) -> dict:
        """`container` with the mount paths of the emulated volumes replaced by their folders
        in its command, args and env values."""
        paths = {
            m["mountPath"].rstrip("/"): str(folders[m["name"]])
            for m in container.get("volumeMounts") or []
            if m["name"] in folders
        }
        if not paths:
            return container
        pattern = re.compile("|".join(re.escape(p) + r"(?=/|\s|$)" for p in paths))

        def local(text: str) -> str:
            return pattern.sub(lambda m: paths[m.group(0)], text)

        out = dict(container)
        for key in ("command", "args"):
            if out.get(key):
                out[key] = [local(a) for a in out[key]]
        out["env"] = [
            {**e, "value": local(e["value"])} if "value" in e else e for e in out.get("env") or []
        ]
        return out

    def init(self, pod: dict, folders: dict[str, Path]) -> tuple[str, int, str]:
        """Run the pod's init containers in order: ('', 0, '') or (the failed one's name,
        its exit code, its output's tail)."""
        for container in pod.get("initContainers") or []:
            container = self.mounted(container, folders)
            env, error = self.environment(container)
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            if error:
                return container["name"], 128, error
            done = subprocess.run(
                argv,
                cwd=container.get("workingDir") or self.workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                return container["name"], done.returncode, (done.stdout + done.stderr)[-500:]
        return "", 0, ""

    def start(self, api, job, pod_name: str) -> None:
        """Run the pod of `job` (a V1Job) in a thread, reporting to the API server of `api`."""
        run = _Run(job=job.metadata.name, namespace=job.metadata.namespace)
        self.runs[pod_name] = run
        args = (api.configuration, job, pod_name, run)
        threading.Thread(target=self._run, args=args, daemon=True).start()

    def stop(self, pod_name: str) -> None:
        """The pod is deleted: kill its process if it still runs."""
        run = self.runs.get(pod_name)
        if run is not None and run.process is not None and run.process.poll() is None:
            run.process.kill()

    def _run(self, configuration, job, pod_name: str, run: _Run) -> None:
        from kubernetes import client

        api = client.ApiClient(configuration)
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        pod = api.sanitize_for_serialization(job.spec.template.spec)
        root = Path(tempfile.mkdtemp(prefix=f"{pod_name}-"))  # the pod's own folders
        folders, mount_error = self.pod_folders(pod, root)
        container = self.mounted(pod["containers"][0], folders)

        def pod_status(phase: str, state: dict) -> None:
            status = {"phase": phase, "containerStatuses": [
                {"name": container["name"], "ready": phase == "Running", "restartCount": 0,
                 "image": container["image"], "imageID": "", "state": state}]}  # fmt: skip
            core.patch_namespaced_pod_status(pod_name, run.namespace, {"status": status})

        def job_status(reason: str) -> None:  # reason '' = Complete
            cond = {"type": "Failed" if reason else "Complete", "status": "True",
                    "lastTransitionTime": _now()}  # fmt: skip
            if reason:
                cond.update(reason=reason, message=JOB_FAILURES[reason])
            counts = {"failed": 1} if reason else {"succeeded": 1}
            body = {"status": {**counts, "conditions": [cond]}}
            batch.patch_namespaced_job_status(run.job, run.namespace, body)

        try:
            if mount_error:  # the pod stays in ContainerCreating (the launcher gives up on it)
                run.reason = mount_error
                return
            failed, code, output = self.init(pod, folders)
            if failed:
                run.returncode, run.reason = code, f"init container {failed}: {output}"
                status = {
                    "phase": "Failed",
                    "initContainerStatuses": [
                        {
                            "name": failed,
                            "ready": False,
                            "restartCount": 0,
                            "image": "x",
                            "imageID": "",
                            "state": {
                                "terminated": {
                                    "exitCode": code,
                                    "reason": "Error",
                                    "message": output,
                                }
                            },
                        }
                    ],
                }
                core.patch_namespaced_pod_status(pod_name, run.namespace, {"status": status})
                job_status("BackoffLimitExceeded")
                return
            env, error = self.environment(container)
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            executable = shutil.which(argv[0], path=env["PATH"]) if argv else None
            if error:  # the pod waits for the missing object (the launcher gives up on it)
                waiting = {"reason": "CreateContainerConfigError", "message": error}
                pod_status("Pending", {"waiting": waiting})
                run.reason = error
                return
            if executable is None:
                run.returncode, run.reason = 128, f"exec: {argv[:1]}: not found in $PATH"
                pod_status("Failed", {"terminated": {"exitCode": 128, "reason": "StartError",
                                                     "message": run.reason}})  # fmt: skip
                job_status("BackoffLimitExceeded")
                return
            run.process = subprocess.Popen(
                [executable, *argv[1:]], cwd=container.get("workingDir") or self.workdir, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            started = _now()
            pod_status("Running", {"running": {"startedAt": started}})
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                run.process.kill()

            deadline = job.spec.active_deadline_seconds
            timer = threading.Timer(deadline, expire) if deadline else None
            if timer is not None:
                timer.start()
            assert run.process.stdout is not None
            for chunk in iter(lambda: run.process.stdout.read1(65536), b""):
                run.output += chunk
            code = run.process.wait()
            if timer is not None:
                timer.cancel()
            run.returncode = code if code >= 0 else 128 - code  # a signal: 128 + its number
            terminated = {"exitCode": run.returncode, "startedAt": started, "finishedAt": _now(),
                          "reason": "Completed" if code == 0 else "Error"}  # fmt: skip
            pod_status("Succeeded" if code == 0 else "Failed", {"terminated": terminated})
            run.reason = "DeadlineExceeded" if expired.is_set() else ""
            job_status(run.reason or ("" if code == 0 else "BackoffLimitExceeded"))
        except Exception as exc:  # e.g. the Job was deleted meanwhile; kept for the test
            run.reason = run.reason or repr(exc)
        finally:
            run.finished.set()
            api.close()
            shutil.rmtree(root, ignore_errors=True)

    async def log(self, pod_name: str, follow: bool) -> AsyncIterator[bytes]:
        """The container's output; with `follow`, until the process ends (as the API does)."""
        run = self.runs[pod_name]
        sent = 0
        yield b""  # start the response now, even before the first line
        while True:
            done = run.finished.is_set()
            if len(run.output) > sent:
                chunk = bytes(run.output[sent:])
                sent += len(chunk)
                yield chunk
            if done or not follow:
                return
            await asyncio.sleep(0.1)


class FakeCluster:
    """kmock on 127.0.0.1 plus a polling fake Job controller; a context manager.

    `kubelet`: run every Job's pod with it (LocalKubelet) instead of the canned outcomes;
    `poll_s`: how often the controller looks for new and deleted Jobs."""

    def __init__(self, outcomes: dict[str, str] | None = None, default: str = "succeed",
                 kubelet: LocalKubelet | None = None, poll_s: float = 0.02):  # fmt: skip
        self.outcomes = outcomes or {}
        self.default = default
        self.kubelet = kubelet
        self.poll_s = poll_s  # the controller's period (it costs CPU the stages may need)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._server_thread = threading.Thread(target=self._serve, daemon=True)
        self._controller_thread = threading.Thread(target=self._control, daemon=True)
        self._done = threading.Event()
        self.emulator: kmock.KubernetesEmulator | None = None
        self.controller_error: BaseException | None = None

    # -- server ---------------------------------------------------------------------
    def _serve(self) -> None:
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources[JOBS] = {}
            emulator.resources[PODS] = {}
            emulator["get", kmock.resource(PODS), kmock.subresource("log")] << self._log
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def _log(self, request):
        if self.kubelet is not None and request.name in self.kubelet.runs:
            follow = request.params.get("follow", "") in ("true", "1")
            return self.kubelet.log(request.name, follow)
        return f"hello from {request.name}\nstep 1 loss 2.0\ndone\n".encode()

    # -- controller -----------------------------------------------------------------
    def _control(self) -> None:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        api = client.ApiClient(configuration)
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        seen: dict[tuple[str, str], str] = {}  # (namespace, job) -> pod name
        try:
            while not self._done.is_set():
                live = set()
                for job in batch.list_job_for_all_namespaces().items:
                    key = (job.metadata.namespace, job.metadata.name)
                    live.add(key)
                    if key in seen:
                        continue
                    stage = (job.metadata.labels or {}).get("agentrl/stage", "")
                    pod_status, job_status = OUTCOMES[self.outcomes.get(stage, self.default)]
                    if self.kubelet is not None:  # the kubelet reports the real outcome
                        pod_status = {"phase": "Pending", "containerStatuses": [
                            {"name": "stage", "ready": False, "restartCount": 0, "image": "x",
                             "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}  # fmt: skip
                        job_status = {"active": 1}
                    pod_name = f"{job.metadata.name}-x7k2p"
                    pod = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": pod_name, "namespace": key[0],
                                        "labels": {"job-name": job.metadata.name,
                                                   "batch.kubernetes.io/job-name": job.metadata.name}},
                           "spec": {"containers": [{"name": "stage", "image": "x"}]},
                           "status": pod_status}  # fmt: skip
                    core.create_namespaced_pod(key[0], pod)
                    batch.patch_namespaced_job_status(key[1], key[0], {"status": job_status})
                    seen[key] = pod_name
                    if self.kubelet is not None:
                        self.kubelet.start(api, job, pod_name)
                for key in [k for k in seen if k not in live]:  # Job deleted: GC its pod
                    pod_name = seen.pop(key)
                    if self.kubelet is not None:
                        self.kubelet.stop(pod_name)
                    core.delete_namespaced_pod(pod_name, key[0])
                time.sleep(self.poll_s)
        except BaseException as exc:  # surfaced by the test through controller_error
            self.controller_error = exc
        finally:
            api.close()

    # -- context manager ------------------------------------------------------------
    def __enter__(self) -> FakeCluster:
        self._server_thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("kmock did not start")
        self._controller_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.1 + self.poll_s)  # let the controller GC the last deleted Job's pod
        self._done.set()
        self._controller_thread.join(5)
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._server_thread.join(5)

    # -- assertions -----------------------------------------------------------------
    def _objects(self, resource: str) -> list:
        assert self.emulator is not None
        return [
            obj for (res, _, _), obj in list(self.emulator.objects.items())
            if f"{res.group}/{res.version}/{res.plural}".lstrip("/") == resource
        ]  # fmt: skip

    def created_jobs(self) -> list[dict]:
        """Every Job body POSTed, in order of creation (deleted ones included)."""
        assert self.emulator is not None
        return [r.data for r in self.emulator if r.method == "POST" and "/jobs" in str(r.url)]

    def live_jobs(self) -> list[str]:
        return [o.raw["metadata"]["name"] for o in self._objects(JOBS) if not o.deleted]

    def live_pods(self) -> list[str]:
        return [o.raw["metadata"]["name"] for o in self._objects(PODS) if not o.deleted]

    def deletions(self) -> list[str]:
        """The DELETE requests for Jobs, as 'name?query'."""
        assert self.emulator is not None
        return [
            str(r.url).rsplit("/", 1)[1] for r in self.emulator
            if r.method == "DELETE" and "/jobs/" in str(r.url)
        ]  # fmt: skip
