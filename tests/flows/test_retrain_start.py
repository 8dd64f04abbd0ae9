"""`python -m flows.retrain` (what `make run` runs after installing) on a busy machine, and
Ctrl-C during its task gate.

Every core is kept busy by a burner process; Prefect's server starts from a fresh database
(its migrations are the slow part) within the preset's `runtime.startup_timeout_s`, the
flow reaches the gate, and a Ctrl-C there (SIGINT to the whole process group, as a terminal
sends it) or a SIGTERM to the group ends the run within a few seconds (12 s allowed beside
a running suite): exit 130 / 143, one line, no process, no mount and no temporary folder
of the run left, every MLflow run of it KILLED.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.processes import default_sigint

ROOT = Path(__file__).resolve().parents[2]


def _burners() -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]  # fmt: skip


def _left_behind(marker: str) -> list[str]:
    """Processes whose command line or environment carries `marker` (the run's folder)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + " ".join(proc.environ().values())
        except psutil.Error:
            continue
        if marker in text and proc.pid != os.getpid():
            found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:120]}")
    return found


def _copy_if_there(src: str, dst: str) -> None:
    """copy2, except for a file that went while the tree was listed (the checkout is
    shared: another writer's temporary file renamed into place)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(src, dst)


def _unmount_below(folder: Path) -> None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1]
        if point.startswith(f"{folder}/"):
            subprocess.run(["umount", "-l", point], capture_output=True)


@pytest.mark.slow  # a fresh Prefect database and the first stages on a loaded machine: minutes
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_flow_starts_on_a_busy_machine_and_a_signal_in_the_gate_leaves_nothing(tmp_path, how):
    """SIGINT as a terminal's Ctrl-C sends it, SIGTERM as `kill -- -PGID` does: to the
    whole group, Prefect's server included. Prefect's own SIGTERM handler (which reported
    the crash to that dead server for minutes) never sees it: the flow runs in a thread."""
    repo = tmp_path / "checkout"  # the flow writes runs/ and mlruns/ where it runs
    shutil.copytree(ROOT, repo, copy_function=_copy_if_there, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "mlruns", "data", "__pycache__", "bench", ".dvc", ".dvc-remote",
        "models", "*.egg-info", "reports", ".*_cache", "*.tmp"))  # fmt: skip
    preset = yaml.safe_load((repo / "configs" / "cpu-demo.yaml").read_text())
    preset["tasks"] = {**preset.get("tasks", {}), "n_tasks": 24}
    # The signal is what this test checks: Prefect's start gets room beyond the shipped
    # budget, which a test run niced beside a loaded machine's other work can outlast
    # (the shipped budget on a busy machine is tests/flows/test_entry_points_busy.py's).
    preset["runtime"] = {**preset.get("runtime", {}), "startup_timeout_s": 900}
    (repo / "configs" / "busy.yaml").write_text(yaml.safe_dump(preset))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(repo), "PREFECT_HOME": str(tmp_path / "prefect"),
           "TMPDIR": str(tmp), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # the copy's own mlruns/
    burners = _burners()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flows.retrain", "--preset",
                                 "configs/busy.yaml"], cwd=repo, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=default_sigint)  # fmt: skip
        seen = []
        for line in proc.stdout:
            seen.append(line)
            print(line, end="", flush=True)  # shown if the test fails
            if "==> gate" in line:  # (the flow's prints carry Prefect's log prefix)
                break
        assert any(line.startswith("Prefect API server: http://127.0.0.1:") for line in seen)
        assert seen and "==> gate" in seen[-1], "".join(seen[-30:])
        time.sleep(3)  # the gate's sandboxes are running
        t0 = time.monotonic()
        os.killpg(proc.pid, how)
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        for burner in burners:
            burner.kill()
        if proc.poll() is None:  # a failed check: do not leave the run behind
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + how, rest
    print(f"stopped in {took:.1f} s")
    # ~2 s alone; up to 10 s beside a running suite (tests/test_signals.py's bound)
    assert took < 12, f"{took:.1f}s: {rest}"
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert "Traceback" not in rest and f"python -m flows.retrain: {name}" in rest
    assert any(line.startswith("Prefect history: ") for line in seen)
    time.sleep(0.5)
    assert _left_behind(str(tmp_path)) == []
    assert list(tmp.iterdir()) == []  # the run's private temporary folder is gone
    assert not [p for p in Path("/proc/self/mounts").read_text().split() if str(tmp) in p]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    # the pipeline's parent run KILLED, no run left RUNNING (a stage that ended before the
    # signal, such as generate, keeps its FINISHED)
    status = {r.info.run_name: r.info.status for r in runs}
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parents and all(r.info.status == "KILLED" for r in parents), status
    assert "RUNNING" not in status.values(), status


def test_ctrl_c_removes_the_run_folder_while_workers_still_create_sandboxes(
    tmp_path, monkeypatch, capfd
):
    """The signal handler's path (components/shutdown.py, os._exit stubbed) while a worker
    thread keeps creating sandbox workspaces and copying into them, as the gate's thread
    pool does: the run's folder is gone and stays gone, the worker's next sandbox is
    refused, and nothing is created in the user's TMPDIR instead."""
    import tempfile
    import threading

    from components import runtime, shutdown
    from components.sandbox.workspace import Workspace
    from flows.retrain_main import RunScope

    user_tmp = tmp_path / "user-tmp"
    user_tmp.mkdir()
    src = tmp_path / "repo"
    for i in range(40):
        (src / f"pkg{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"pkg{i % 4}" / f"m{i}.py").write_text("x = 1\n" * 50)
    monkeypatch.setenv("TMPDIR", str(user_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    # this process's stopping flag, fresh (the handler sets it; later tests need it clear)
    monkeypatch.setattr(runtime, "_STOPPING", threading.Event(), raising=False)

    class Exited(BaseException):
        pass

    def fake_exit(code):
        raise Exited(code)

    restore = shutdown.install("python -m flows.retrain")
    scope = RunScope()
    done, refused, started = threading.Event(), [], threading.Event()

    def worker():  # a gate worker: a sandbox, then a copy into it that is still going
        while not done.is_set():
            try:
                ws = Workspace.create(src)
                shutil.copytree(src, ws.root / "copy")
                started.set()
            except KeyboardInterrupt:  # RunStopping: refused, the run is stopping
                refused.append(True)
                return
            except OSError:
                continue

    thread = threading.Thread(target=worker, daemon=True)
    try:
        thread.start()
        assert started.wait(30)
        time.sleep(0.3)  # a few workspaces exist
        with monkeypatch.context() as patched, pytest.raises(Exited):
            patched.setattr(os, "_exit", fake_exit)
            shutdown._on_signal(signal.SIGINT, None)
        time.sleep(0.5)  # the worker, had it not been refused, would create more
        leftover = list(user_tmp.iterdir())
        done.set()
        thread.join(10)
    finally:
        done.set()
        restore()
        tempfile.tempdir = None
        _unmount_below(tmp_path)  # a failed check leaves no workspace's tmpfs behind
    err = capfd.readouterr().err
    assert err.endswith("python -m flows.retrain: interrupted\n")
    assert not os.path.lexists(scope.tmp)
    assert leftover == [], leftover  # the run's folder gone, nothing new beside it
    assert refused == [True] and not thread.is_alive()
