"""`agentrl env serve`: the coding environment as an HTTP service (FastAPI + uvicorn, the
stack of `agentrl serve`), so agent code never runs beside the trainer.

Endpoints (bodies in components/env_service/protocol.py):
    POST /sessions                     create an episode from a task id + env settings
    POST /sessions/{id}/step           one action -> the events it appended, done, ...
    POST /sessions/{id}/finish         the verdict, reward and reward breakdown (server-side)
    DELETE /sessions/{id}              drop an episode, free its workspace
    GET /healthz                       the process answers
    GET /readyz                        every worker is up (503 otherwise)
    GET /metrics                       sessions, steps/s, queue depth, verdict time, restarts

What it protects: the trainer's process never runs an agent's tool, command or verifier;
the task suite (hidden tests, reference fixes) is read on the server's side and a client
names tasks by id; the verdict and reward are computed here and the record signed here
(components/verifier/provenance.py: a trainer accepts it when both share the verdict key,
AGENTRL_STATE_DIR). What it does not: anyone who can reach the port can run episodes (bind
loopback, or a NetworkPolicy admitting only the pipeline's pods, infra/base/env-service.yaml);
the workers run as the server's user, with each command in the sandbox as in-process.
Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from components.env_service.pool import WorkerPool
from components.env_service.protocol import CreateRequest, FinishRequest, StepRequest
from components.env_service.worker import SessionError
from components.typed_config import doc


@dataclass(frozen=True)
class EnvServiceConfig:
    """How the environment server runs (its sandbox limits are the preset's `sandbox`)."""

    workers: int = field(default=2, metadata=doc("worker processes running episodes", ge=1))
    max_queue: int = field(
        default=64, metadata=doc("requests that may wait for a worker; more get 503", ge=1)
    )
    request_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "longest one request (a step, a verdict) may take; past it the worker is "
            "replaced and the request answers 504, an infra failure",
            gt=0,
        ),
    )

    def __post_init__(self) -> None:
        if self.workers < 1 or self.max_queue < 1 or not self.request_timeout_s > 0:
            raise ValueError(
                "EnvServiceConfig: workers >= 1, max_queue >= 1, request_timeout_s > 0"
            )


def create_app(pool: WorkerPool):
    """The FastAPI app over a started `pool`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="agentrl env serve")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)

    @app.exception_handler(SessionError)
    def session_error(_request: Request, exc: SessionError):
        return error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    def bad_body(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz():
        if not pool.ready():
            return error(503, "a worker is down")
        return {"status": "ready", "workers": len(pool.workers), "tasks": pool.tasks}

    @app.get("/metrics")
    def metrics():
        return pool.snapshot()

    @app.post("/sessions")
    def create(body: CreateRequest):
        return pool.create(body.model_dump())

    @app.post("/sessions/{session_id}/step")
    def step(session_id: str, body: StepRequest):
        return pool.request(session_id, "step", body.model_dump())

    @app.post("/sessions/{session_id}/finish")
    def finish(session_id: str, body: FinishRequest):
        return pool.request(session_id, "finish", body.model_dump())

    @app.delete("/sessions/{session_id}")
    def close(session_id: str):
        return pool.request(session_id, "close", {})

    return app


def serve(
    tasks_dir: str | Path,
    sandbox_values: dict,
    config: EnvServiceConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
) -> None:
    """Start the workers, serve until interrupted, stop the workers and remove their
    folders (Ctrl-C or SIGTERM too: components/shutdown.py unmounts and removes the
    server's folder, which the handler's exit would skip)."""
    import uvicorn

    from components import shutdown

    with shutdown.temporary_folder("agentrl-env-service-") as tmp_root:
        pool = WorkerPool(
            config.workers,
            tasks_dir,
            sandbox_values,
            tmp_root,
            config.request_timeout_s,
            config.max_queue,
        )
        try:
            uvicorn.run(
                create_app(pool),
                host=host,
                port=port,
                log_level="warning",
                limit_concurrency=config.max_queue + 2 * config.workers + 8,
            )
        finally:
            pool.close()
