"""An in-memory Kubernetes API on loopback (kmock) plus a fake Job controller.

kmock's KubernetesEmulator stores objects and serves list / get / create / patch / delete
over real HTTP, so the launcher talks to it through the official `kubernetes` client
exactly as it would to a cluster. It has no controllers, so `FakeCluster` plays the Job
controller and the kubelet: for every new Job it creates one pod and sets the outcome
that the test chose for that stage (by the Job's `agentrl/stage` label); when a Job is
deleted it deletes the Job's pods, like the garbage collector does for propagation
Background. It also serves each pod's log (`GET .../pods/NAME/log`).

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
import threading
import time

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


class FakeCluster:
    """kmock on 127.0.0.1 plus a polling fake Job controller; a context manager."""

    def __init__(self, outcomes: dict[str, str] | None = None, default: str = "succeed"):
        self.outcomes = outcomes or {}
        self.default = default
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
            emulator["get", kmock.resource(PODS), kmock.subresource("log")] << (
                lambda request: f"hello from {request.name}\nstep 1 loss 2.0\ndone\n".encode()
            )
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

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
                for key in [k for k in seen if k not in live]:  # Job deleted: GC its pod
                    core.delete_namespaced_pod(seen.pop(key), key[0])
                time.sleep(0.02)
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
        time.sleep(0.1)  # let the controller garbage-collect the last deleted Job's pod
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
