"""Services a run starts (Prefect's API server, `agentrl serve`, vLLM) or needs (an MLflow
server): each is waited for with one start-up budget, the preset's `runtime` section, so a
busy machine gets the time it needs and a dead service one line instead of a traceback.

    wait_until_healthy("agentrl serve", probe, budget_s=180, log_path="runs/serve.log")
    proc = start_service("agentrl serve", argv, http_probe(url + "/health"), 180, log)

A service that does not answer within its budget is started once more (one retry: a slow
first import, a port taken in between); the second failure raises ServiceStartError, whose
message names the service, the budget and the log file.

Also here: the processes a command leaves behind. `stop_descendants` ends every process
this one started (sandboxes, servers, DataLoader workers), for Ctrl-C and failures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.typed_config import doc


@dataclass(frozen=True)
class RuntimeConfig:
    """How long a run waits for the services it starts or uses."""

    startup_timeout_s: float = field(
        default=180.0,
        metadata=doc(
            "seconds each service (Prefect API server, agentrl serve, vLLM, an MLflow server) "
            "gets to answer its health check, per try; a busy 2-core machine needs minutes",
            gt=0,
        ),
    )


class ServiceStartError(RuntimeError):
    """A service did not become healthy within its budget (twice)."""


def wait_until_healthy(name: str, probe: Callable[[], bool], budget_s: float,
                       log_path: str | Path | None = None,
                       alive: Callable[[], bool] | None = None) -> float:  # fmt: skip
    """Poll `probe` (True: healthy; exceptions count as not yet) until it answers or
    `budget_s` seconds pass; the seconds it took. `alive` (False: the service's process
    died) ends the wait early. Raises ServiceStartError naming `name`, the budget and
    `log_path`."""
    start = time.monotonic()
    delay = 0.05
    while True:
        try:
            if probe():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - a probe that fails is a service not up yet
            pass
        waited = time.monotonic() - start
        if alive is not None and not alive():
            raise ServiceStartError(f"{name} exited before it answered its health check "
                                    f"(after {waited:.1f}s); log: {log_path or '-'}")  # fmt: skip
        if waited >= budget_s:
            raise ServiceStartError(
                f"{name} did not answer its health check within {budget_s:g}s "
                f"(runtime.startup_timeout_s); log: {log_path or '-'}"
            )
        time.sleep(min(delay, max(budget_s - waited, 0.0)))
        delay = min(delay * 2, 1.0)


def http_probe(url: str, timeout_s: float = 2.0) -> Callable[[], bool]:
    """A probe: GET `url` answers 200."""

    def probe() -> bool:
        import urllib.request

        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310
            return response.status == 200

    return probe


def start_service(name: str, argv: list[str], probe: Callable[[], bool], budget_s: float,
                  log_path: str | Path, retries: int = 1, **popen) -> subprocess.Popen:  # fmt: skip
    """Start `argv` (output appended to `log_path`) and wait until `probe` answers; a
    service that does not is stopped and started again `retries` times. `argv` may be a
    callable returning the argv per try (a fresh port)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        args = argv() if callable(argv) else argv
        with log_path.open("ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, **popen)
        try:
            wait_until_healthy(name, probe, budget_s, log_path,
                               alive=lambda p=proc: p.poll() is None)  # fmt: skip
            return proc
        except ServiceStartError as e:
            stop_process(proc)
            if attempt == retries:
                raise ServiceStartError(f"{e} (tried {retries + 1} times)") from None
        except BaseException:
            stop_process(proc)
            raise
    raise AssertionError("unreachable")


def stop_process(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below `pid` (default: this one), children first."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid or os.getpid()).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_descendants(grace_s: float = 2.0) -> None:
    """End every process this one started: SIGTERM, then SIGKILL for those left."""
    import psutil

    procs = []
    for pid in descendants():
        try:
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            procs.append(proc)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
