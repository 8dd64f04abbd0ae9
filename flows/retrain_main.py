"""`python -m flows.retrain`: check everything the run is given, then start what it needs,
then run the flow (flows/retrain.py).

1. The arguments and the whole preset are validated before anything else (Prefect takes
   seconds to import): a bad preset is one line, exit 2, and nothing is started or written.
   So is what the preset names outside itself (`preflight` here: its
   checkpoints, the vLLM virtualenv, a GPU, cluster access): one line per missing thing.
   Then the run takes its workdir's and data repository's locks
   (components/workdir_lock.py): a run already using either is named, exit 2.
2. Prefect's API server is started here, as a local subprocess on a free port (the same
   server Prefect would start as its temporary one), waited for with the preset's
   `runtime.startup_timeout_s`, retried once, its URL printed and its output in
   `runs/prefect-server.log`; with PREFECT_API_URL set, that server is waited for instead.
   An MLflow server named by MLFLOW_TRACKING_URI (http) is waited for the same way.
   Flow-run links point at PREFECT_HISTORY_UI, where `prefect server start` serves the
   same history (PREFECT_HOME's database) after the run. `prefect_api` is that start, for
   every entry point that runs a flow (reproduce, flows.evaluate, flows.promote).
3. The run gets a private temporary folder (TMPDIR, for itself and every process it
   starts). Ctrl-C or SIGTERM, to the process or its group, ends the run at once
   (components/shutdown.py): its MLflow runs KILLED, every process it started stopped, the
   server too, its mounts and temporary folder removed, one line, exit 130 (143).
4. A preset with `env.remote: local` gets an environment server per task suite, started by
   the first episode, health-waited with the same budget and stopped when the run ends
   (components/env_service/local.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from components.cli_args import ArgumentParser, preset_file
from components.preset import DEFAULT_PRESET

PROG = "python -m flows.retrain"
SERVER_LOG = Path("runs/prefect-server.log")


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    p.add_argument("--wait-for-approval", action="store_true",
                   help="pause the flow for approval in the Prefect UI")  # fmt: skip
    p.add_argument("--launcher", default="", choices=["in-process", "subprocess", "kubernetes"],
                   help="where stages run (default: the preset's launcher.mode, "
                        "else in-process)")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def check(argv: list[str] | None):
    """(arguments, preset) once both are valid: nothing imported but the configs."""
    from components.launch.config import launcher_config_from_dict
    from components.preset import PresetError, load_preset, validate_preset
    from components.typed_config import ConfigError

    args = parser().parse_args(argv)
    preset = load_preset(args.preset)
    validate_preset(preset)
    settings = {**preset.raw("launcher"), **({"mode": args.launcher} if args.launcher else {})}
    try:
        launcher_config_from_dict(settings)
    except ConfigError as e:
        raise PresetError(f"{preset.path}:{e}") from None
    return args, preset


def preflight(preset, launcher_mode: str = "", gpu: bool | None = None) -> list[str]:
    """What the preset names outside itself that this machine lacks, one line each ([] when
    all is there), for a run to check before its first stage (before Prefect starts and
    anything is written): with stages on this machine, the checkpoints and the vLLM
    virtualenv it names and a GPU for a GPU dtype (`gpu`: None = look for an NVIDIA device);
    with stages on Kubernetes (their paths are on the cluster's volume), the kube config and
    the namespace."""
    from components.launch.config import launcher_config_from_dict
    from components.preset import DEFAULT_PRESET

    settings = {**preset.raw("launcher"), **({"mode": launcher_mode} if launcher_mode else {})}
    launcher = launcher_config_from_dict(settings)
    if launcher.mode == "kubernetes":
        return _cluster_problems(preset.path, launcher)
    problems = _missing_paths(preset) + _home_problems()
    policy = preset.section("policy")
    has_gpu = Path("/dev/nvidiactl").exists() if gpu is None else gpu
    if policy.dtype != "float32" and not has_gpu:
        problems.append(f"{preset.path}:policy.dtype: {policy.dtype} is for a GPU and this "
                        "machine has none (no NVIDIA device); a CPU preset such as "
                        f"{DEFAULT_PRESET} runs here")  # fmt: skip
    return problems


def _home_problems() -> list[str]:
    """HOME must be a writable folder: Prefect and MLflow keep their settings and history
    there (HOME=/dev/null gave "Prefect API server exited before it answered")."""
    home = Path(os.environ.get("HOME") or "~").expanduser()
    if home.is_dir() and os.access(home, os.W_OK | os.X_OK):
        return []
    why = "Prefect and MLflow keep their settings there; set HOME to one you can write"
    return [f"HOME ({home}) is not a writable folder: {why}"]


def _missing_paths(preset) -> list[str]:
    """The checkpoints, tokenizer and vLLM virtualenv the run would read, where missing."""
    policy, pipeline = preset.section("policy"), preset.section("pipeline")
    checkpoints = [("policy.pretrained_path", policy.pretrained_path,
                    " (`agentrl policy fetch NAME --out PATH` gets one)")]  # fmt: skip
    if "dpo" in pipeline.algorithms:
        checkpoints.append(("dpo.reference_path", preset.section("dpo").reference_path, ""))
    problems = []
    for key, value, hint in checkpoints:
        if value and not (Path(value) / "config.json").is_file():
            what = "not a checkpoint (no config.json)" if Path(value).is_dir() else "no such folder"
            problems.append(f"{preset.path}:{key}: {value}: {what}{hint}")
    if policy.tokenizer_path and not Path(policy.tokenizer_path).exists():
        problems.append(f"{preset.path}:policy.tokenizer_path: no such file or folder "
                        f"{policy.tokenizer_path}")  # fmt: skip
    samples_on_vllm = {"grpo", "ppo"} & set(pipeline.algorithms)
    if preset.section("rollout").server == "vllm" and samples_on_vllm:
        from components.serve.vllm_launcher import vllm_available

        if reason := vllm_available():
            problems.append(f"{preset.path}:rollout.server: {reason}")
    return problems


def _cluster_problems(at: str, launcher) -> list[str]:
    """The kube config the launcher would use, and its namespace, as a Job's start needs
    them (components/launch/launcher.py `kube_api_client`): [] when both answer."""
    if not launcher.api_url and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        configs = os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)
        if not any(Path(c).expanduser().is_file() for c in configs if c):
            return [f"{at}:launcher: mode kubernetes needs cluster access: no kube config "
                    f"({os.pathsep.join(configs)}), no launcher.api_url, not in a pod"]  # fmt: skip
    from components.launch.launcher import kube_api_client

    try:
        api = kube_api_client(launcher)
    except Exception as e:  # any unusable config (ConfigException, a bad file) is one line
        return [f"{at}:launcher: mode kubernetes: the kube config is unusable: "
                f"{' '.join(str(e).split())[:300]}"]  # fmt: skip
    return _namespace_problems(at, api, launcher.namespace)


def _namespace_problems(at: str, api, namespace: str) -> list[str]:
    from kubernetes import client

    try:
        client.CoreV1Api(api).read_namespace(namespace, _request_timeout=(5, 10))
    except client.ApiException as e:
        if e.status == 404:
            return [f"{at}:launcher.namespace: no namespace {namespace!r} on the cluster at "
                    f"{api.configuration.host}"]  # fmt: skip
        if e.status == 401:
            return [f"{at}:launcher: the cluster at {api.configuration.host} refused the kube "
                    "config's credentials (401)"]  # fmt: skip
        return []  # 403: allowed to run Jobs but not to read namespaces; the Job will tell
    except Exception as e:  # unreachable, refused, TLS: one line
        return [f"{at}:launcher: cannot reach the cluster at {api.configuration.host}: "
                f"{type(e).__name__}"]  # fmt: skip
    return []


def check_preflight(preset, launcher_mode: str = "") -> None:
    """Raise PreflightError (one line per missing thing, exit 2) unless `preflight` is []."""
    from components.cli_args import PreflightError

    if problems := preflight(preset, launcher_mode):
        raise PreflightError(problems)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(budget_s: float, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Prefect's API server (its temporary server's command: no UI) on a free port, healthy
    within `budget_s` (one retry): (process, API URL)."""
    import importlib.util

    from components.runtime import die_with_parent, http_probe, start_service

    site = Path(importlib.util.find_spec("prefect").origin).parent.parent
    ports: list[int] = []

    def argv() -> list[str]:
        ports.append(_free_port())
        return [sys.executable, "-m", "uvicorn", "--app-dir", str(site), "--factory",
                "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                str(ports[-1]), "--log-level", "error", "--lifespan", "on"]  # fmt: skip

    def probe() -> bool:
        return http_probe(f"http://127.0.0.1:{ports[-1]}/api/health")()

    # no telemetry unless asked for: offline it only puts tracebacks in the server's log
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", **os.environ, "PREFECT_UI_ENABLED": "0",
           "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}  # fmt: skip
    # its own session: a signal to the run's group leaves it up while the run records the
    # crash in it (components/shutdown.py stops it after); it dies with the run all the same
    proc = start_service(
        "Prefect API server",
        argv,
        probe,
        budget_s,
        log_path,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    return proc, f"http://127.0.0.1:{ports[-1]}/api"


def wait_for_external_services(budget_s: float) -> None:
    """A Prefect or MLflow server the environment names (not started here) must answer."""
    from components.runtime import http_probe, wait_until_healthy

    if url := os.environ.get("PREFECT_API_URL"):
        wait_until_healthy(f"Prefect API server {url}", http_probe(f"{url.rstrip('/')}/health"),
                           budget_s, "(not started by agentrl)")  # fmt: skip
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://")):
        wait_until_healthy(f"MLflow server {uri}", http_probe(f"{uri.rstrip('/')}/health"),
                           budget_s, "(not started by agentrl)")  # fmt: skip


class RunScope:
    """The run's private temporary folder (TMPDIR for itself and every process it starts);
    `close` stops what the run started and removes the folder. Ctrl-C or SIGTERM removes
    it too (components/shutdown.py, which the command's boundary installs): after every
    process is stopped, until it stays gone (worker threads still copy into it until the
    process exits; the stopping flag keeps them from starting anything new)."""

    def __init__(self) -> None:
        from components.shutdown import remove_on_stop

        self.tmp = tempfile.mkdtemp(prefix="agentrl-retrain-")
        self.on_stop = remove_on_stop(self.tmp)
        self.saved_tmp = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = tempfile.tempdir = self.tmp
        self.server: subprocess.Popen | None = None

    def close(self) -> bool:
        """Stop every process the run started and remove its temporary folder (True: gone)."""
        from components.runtime import stop_descendants, unmount_under
        from components.shutdown import forget

        stop_descendants(grace_s=2.0)
        self.server = None
        unmount_under(self.tmp)  # a workspace's tmpfs its sandbox did not get to unmount
        shutil.rmtree(self.tmp, ignore_errors=True)
        forget(self.on_stop)
        tempfile.tempdir = None
        if self.saved_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self.saved_tmp
        return not os.path.lexists(self.tmp)


# Where `prefect server start` serves the UI: flow-run links point there, not at the run's
# own server's random port, so they open later on the same history (PREFECT_HOME's database).
PREFECT_HISTORY_UI = "http://127.0.0.1:4200"


@contextlib.contextmanager
def prefect_api(budget_s: float) -> Iterator[str]:
    """Prefect's API for the flows this process runs, as every entry point that starts a
    flow gets it: the server PREFECT_API_URL names, waited for, else one started here
    (`start_prefect_server`, health-waited with `budget_s`, one retry) and stopped at the
    end, after Prefect's workers sent what they hold. An MLflow server MLFLOW_TRACKING_URI
    names is waited for too. Yields the API URL."""
    wait_for_external_services(budget_s)
    if url := named_prefect_api():
        yield url
        return
    from components.runtime import stop_process

    server, url = start_prefect_server(budget_s, SERVER_LOG)
    print(f"Prefect API server: {url} (log: {SERVER_LOG})", flush=True)
    print(
        f"Prefect history: {prefect_history()}; after the run, `.venv/bin/prefect server "
        f"start` serves it and its flow-run links at {PREFECT_HISTORY_UI}",
        flush=True,
    )
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    os.environ["PREFECT_API_URL"] = url
    os.environ.setdefault("PREFECT_UI_URL", PREFECT_HISTORY_UI)
    try:
        with _settings_if_imported(url, os.environ["PREFECT_UI_URL"]):
            yield url
    finally:
        drain_prefect_workers()
        stop_process(server)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def named_prefect_api() -> str:
    """The Prefect API this process is told to use ("" for none): PREFECT_API_URL, or once
    Prefect is imported its setting (a test harness sets it without the environment)."""
    if "prefect.settings" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        return PREFECT_API_URL.value() or ""
    return os.environ.get("PREFECT_API_URL", "")


def _settings_if_imported(api_url: str, ui_url: str):
    """Prefect reads its settings from the environment when it is imported: a module that
    imported it already (a flow defined at its top) gets the URLs as temporary settings."""
    if "prefect" not in sys.modules:
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_UI_URL: ui_url})


def prefect_history() -> str:
    """Where Prefect keeps the flow runs' history (its database, under PREFECT_HOME)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    return text.split(":///", 1)[1] if text.startswith("sqlite") else "the server's database"


def run(argv: list[str] | None) -> int:
    from components.cli import cpu_accelerator_default
    from components.workdir_lock import pipeline_locks

    cpu_accelerator_default()
    args, preset = check(argv)
    check_preflight(preset, args.launcher)  # what the preset names outside itself
    budget = preset.section("runtime").startup_timeout_s
    # the workdir and data/ are this run's until it ends: another run is refused at once
    with pipeline_locks(preset, " ".join([PROG, *(argv or [])])):
        return run_flow(args, preset, budget)


def run_flow(args: argparse.Namespace, preset, budget: float) -> int:
    """Prefect's server (unless one is named), the flow, its summary; the run's scope
    undone whatever happens. The flow runs in a thread of its own, so Ctrl-C and SIGTERM
    reach components/shutdown.py's handler, not Prefect's (components/shutdown.py)."""
    from components.env_service.local import local_env_servers
    from components.shutdown import in_worker_thread

    scope = RunScope()
    try:
        # env.remote: local -> a server per task suite, health-waited, stopped at the end
        with prefect_api(budget), local_env_servers(budget):
            from flows.retrain import print_summary, retrain

            summary = in_worker_thread(
                lambda: retrain(preset.path, args.wait_for_approval, args.launcher)
            )
        print_summary(summary)
        Path("runs").mkdir(exist_ok=True)
        Path("runs/last-retrain.json").write_text(json.dumps(summary, indent=2, default=str))
        return 0
    finally:
        scope.close()


def drain_prefect_workers(timeout_s: float = 5.0) -> None:
    """Send the logs and events Prefect still holds before the server this run started
    stops: its workers ship them in the background, and a batch sent after the server is
    gone prints '--- Error logging to API ---' as the run's last words."""
    if "prefect" not in sys.modules:  # the run ended before the flow was imported
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)


def main(argv: list[str] | None = None) -> int:
    from components.cli import boundary

    argv = list(sys.argv[1:] if argv is None else argv)
    return boundary(lambda: run(argv), PROG, debug="--debug" in argv)


if __name__ == "__main__":
    sys.exit(main())
