"""`env.remote: local`: an environment server started on this machine for the run that needs
it, the way `rollout.sampling: vllm` starts vLLM (components/serve/vllm_launcher.py).

A preset that says `env: {remote: local}` gets the service's shape (every tool, command and
verdict in `agentrl env serve`'s worker processes, none in the trainer's) without running a
server itself. The first episode of a task suite starts `python -m components.env_service`
on that suite's folder (the folder holding the task's folder: the server reads tasks by id
from its own side), on a free loopback port, with this process's sandbox settings, and
waits for `/readyz` within the start-up budget, retried once, its output appended to
runs/env-serve/<suite folder>.log. The budget is the preset's `runtime.startup_timeout_s`:
the flow sets it for its scope (`local_env_servers`); a stage run as its own process gets
the one of the preset whose `env: {remote: local}` it read (components/preset.py calls
`use_preset` when it builds that section), and RuntimeConfig's default only where neither
said one. Later episodes of that suite use the same server. It is stopped when the scope that started it ends
(`local_env_servers`, which `python -m flows.retrain` wraps its run in), when the process
exits (atexit), on Ctrl-C or SIGTERM (components/shutdown.py: every process a run started
is stopped), and it dies with the process on SIGKILL (PR_SET_PDEATHSIG).

On Kubernetes the server is a Deployment instead (infra/base/env-service.yaml) and
env.remote its URL; `local` there would put the workers in the trainer's pod, so a stage
pod that must not run agent actions (AGENTRL_REQUIRE_ENV_REMOTE) refuses it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

LOCAL = "local"
LOG_DIR = Path("runs/env-serve")


@dataclasses.dataclass
class _Server:
    tasks_dir: str
    url: str
    proc: object  # subprocess.Popen
    stop_key: int
    preset_dir: tempfile.TemporaryDirectory


class LocalServers:
    """The servers this process started, one per (task folder, sandbox settings)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.servers: dict[tuple[str, str], _Server] = {}
        self.budget_s: float | None = None  # a flow's scope (local_env_servers)
        self.preset_budget: tuple[float, str] | None = None  # (seconds, preset) of a stage
        self.workers = 2
        self.log_dir: str | Path = LOG_DIR  # each server's output: <suite folder name>.log

    def use_preset(self, startup_timeout_s: float, preset_path: str) -> None:
        """The start-up budget of the servers this process starts outside a flow's scope:
        the preset's `runtime.startup_timeout_s` (that preset names `env.remote: local`)."""
        self.preset_budget = (float(startup_timeout_s), str(preset_path))

    def budget(self) -> tuple[float, str]:
        """(seconds a server gets to answer /readyz per try, where that number is set)."""
        if self.budget_s is not None:
            return self.budget_s, "runtime.startup_timeout_s of the run's preset"
        if self.preset_budget is not None:
            seconds, preset = self.preset_budget
            return seconds, f"runtime.startup_timeout_s of {preset}"
        from components.runtime import RuntimeConfig

        return RuntimeConfig().startup_timeout_s, "RuntimeConfig's default startup_timeout_s"

    def url_for(self, tasks_dir: str | Path, sandbox_values: dict) -> str:
        """The URL of the server on `tasks_dir`, started (health-waited) when there is none."""
        key = (str(Path(tasks_dir).resolve()), json.dumps(sandbox_values, sort_keys=True))
        with self.lock:  # one start per suite, however many threads ask at once
            server = self.servers.get(key)
            if server is None or server.proc.poll() is not None:
                server = self._start(key[0], sandbox_values)
                self.servers[key] = server
            return server.url

    def _start(self, tasks_dir: str, sandbox_values: dict) -> _Server:
        from components import shutdown
        from components.runtime import (
            ServiceStartError,
            die_with_parent,
            http_probe,
            start_service,
        )

        budget, where = self.budget()
        preset_dir = tempfile.TemporaryDirectory(prefix="agentrl-env-local-")
        preset = Path(preset_dir.name) / "sandbox.yaml"  # JSON is YAML: the sandbox section
        preset.write_text(json.dumps({"name": "env-local", "sandbox": sandbox_values}))
        ports: list[int] = []

        def argv() -> list[str]:  # a fresh port per try
            ports.append(_free_port())
            port = str(ports[-1])
            return [
                sys.executable,
                "-m",
                "components.env_service",
                "--tasks",
                tasks_dir,
                "--preset",
                str(preset),
                "--port",
                port,
                "--workers",
                str(self.workers),
            ]

        def ready() -> bool:
            return http_probe(f"http://127.0.0.1:{ports[-1]}/readyz")()

        log = Path(self.log_dir) / f"{Path(tasks_dir).name}.log"
        name = f"agentrl env serve --tasks {tasks_dir}"
        try:
            # its own session (a Ctrl-C to the group reaches the run first, which stops it),
            # yet it dies with this process, even by SIGKILL
            proc = start_service(
                name, argv, ready, budget, log, start_new_session=True, preexec_fn=die_with_parent
            )
        except ServiceStartError as e:
            preset_dir.cleanup()
            raise ServiceStartError(f"{e}; the budget is the {where}") from None
        except BaseException:
            preset_dir.cleanup()
            raise
        url = f"http://127.0.0.1:{ports[-1]}"
        key = shutdown.on_stop(f"the environment server {url}", lambda: proc.terminate())
        return _Server(tasks_dir, url, proc, key, preset_dir)

    def stop_all(self) -> None:
        """Stop every server this process started (SIGTERM: each stops its workers)."""
        from components import shutdown
        from components.runtime import stop_process

        with self.lock:
            servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            stop_process(server.proc, grace_s=20.0)
            shutdown.forget(server.stop_key)
            server.preset_dir.cleanup()


SERVERS = LocalServers()
atexit.register(SERVERS.stop_all)


@contextlib.contextmanager
def local_env_servers(startup_timeout_s: float, workers: int = 2) -> Iterator[LocalServers]:
    """The scope of a run whose preset may say `env.remote: local`: servers started inside
    it wait `startup_timeout_s` for health and are stopped when it ends."""
    saved = SERVERS.budget_s, SERVERS.workers
    SERVERS.budget_s, SERVERS.workers = startup_timeout_s, workers
    try:
        yield SERVERS
    finally:
        SERVERS.stop_all()
        SERVERS.budget_s, SERVERS.workers = saved


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_url(env_remote: str, task, sandbox) -> str:
    """The server URL an episode of `task` uses: `env.remote` itself, or for `local` the
    server on the task's suite folder (started here when there is none)."""
    if env_remote != LOCAL:
        return env_remote
    from components.sandbox.config import SandboxConfig

    values = dataclasses.asdict(sandbox if sandbox is not None else SandboxConfig())
    return SERVERS.url_for(Path(task.root).parent, values)
