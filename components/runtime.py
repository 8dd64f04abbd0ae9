"""Services a run starts (Prefect's API server, `agentrl serve`, vLLM) or needs (an MLflow
server): each is waited for with one start-up budget, the preset's `runtime` section, so a
busy machine gets the time it needs and a dead service one line instead of a traceback.

    wait_until_healthy("agentrl serve", probe, budget_s=180, log_path="runs/serve.log")
    proc = start_service("agentrl serve", argv, http_probe(url + "/health"), 180, log)

A service that does not answer within its budget is started once more (one retry: a slow
first import, a port taken in between); the second failure raises ServiceStartError, whose
message names the service, the budget and the log file.

Also here: the processes a command leaves behind. `stop_descendants` ends every process
this one started (sandboxes, servers, DataLoader workers), for Ctrl-C and failures. And the
process-wide "stopping" flag: once Ctrl-C or SIGTERM has begun to end a run
(`begin_stopping`), worker threads still running must not start anything new, so the
sandbox and the verifier call `refuse_if_stopping` before they create a temporary folder or
start a process; `remove_until_gone` removes the run's temporary folder while in-flight work
may still write into it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
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


_STOPPING = threading.Event()


class RunStopping(KeyboardInterrupt):
    """Refused because the run is being stopped (Ctrl-C, SIGTERM): like KeyboardInterrupt,
    a worker's `except Exception` does not turn it into a result."""


def begin_stopping() -> None:
    """From now on this process starts no sandbox, verifier folder or sandboxed process."""
    _STOPPING.set()


def refuse_if_stopping(what: str) -> None:
    """Raise RunStopping once `begin_stopping` was called (`what`: what is not started)."""
    if _STOPPING.is_set():
        raise RunStopping(f"not starting {what}: the run is stopping")


def remove_until_gone(path: str | Path, settle_s: float = 0.25, budget_s: float = 3.0,
                      between: Callable[[], None] | None = None) -> bool:  # fmt: skip
    """Remove the folder `path` until it stays gone for `settle_s` (a thread in the middle
    of a copy recreates the folders it writes into; a removal racing a new entry leaves
    the folder), calling `between` (e.g. stop_descendants) before each try; at most
    `budget_s` seconds. True when it is gone."""
    deadline = time.monotonic() + budget_s
    while True:
        if between is not None:
            between()
        unmount_under(path)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            time.sleep(settle_s)
            if not os.path.lexists(path):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def unmount_under(path: str | Path) -> None:
    """Detach every mount at or below `path` (a sandbox workspace's tmpfs, which the
    sandbox unmounts itself unless the run was cut short): rmtree cannot remove a mount
    point. Nothing where mounts cannot be read or this process may not unmount."""
    import ctypes

    root = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            points = [line.split()[1] for line in f if len(line.split()) > 1]
    except OSError:
        return
    # /proc/self/mounts writes space, tab, newline and backslash as octal escapes
    points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), p) for p in points]
    below = sorted({p for p in points if p == root or p.startswith(root + os.sep)},
                   key=len, reverse=True)  # fmt: skip
    if not below:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    for point in below:
        libc.umount2(os.fsencode(point), 2)  # MNT_DETACH; a failure leaves it to rmtree


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


def die_with_parent() -> None:
    """preexec_fn for a service started in a session of its own (out of reach of a signal
    to the command's process group, so the command can still use it while it stops): the
    service gets SIGTERM when the process that started it dies, even by SIGKILL, which runs
    no `finally`."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


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


def kill_descendants(grace_s: float = 0.3) -> None:
    """SIGTERM to every process below this one, SIGKILL to the same `grace_s` later, without
    waiting for them to exit: for a signal's stop, which has seconds (psutil's wait_procs
    polls each process up to its timeout: 5 s for a handful of sandboxes on a loaded
    machine). They are gone within milliseconds of the SIGKILL; a zombie is init's."""
    pids = descendants()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig == signal.SIGTERM:
            time.sleep(grace_s)


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
