"""components/workdir_lock.py (issue 45, item 2): one lock per workdir and per data
repository. A second writer in another process is refused at once with the holder's PID,
start time and command (exit 2); a lock whose holder died is taken over, and that is said;
the run that holds a lock (its own process, the processes it started) passes; a writer
inside a held folder, or of a folder around a held one, is refused; `agentrl data snapshot`
and `agentrl reproduce` are refused while a pipeline runs on the same folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components.workdir_lock import (
    TOKEN_ENV,
    WorkdirInUse,
    acquire,
    lock_file,
    release,
    workdir_lock,
)
from tests.tiny_pipeline import tiny_preset

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from components.workdir_lock import workdir_lock
with workdir_lock(sys.argv[1], "holder of " + sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""


def _env(token: str | None = None) -> dict:
    """The environment of a process of another run (no token) or of this one (`token`)."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, TOKEN_ENV: token} if token else env


def _holder(folder: Path, seconds: float = 120, token: str | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=_env(token), cwd=ROOT)  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture(autouse=True)
def own_token(monkeypatch):
    """This test process is a run of its own (a token no holder started here has)."""
    monkeypatch.setenv(TOKEN_ENV, f"test-{os.getpid()}")


def test_a_second_process_is_refused_with_who_holds_it_then_gets_it(tmp_path, capsys):
    work = tmp_path / "work"
    proc = _holder(work, seconds=3)
    try:
        with pytest.raises(WorkdirInUse) as refused:
            acquire(work)
        message = str(refused.value)
        assert f"is in use by PID {proc.pid}, started at " in message
        assert f"(holder of {work})" in message and refused.value.code == 2
        assert "\n" not in message
    finally:
        assert proc.stdout.readline().strip() == "released"
        proc.wait(timeout=30)
    with workdir_lock(work):  # released cleanly: taken without a word
        record = json.loads(lock_file(work).read_text())
        assert record["pid"] == os.getpid() and record["token"] == f"test-{os.getpid()}"
    assert "took over" not in capsys.readouterr().err
    assert not lock_file(work).exists()  # the record goes with the lock, nothing left beside


def test_the_lock_of_a_dead_holder_is_taken_over_and_that_is_said(tmp_path, capsys):
    work = tmp_path / "work"
    proc = _holder(work)
    proc.kill()  # SIGKILL: the kernel drops its flock, its record stays
    proc.wait(timeout=30)
    assert json.loads(lock_file(work).read_text())["pid"] == proc.pid
    with workdir_lock(work, "the next run"):
        assert json.loads(lock_file(work).read_text())["command"] == "the next run"
    err = capsys.readouterr().err
    assert f"took over the lock on {work.resolve()} from PID {proc.pid}" in err
    assert "is gone" in err and len(err.strip().splitlines()) == 1


def test_the_run_holding_a_lock_passes_in_process_and_in_the_processes_it_starts(tmp_path):
    work = tmp_path / "work"
    acquire(work)
    try:
        acquire(work)  # a stage the flow runs in-process
        release(work)
        # a stage run as a subprocess carries the run's token
        child = _holder(work, seconds=0, token=os.environ[TOKEN_ENV])
        assert child.stdout.readline().strip() == "released"
        child.wait(timeout=30)
        # ... and a process of another run does not pass
        other = subprocess.run([sys.executable, "-c", HOLDER, str(work), "0"], env=_env(),
                               cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert other.returncode != 0 and f"is in use by PID {os.getpid()}" in other.stderr
    finally:
        release(work)
    assert not lock_file(work).exists()


def test_a_folder_inside_or_around_a_held_one_is_refused(tmp_path):
    work = tmp_path / "work"
    proc = _holder(work)
    try:
        with pytest.raises(WorkdirInUse, match=f"{work / 'tasks'}: {work} is in use by PID"):
            acquire(work / "tasks")  # `tasks generate --out WORK/tasks` beside the pipeline
    finally:
        proc.kill()
        proc.wait(timeout=30)
    work.mkdir(exist_ok=True)
    proc = _holder(work / "tasks")  # a standalone writer started first ...
    try:
        with pytest.raises(WorkdirInUse, match=f"{work}: {work / 'tasks'} is in use by PID"):
            acquire(work)  # ... refuses the pipeline on its workdir
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_data_snapshot_is_refused_while_a_run_holds_the_data_repository(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    proc = _holder(tmp_path / "data")
    try:
        result = subprocess.run([sys.executable, "-m", "components.cli", "data", "snapshot",
                                 "--repo-root", str(tmp_path)], env=_env(), cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("agentrl data snapshot: ") and f"in use by PID {proc.pid}" in line
    assert not (tmp_path / ".dvc").exists() and not (tmp_path / "data.dvc").exists()


def _start_pipeline(folder: Path) -> subprocess.Popen:
    """`python -m flows.retrain` on the tiny preset in `folder`, once it holds its locks."""
    preset = tiny_preset({"mode": "in-process"})
    (folder / "tiny.yaml").write_text(yaml.safe_dump(preset))
    (folder / "runs" / "pipeline").mkdir(parents=True)
    (folder / "runs" / "pipeline" / "live.txt").write_text("the running flow's")
    env = {**_env(), "PREFECT_HOME": str(folder / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "flows.retrain", "--preset", "tiny.yaml"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    lock = lock_file(folder / "runs" / "pipeline")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if lock.is_file() and lock.read_text() and json.loads(lock.read_text())["pid"] == proc.pid:
            return proc
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the pipeline never held its workdir: {proc.communicate()[1][-2000:]}")


def test_reproduce_during_a_running_pipeline_is_refused_before_it_touches_anything(
    tmp_path, monkeypatch
):
    from flows.reproduce import reproduce_locked

    proc = _start_pipeline(tmp_path)
    monkeypatch.chdir(tmp_path)
    tags = {"preset": "tiny.yaml", "data_version": "0" * 32, "git_commit": "abc",
            "pipeline_run_id": "r1"}  # fmt: skip
    try:
        with pytest.raises(WorkdirInUse) as refused:
            reproduce_locked("3", tags)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    message = str(refused.value)
    assert f"in use by PID {proc.pid}" in message and "python -m flows.retrain" in message
    assert "--preset tiny.yaml" in message
    # the running flow's folder was neither moved aside nor rolled back
    assert (tmp_path / "runs" / "pipeline" / "live.txt").read_text() == "the running flow's"
    assert not [p for p in (tmp_path / "runs").iterdir() if "reproduce" in p.name]
    assert not (tmp_path / "data.dvc").exists()


def test_tasks_generate_and_data_ingest_into_a_held_folder_are_refused(tmp_path):
    """The command-line writers of a task folder and a dataset take its lock too."""
    from components.data.__main__ import main_ingest
    from components.tasks.__main__ import main_generate

    suite, dataset = tmp_path / "suite", tmp_path / "ingested"
    src = tmp_path / "records.jsonl"
    src.write_text("")
    for folder, run in (
        (suite, lambda: main_generate(["--out", str(suite), "--n", "2"])),
        (dataset, lambda: main_ingest([str(src), "--out", str(dataset)])),
    ):
        proc = _holder(folder, seconds=3)
        try:
            with pytest.raises(WorkdirInUse, match=f"is in use by PID {proc.pid}"):
                run()
            assert not folder.exists() or not any(folder.iterdir())  # nothing written
        finally:
            assert proc.stdout.readline().strip() == "released"
            proc.wait(timeout=30)


def test_a_full_disk_names_the_lock_file_and_leaves_no_lock_held(tmp_path):
    """45 (D's finding): the holder record on a full disk was a bare [Errno 28]."""
    from components.output_files import DiskFull

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("no tmpfs can be mounted here (needs root)")
    try:
        (disk / "work").mkdir()
        with (disk / "fill").open("wb", buffering=0) as f:  # fill it to the last byte
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        full = pytest.raises(DiskFull, match=r"agentrl-runlock: no space left on device")
        with full, workdir_lock(disk / "work", "test"):
            pass
        (disk / "fill").unlink()
        with workdir_lock(disk / "work", "test"):  # nothing was left held
            pass
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
