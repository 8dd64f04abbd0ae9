"""Ctrl-C and SIGTERM (issue 45, deliverable 3): a command behind the error boundary that
has mounted a sandbox workspace and a verifier's work area, started processes and opened
MLflow runs (a pipeline's parent with a RUNNING stage run, a trainer's `mlflow.start_run`
in a worker thread, as an in-process stage has it) is stopped by either signal, sent to
its process group as a terminal or `kill -- -PGID` sends it: within a few seconds, exit
130 / 143, one line, and afterwards no `agentrl-*` mount, no process of its group, no
temporary folder of its, no RUNNING MLflow run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import default_sigint

ROOT = Path(__file__).resolve().parents[1]

# The command: everything a long command makes, then it waits (as in a gate's sandboxes).
COMMAND = r"""
import sys, threading, time
from pathlib import Path
from components.cli import boundary

def work():
    import subprocess
    from components import shutdown, tracking
    from components.sandbox.workspace import Workspace
    from components.verifier.snapshot import work_area

    src = Path(sys.argv[1])
    ws = Workspace.create(src)                       # a tmpfs where we may mount
    area = work_area("agentrl-verify-")
    area.__enter__()
    subprocess.Popen(["sleep", "300"])              # a process it started
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                     stderr=subprocess.DEVNULL)     # (its own KeyboardInterrupt: not ours)
    if sys.argv[2] == "without-mlflow":
        print("READY", ws.root, flush=True)
        time.sleep(300)
    parent = tracking.start_pipeline_run("signal test", {}, {})
    shutdown.kill_run_on_stop(parent)
    client = tracking._mlflow().MlflowClient()
    experiment = client.get_run(parent).info.experiment_id
    client.create_run(experiment, run_name="stage", tags={"mlflow.parentRunId": parent})
    started = threading.Event()

    def trainer():                                  # an in-process stage's fluent run
        import mlflow
        mlflow.start_run(run_name="trainer")
        started.set()
        time.sleep(300)

    threading.Thread(target=trainer, daemon=True).start()
    started.wait(60)
    print("READY", ws.root, flush=True)
    time.sleep(300)

sys.exit(boundary(work, "agentrl test-command"))
"""


def agentrl_mounts(under: Path) -> list[str]:
    """Mount points below `under` named like agentrl's temporary folders (other commands
    on this machine have theirs elsewhere)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [
        p
        for p in points
        if os.path.basename(p).startswith("agentrl-") and p.startswith(f"{under}/")
    ]


def group_alive(pgid: int) -> list[int]:
    import psutil

    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def running_runs(tracking_db: Path) -> list[str]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tracking_db}")
    return [
        f"{r.info.run_name} {r.info.status}"
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.info.status == "RUNNING"
    ]


def start(argv: list[str], tmp_path: Path, ready: str = "", budget_s: float = 120, **env):
    """`argv` in a process group of its own (its pid is the group's id), with TMPDIR and
    the MLflow store in `tmp_path`, its output in `tmp_path/output.log`; returns once that
    output has a line containing `ready` (at once for "")."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    environ = {
        **os.environ,
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(ROOT),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}",
        **env,
    }
    log = tmp_path / "output.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=environ,
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
    proc.stdout_log = log
    deadline = time.monotonic() + budget_s
    while ready and ready not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            unmount_below(tmp_path)
            pytest.fail(f"the command did not get to its work:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)
    return proc


def unmount_below(folder: Path) -> None:
    """A command killed by the test (it failed) leaves its mounts: they go, not the run."""
    for point in sorted(agentrl_mounts(folder), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def stop(proc: subprocess.Popen, how: signal.Signals, within_s: float = 30.0) -> tuple[float, str]:
    """Send `how` to the process group; (seconds until it exited, what it wrote after the
    signal). A command that outlives `within_s` is killed (the test then fails on its
    status)."""
    log = Path(proc.stdout_log)
    before = log.stat().st_size
    t0 = time.monotonic()
    os.killpg(proc.pid, how)
    try:
        proc.wait(timeout=within_s)
        took = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        unmount_below(log.parent)
        took = float("inf")
    with log.open(errors="replace") as f:
        f.seek(before)
        return took, f.read()


def assert_nothing_left(proc: subprocess.Popen, tmp_path: Path) -> None:
    time.sleep(0.3)  # a killed child's exit is reaped by init
    assert group_alive(proc.pid) == []
    assert agentrl_mounts(tmp_path) == []
    assert list((tmp_path / "tmp").iterdir()) == []
    db = tmp_path / "mlruns" / "mlflow.db"
    if db.exists():
        assert running_runs(db) == []


SIGNALS = pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])


@pytest.mark.timeout(120)
@SIGNALS
def test_a_signal_to_the_group_unmounts_removes_and_stops_everything(tmp_path, how):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    proc = start([sys.executable, "-c", COMMAND, str(src), "without-mlflow"], tmp_path, "READY")
    assert agentrl_mounts(tmp_path) or os.geteuid() != 0  # the workspace is mounted where we may
    took, rest = stop(proc, how)
    assert proc.returncode == 128 + how, rest
    assert took < 12, f"{took:.1f}s: {rest}"  # ~1 s alone; more beside a running suite
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip() == f"agentrl test-command: {name}"
    assert_nothing_left(proc, tmp_path)


@pytest.mark.integration  # MLflow's import and store: most of a minute on a busy machine
@pytest.mark.timeout(600)
@SIGNALS
def test_a_signal_marks_every_mlflow_run_it_opened_killed(tmp_path, how):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    proc = start([sys.executable, "-c", COMMAND, str(src), "with-mlflow"], tmp_path, "READY", 500)
    assert agentrl_mounts(tmp_path) or os.geteuid() != 0  # the workspace is mounted where we may
    took, rest = stop(proc, how)
    assert proc.returncode == 128 + how, rest
    assert took < 12, f"{took:.1f}s: {rest}"  # ~1 s alone; more beside a running suite
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == f"agentrl test-command: {name}"
    assert "Traceback" not in rest
    assert_nothing_left(proc, tmp_path)
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert sorted(r.info.run_name for r in runs) == ["signal test", "stage", "trainer"]
    assert {r.info.status for r in runs} == {"KILLED"}


# A flow run in the main thread and in `in_worker_thread`, against the server every entry
# point starts (flows/retrain_main.py `prefect_api`): which SIGTERM handler each one sees.
FLOW_THREADS = r"""
import signal
from prefect import flow
from components import shutdown
from flows.retrain_main import prefect_api

@flow
def sigterm_handler_during_a_flow() -> str:
    return signal.getsignal(signal.SIGTERM).__qualname__

shutdown.install("agentrl test")
with prefect_api(600):
    print("main thread:", sigterm_handler_during_a_flow())
    print("worker thread:", shutdown.in_worker_thread(sigterm_handler_during_a_flow))
"""


@pytest.mark.integration  # Prefect's server from a fresh database: a minute on a busy machine
@pytest.mark.timeout(900)
def test_a_flow_in_a_worker_thread_leaves_sigterm_to_the_command(tmp_path):
    """Prefect's flow engine puts its own SIGTERM handler in place while a flow runs in the
    main thread (it would report the crash to its server first, then hand the signal on);
    a flow run by `in_worker_thread` leaves the command's handler in place."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", FLOW_THREADS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "main thread: _prefect_sigterm_handler" in out.stdout  # what the thread avoids
    assert "worker thread: _on_signal" in out.stdout
    assert f"Prefect history: {tmp_path / 'prefect' / 'prefect.db'}" in out.stdout


def test_an_error_in_the_worker_thread_is_the_callers():
    from components.shutdown import in_worker_thread

    assert in_worker_thread(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        in_worker_thread(lambda: 1 / 0)
