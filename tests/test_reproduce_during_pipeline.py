"""Issue 45, acceptance: `agentrl reproduce` during a running pipeline on the same workdir
is refused, and the pipeline finishes with the fingerprints it would have had alone
(finding 2: on 271619e the reproduction rolled data/ back and moved the running flow's
folder aside; the flow died at GRPO and the data version log got a duplicate entry).

The tiny preset runs twice in the same folder (paths are part of what stages record): once
alone, then again with a reproduction of the first run's registered version started while
it runs. The second is refused at once with the holder named, touches nothing, and the
pipeline ends rc 0 with the same fingerprints (data version, SFT weights, candidate
weights, evaluation outcomes) and the same data version log as the run alone.

Then a reproduction of that version is stopped by SIGTERM to its process group in its
rerun's gate (finding 3: it lingered ~5 min as an orphan): exit 143 at once, nothing of it
left, the original run's folder back in place."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components.workdir_lock import TOKEN_ENV, WorkdirInUse, lock_file
from tests.processes import default_sigint
from tests.tiny_pipeline import tiny_preset

ROOT = Path(__file__).resolve().parents[1]


def _pipeline(folder: Path) -> subprocess.Popen:
    """`python -m flows.retrain --preset tiny.yaml` in `folder`, a run of its own (no
    token of this test's), with its MLflow store and Prefect database inside `folder`."""
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "PREFECT_API_URL")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(folder / "prefect"),
               MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}")  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "flows.retrain", "--preset", "tiny.yaml"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def _holds_its_workdir(proc: subprocess.Popen, folder: Path, budget_s: float = 600) -> None:
    lock = lock_file(folder / "runs" / "pipeline")
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline and proc.poll() is None:
        text = lock.read_text() if lock.is_file() else ""
        if text and json.loads(text)["pid"] == proc.pid:
            return
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the pipeline never held its workdir: {proc.communicate()[1][-3000:]}")


def _finish(proc: subprocess.Popen, budget_s: float = 5400) -> None:
    try:
        _, err = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the pipeline did not finish in time")
    assert proc.returncode == 0, err[-4000:]


def _outcome(folder: Path) -> dict:
    """What the run left that a reproduction could have disturbed."""
    log = folder / "data-versions.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    return {
        "fingerprints": json.loads(
            (folder / "runs" / "pipeline" / "fingerprints.json").read_text()
        ),
        "data versions": [json.loads(line)["version"] for line in lines],  # (dates differ)
        "runs": sorted(p.name for p in (folder / "runs").iterdir()),
    }


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> dict:
    """The tiny pipeline run alone in `base/run`, then moved to `base/alone` (its registered
    version 1 in its own MLflow store there)."""
    base = tmp_path_factory.mktemp("reproduce")
    folder = base / "run"
    folder.mkdir()
    preset = tiny_preset({"mode": "in-process"})
    # room for Prefect's start beside a loaded machine's other work (the shipped budget on
    # a busy machine is tests/flows/test_entry_points_busy.py's)
    preset["runtime"] = {**preset.get("runtime", {}), "startup_timeout_s": 900}
    # the registry's audit log in the run's folder (relative: the working directory), not
    # the checkout's mlruns/, which both runs would share (the second's version 1 then
    # contradicts the first's entries and its promote-request fails)
    preset["promote"] = {**preset.get("promote", {}), "audit_path": "audit.jsonl"}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(preset))
    _finish(_pipeline(folder))
    outcome = _outcome(folder)
    assert set(outcome["fingerprints"]) == {"data_version", "sft_sha256", "weights_sha256",
                                            "eval_digest"}  # fmt: skip
    assert len(outcome["data versions"]) == 1
    folder.rename(base / "alone")
    return {"base": base, "outcome": outcome}


# Two tiny pipelines end to end, each with a fresh Prefect database: ~10 min each on a quiet
# 2-core machine; niced beside a learning benchmark and other suites (load 15-25) one did
# not finish in 50 min. Run with --basetemp on a shared machine: other pytest sessions
# delete all but the 3 newest basetemp folders, a running pipeline's among them.
@pytest.mark.slow
@pytest.mark.timeout(14400)
def test_reproduce_during_a_pipeline_is_refused_and_the_pipeline_ends_as_it_would_alone(
    alone, monkeypatch
):
    from flows.reproduce import lineage_of, reproduce_locked

    first, folder = alone["base"] / "alone", alone["base"] / "run"
    # The registered version of the run alone: what `agentrl reproduce 1` reads first.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{first / 'mlflow.db'}")
    monkeypatch.setenv(TOKEN_ENV, f"test-{os.getpid()}")  # a run of its own
    tags = lineage_of("1", str(first / "tiny.yaml"))
    assert tags["weights_sha256"] == alone["outcome"]["fingerprints"]["weights_sha256"]

    folder.mkdir()
    shutil.copy(first / "tiny.yaml", folder / "tiny.yaml")
    proc = _pipeline(folder)
    try:
        _holds_its_workdir(proc, folder)
        monkeypatch.chdir(folder)
        with pytest.raises(WorkdirInUse) as refused:
            reproduce_locked("1", tags)
        _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    message = str(refused.value)
    assert f"in use by PID {proc.pid}" in message and "python -m flows.retrain" in message
    assert _outcome(folder) == alone["outcome"]
    assert not [p for p in folder.rglob("*reproduce*")]


# `agentrl reproduce`'s long part (its data checkout, then the rerun of the flow) behind
# the command line's boundary, as `agentrl reproduce 1` runs it once its preconditions
# hold (those compare the checkout's git commit, which other work may move meanwhile).
REPRODUCE = """
import json, sys
from components.cli import boundary
from flows.reproduce import lineage_of, reproduce_locked

def work():
    print(json.dumps(reproduce_locked("1", lineage_of("1", "tiny.yaml"))))
    return 0

sys.exit(boundary(work, "agentrl reproduce"))
"""


@pytest.mark.slow  # the rerun's Prefect server and its first stages on a loaded machine
@pytest.mark.timeout(3600)
def test_sigterm_to_reproduce_in_its_rerun_stops_everything_and_puts_the_workdir_back(
    alone, tmp_path
):
    """Finding 3: SIGTERM to the group of `agentrl reproduce` left it an orphan for ~5 min;
    it ends at once, 143, one line, no process, mount or temporary folder, no RUNNING
    MLflow run, its workdir lock free, and the original run's folder back in place (the
    rerun's partial one in runs/reproduce-v1)."""
    from tests.test_signals import agentrl_mounts, group_alive, running_runs

    folder = alone["base"] / "alone"
    before = (folder / "runs" / "pipeline" / "fingerprints.json").read_text()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "PREFECT_API_URL")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect"), TMPDIR=str(tmp),
               MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}")  # fmt: skip
    log = tmp_path / "output.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", REPRODUCE], cwd=folder, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=default_sigint)  # fmt: skip
    try:
        deadline = time.monotonic() + 1800
        while "==> gate" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        time.sleep(3)  # the rerun's gate has its sandboxes running
        size = log.stat().st_size
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rest = log.read_text()[size:]
    assert proc.returncode == 143, rest
    print(f"stopped in {took:.1f} s")
    assert took < 12, f"{took:.1f}s: {rest}"  # ~2 s alone; up to 10 s beside a suite
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == "agentrl reproduce: terminated", rest
    time.sleep(0.5)
    assert group_alive(proc.pid) == []
    assert agentrl_mounts(tmp_path) == [] and list(tmp.iterdir()) == []
    assert running_runs(folder / "mlflow.db") == []
    assert (folder / "runs" / "pipeline" / "fingerprints.json").read_text() == before
    assert (folder / "runs" / "reproduce-v1").is_dir()
    assert not (folder / "runs" / "pipeline.before-reproduce-v1").exists()
    lock = lock_file(folder / "runs" / "pipeline")
    assert not lock.is_file() or not lock.read_text()  # free for the next run
