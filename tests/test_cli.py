"""Smoke-run the entry points through the real `agentrl` command line, tiny budgets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = [sys.executable, "-m", "components.cli"]


def agentrl(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENTRL, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_help_lists_commands_and_starts_fast():
    out = agentrl("--help")
    assert out.returncode == 0
    for cmd in ("tasks generate", "tasks check", "env eval", "data ingest", "demo"):
        assert cmd in out.stdout
    # The CLI must not import heavy libraries just to start.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, components.cli; print(sorted(m for m in "
         "('torch', 'mlflow', 'great_expectations', 'trl', 'dvc') if m in sys.modules))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "[]"


def test_unknown_command_is_a_usage_error():
    out = agentrl("tasks", "frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr


def test_generate_check_eval_round_trip(tmp_path):
    tasks = tmp_path / "tasks"
    assert (
        agentrl("tasks", "generate", "--out", str(tasks), "--n", "4", "--seed", "3").returncode == 0
    )
    check = agentrl("tasks", "check", "--tasks", str(tasks), "--report", str(tmp_path / "g.json"))
    assert check.returncode == 0, check.stdout + check.stderr
    out = tmp_path / "res.json"
    traj = tmp_path / "traj.jsonl"
    ev = agentrl("env", "eval", "--tasks", str(tasks), "--policy", "oracle", "--limit", "2",
                 "--out", str(out), "--trajectories-out", str(traj), "--quiet")  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    assert "oracle" in ev.stdout and "100.0%" in ev.stdout
    results = json.loads(out.read_text())
    assert [r["success"] for r in results["results"]] == [True, True]
    records = [json.loads(line) for line in traj.read_text().splitlines()]
    assert all(r["reward"] == 1.0 and r["trajectory"][0]["role"] == "user" for r in records)


def test_external_benchmark_tasks_evaluate_without_code_changes(tmp_path):
    src = ROOT / "tests" / "fixtures" / "external_quixbugs"
    imported = tmp_path / "imported"
    imp = agentrl("tasks", "import", "--src", str(src), "--out", str(imported))
    assert imp.returncode == 0, imp.stdout + imp.stderr
    out = tmp_path / "qb.json"
    ev = agentrl("env", "eval", "--tasks", str(imported), "--policy", "noop", "--out", str(out),
                 "--quiet")  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["tasks"] == 6 and summary["success_rate"] == 0.0


@pytest.mark.integration
def test_demo_end_to_end(tmp_path):
    out = agentrl("demo", "--out", str(tmp_path / "demo"), "--n", "30")
    assert out.returncode == 0, out.stderr
    assert "oracle" in out.stdout and "noop" in out.stdout


def test_a_command_line_turns_prefect_telemetry_off_unless_asked(monkeypatch):
    """Offline, Prefect's telemetry heartbeat is a traceback in the run's log (and on a busy
    machine a "database is locked" one); a user's own setting wins."""
    from components.cli import cpu_accelerator_default

    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    cpu_accelerator_default()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    cpu_accelerator_default()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
