"""`agentrl serve` as the tests run it: the real command line on a free loopback port.

Shared by the serve, policy-sync and served-GRPO tests (tests/train imports it too).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    checkpoint: Path, *flags: str, name: str = "policy", host: str = "127.0.0.1", port: int = 0,
    runtime_updates: bool = True,
):  # fmt: skip
    """Yield the base URL (…/v1) of `python -m components.serve` on `checkpoint` (runtime
    updates on unless asked); stopped (and waited for) on exit."""
    import httpx

    port = port or free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.serve", "--model", str(checkpoint), "--port",
         str(port), "--host", host, "--threads", "1", "--name", name,
         *(["--allow-runtime-updates"] if runtime_updates else []), *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stdout.read()}")
            try:
                if httpx.get(f"http://{host}:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in 90 s")
            time.sleep(0.3)
        yield f"http://{host}:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
