"""The environment server as the tests run it: `python -m components.env_service` (the real
command line) on a free loopback port, waited for on /readyz, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    tasks_dir: Path,
    *,
    port: int | None = None,
    workers: int = 2,
    request_timeout_s: float = 120.0,
    log: Path | None = None,
    tmp_dir: Path | None = None,
):
    """The server process and its URL, ready (every worker up)."""
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "components.env_service",
        "--tasks",
        str(tasks_dir),
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--request-timeout-s",
        str(request_timeout_s),
    ]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the process owns it
    env = dict(os.environ)
    if tmp_dir is not None:  # where its workers' workspaces go: a test looks for leftovers
        tmp_dir.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp_dir)
    proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"env server exited {proc.returncode}"
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("env server not ready within 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def served(tasks_dir: Path, **kwargs):
    proc, url = start_server(tasks_dir, **kwargs)
    try:
        yield url, proc
    finally:
        stop_server(proc)


def metrics(url: str) -> dict:
    return httpx.get(url + "/metrics", timeout=5).json()


def live_children(pid: int) -> list[int]:
    """Processes below `pid` still running (zombies aside)."""
    from components.runtime import descendants

    out = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            with open(f"/proc/{child}/cmdline", "rb") as f:
                tracker = b"resource_tracker" in f.read()
            if not zombie and not tracker:
                out.append(child)
        except OSError:
            pass
    return out


def workspaces_under(root: str) -> list[str]:
    return [
        os.path.join(d, n)
        for d, dirs, _ in os.walk(root)
        for n in dirs
        if n.startswith("agentrl-ws-")
    ]
