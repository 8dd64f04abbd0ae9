"""Ctrl-C and SIGTERM of the model-driven long commands (issue 45, deliverable 3 and its
acceptance): `agentrl train sft|rs|dpo` on a tiny policy with an MLflow store (its trainer
run open), `agentrl evaluate run` of that policy on a generated suite (its sandboxes mounted)
and `agentrl serve` of it with a request being answered. Each is stopped by SIGINT or
SIGTERM to its process group once it is well into its work: exit 130 / 143 within a few
seconds, one line, no `agentrl-*` mount, no process of its group, no temporary folder, no
RUNNING MLflow run (the trainer's run is there, KILLED). `tasks check`, `tasks mine` and
`env eval` are tests/test_signals_commands.py's; the helpers are tests/test_signals.py's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.test_signals import (
    SIGNALS,
    agentrl_mounts,
    assert_nothing_left,
    start,
    stop,
    unmount_below,
)

AGENTRL = [sys.executable, "-m", "components.cli"]
# one thread each: the command and the test's polling share a busy 2-core machine
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A tiny saved policy (policy/), expert records (records.jsonl), those and failed
    episodes of the same tasks (samples.jsonl) and a generated suite (suite/)."""
    import torch

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy
    from components.tasks.generate import generate_suite
    from tests.train.conftest import EXPERT_RECORDS, FAILED_RECORDS

    w = tmp_path_factory.mktemp("signals_stages")
    torch.set_num_threads(1)
    config = PolicyConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=512,
        tokenizer_stdlib_bytes=20_000,
        max_position_embeddings=1024,
    )
    save_policy(*build_policy(config, records=EXPERT_RECORDS), w / "policy")
    (w / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EXPERT_RECORDS))
    pairs = EXPERT_RECORDS + FAILED_RECORDS  # verified successes and failures of each task
    (w / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    generate_suite(w / "suite", 40, seed=7)
    return w


def wait_for(condition, what: str, proc, budget_s: float = 300) -> None:
    deadline = time.monotonic() + budget_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            unmount_below(Path(proc.stdout_log).parent)
            log = Path(proc.stdout_log).read_text(errors="replace")
            pytest.fail(f"no {what} within {budget_s}s:\n{log[-3000:]}")
        time.sleep(0.2)


def stopped_cleanly(proc, tmp_path: Path, how, command: str) -> None:
    """Stop `proc` with `how` and check what the module promises."""
    try:
        took, rest = stop(proc, how)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            unmount_below(tmp_path)
    print(f"agentrl {command}, {how.name}: exit {proc.returncode} after {took:.1f}s")
    assert proc.returncode == 128 + how, rest[-3000:]
    # ~1-3 s on a quiet machine; up to 10 s niced beside a running suite
    assert took < 12, f"{took:.1f}s: {rest[-3000:]}"
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == f"agentrl {command}: {name}", rest[-3000:]
    assert "Traceback" not in rest
    assert_nothing_left(proc, tmp_path)


def _runs(db: Path) -> list[tuple[str, str]]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return [
        (r.info.run_name, r.info.status)
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
    ]


# The training stages: their preset (training far longer than the test waits, logging to
# the test's store), the input option and file, the name of their trainer's MLflow run.
TRAINERS = {
    "sft": ("sft", "--records", "records.jsonl", "sft"),
    "rs": ("rejection_sampling", "--samples", "samples.jsonl", "sft"),
    "dpo": ("dpo", "--samples", "samples.jsonl", "dpo"),
}


def _trainer_preset(stage: str, db: Path) -> dict:
    settings = {
        "max_steps": 100_000,
        "batch_size": 2,
        "max_seq_len": 768,
        "use_cpu": True,
        "mlflow_tracking_uri": f"sqlite:///{db}",
    }
    section = TRAINERS[stage][0]
    return {section: {"sft": settings}} if section == "rejection_sampling" else {section: settings}


@pytest.mark.integration  # a tiny policy, torch and MLflow imported: a minute on a busy machine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", list(TRAINERS))
@SIGNALS
def test_a_trainer_stopped_mid_training_kills_its_run_and_leaves_its_folder_resumable(
    world, tmp_path, stage, how
):
    section, option, inputs, run_name = TRAINERS[stage]
    out = tmp_path / stage
    db = tmp_path / "mlruns" / "mlflow.db"  # the store `start` names (the trainer's own here)
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(_trainer_preset(stage, db)))
    argv = [
        *AGENTRL,
        "train",
        stage,
        "--preset",
        str(tmp_path / "preset.yaml"),
        "--policy",
        str(world / "policy"),
        option,
        str(world / inputs),
        "--out",
        str(out),
    ]
    proc = start(argv, tmp_path, **ONE_THREAD)

    def training() -> bool:  # its trainer run is open and has logged a loss
        return _logged(
            db,
            "SELECT 1 FROM runs r JOIN metrics m ON m.run_uuid = r.run_uuid "
            "WHERE r.status = 'RUNNING' AND m.key = 'loss' LIMIT 1",
        )

    wait_for(training, "logged training step", proc)
    time.sleep(1.0)  # a few steps more
    assert proc.poll() is None, "it ended before it was stopped"
    stopped_cleanly(proc, tmp_path, how, f"train {stage}")
    assert _runs(db) == [(run_name, "KILLED")]
    # what it leaves is its own folder (the manifest from its start): a rerun resumes it
    assert not out.exists() or (out / ".agentrl-outputs.json").is_file()
    assert not (out / "result.json").exists()


def _logged(db: Path, query: str) -> bool:
    """Whether `query` finds a row in the SQLite store `db`, read-only: a client of the
    test's own would create the tables as the command does, and one of them would fail."""
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as con:
            return con.execute(query).fetchone() is not None
    except sqlite3.Error:  # not there yet, its tables being made, or busy
        return False


@pytest.mark.integration  # a model's episodes in sandboxes on a busy machine: a minute each
@pytest.mark.timeout(900)
@SIGNALS
def test_evaluate_run_of_a_model_stopped_in_its_sandboxes_leaves_nothing(world, tmp_path, how):
    argv = [
        *AGENTRL,
        "evaluate",
        "run",
        "--tasks",
        str(world / "suite"),
        "--model",
        str(world / "policy"),
        "--out",
        str(tmp_path / "eval"),
    ]
    proc = start(argv, tmp_path, **ONE_THREAD)
    tmp = tmp_path / "tmp"

    def in_a_sandbox() -> bool:
        return any(p.name.startswith(("agentrl-ws-", "agentrl-verify-")) for p in tmp.iterdir())

    wait_for(in_a_sandbox, "sandbox", proc)
    time.sleep(1.0)  # a few more start
    assert proc.poll() is None, "it ended before it was stopped"
    assert agentrl_mounts(tmp_path) or os.geteuid() != 0  # mounted where we may
    stopped_cleanly(proc, tmp_path, how, "evaluate run")
    assert not (tmp_path / "eval" / "report.md").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration  # the policy loaded behind uvicorn on a busy machine: ~30 s each
@pytest.mark.timeout(600)
@SIGNALS
def test_serve_stopped_while_answering_exits_at_once_and_frees_its_port(world, tmp_path, how):
    import httpx

    port = _free_port()
    argv = [
        *AGENTRL,
        "serve",
        "--model",
        str(world / "policy"),
        "--port",
        str(port),
        "--threads",
        "1",
    ]
    proc = start(argv, tmp_path, ready="agentrl serve: policy on http", budget_s=300, **ONE_THREAD)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{url}/health"), "health answer", proc, budget_s=120)
    answered: list[object] = []

    def ask() -> None:  # long generations in flight when the signal comes (batched)
        body = {"prompt": "def f(x):", "max_tokens": 1000, "temperature": 1.0, "seed": 1}
        try:
            answered.append(httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code)
        except httpx.HTTPError as e:
            answered.append(type(e).__name__)

    asking = [threading.Thread(target=ask, daemon=True) for _ in range(8)]
    for thread in asking:
        thread.start()
    time.sleep(1.0)
    assert proc.poll() is None and not answered, f"answered before the stop: {answered}"
    stopped_cleanly(proc, tmp_path, how, "serve")
    for thread in asking:
        thread.join(30)
    # each client is told at once (the connection closes), none waits for its generation
    assert len(answered) == 8 and 200 not in answered, answered
    with socket.socket() as s:  # the port is free again (for a server: SO_REUSEADDR)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
