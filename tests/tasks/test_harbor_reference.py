"""The harbor tier (opt-in, `pytest -m harbor`; `make harbor` builds its venv): our Harbor
exports and ATIF trajectories read by harbor 0.26 itself, not by its models borrowed
onto 3.11 (tests/harbor_wheel.py). harbor needs Python >= 3.12, so it lives in
.venv-harbor (pyenv's 3.12) and runs there as a subprocess: its own task loader
(`harbor.models.task.task.Task`, which validates task.toml, the input trees, instruction.md
and the test script) loads every exported task, and its `Trajectory` model validates every
exported ATIF file. Harbor trials (`harbor run`) need docker and are not run here
(docs/tasks.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.rollout.__main__ import main_export
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.harbor_export import export_harbor_task
from components.tasks.task import load_task, load_tasks

REPO = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
pytestmark = [
    pytest.mark.harbor,
    pytest.mark.skipif(
        not (REPO / ".venv-harbor" / ".installed").is_file(),
        reason=".venv-harbor is absent: `make harbor` builds it (harbor 0.26 on Python 3.12)",
    ),
]

# Run by .venv-harbor's python: argv = [tasks folder, atif folder]; prints one JSON line.
CHECK = r"""
import json, sys
from importlib.metadata import version
from pathlib import Path

from harbor.models.task.task import Task
from harbor.models.trajectories import Trajectory

tasks_dir, atif_dir = map(Path, sys.argv[1:3])
out = {"harbor": version("harbor"), "python": sys.version.split()[0], "tasks": {},
       "trajectories": {}}
for folder in sorted(p for p in tasks_dir.iterdir() if p.is_dir()):
    task = Task(folder)
    out["tasks"][folder.name] = {
        "valid_dir": Task.is_valid_dir(folder),
        "name": task.name,
        "instruction": task.instruction,
        "agentrl_id": task.config.metadata.get("agentrl_id"),
        "solve": str(task.paths.discovered_solve_path.relative_to(folder)),
        "test": str(task.paths.discovered_test_path.relative_to(folder)),
        "checksum": len(task.checksum),
    }
for path in sorted(atif_dir.glob("*.json")):
    traj = Trajectory.model_validate_json(path.read_text())
    out["trajectories"][traj.session_id] = {
        "schema_version": traj.schema_version,
        "steps": len(traj.steps),
        "tool_calls": sum(len(s.tool_calls or []) for s in traj.steps),
    }
print(json.dumps(out))
"""


def test_harbor_itself_loads_our_exported_tasks_and_atif_trajectories(tmp_path):
    generate_suite(tmp_path / "generated", GenerateConfig(n_tasks=2, seed=3))
    tasks, errors = load_tasks(tmp_path / "generated")
    assert tasks and not errors
    tasks.append(load_task(REPO / "tests" / "fixtures" / "external_quixbugs" / "gcd"))
    for task in tasks:
        export_harbor_task(task, tmp_path / "harbor")
    fixture = REPO / "tests" / "fixtures" / "data" / "rollouts.jsonl"
    records = [json.loads(line) for line in fixture.read_text().splitlines() if line.strip()]
    assert main_export([str(fixture), "--format", "atif", "--out", str(tmp_path / "atif")]) == 0

    run = subprocess.run([str(HARBOR_PYTHON), "-c", CHECK, str(tmp_path / "harbor"),
                          str(tmp_path / "atif")], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["harbor"] == "0.26.0" and got["python"].startswith("3.12")
    assert sorted(got["tasks"]) == sorted(t.id for t in tasks)
    for task in tasks:
        loaded = got["tasks"][task.id]
        assert loaded["valid_dir"] is True and loaded["agentrl_id"] == task.id, loaded
        assert loaded["instruction"] == task.instruction
        assert (loaded["solve"], loaded["test"]) == ("solution/solve.sh", "tests/test.sh")
    assert sorted(got["trajectories"]) == sorted(r["id"] for r in records)
    for record in records:
        traj = got["trajectories"][record["id"]]
        assert traj["schema_version"] == "ATIF-v1.6"
        assert traj["tool_calls"] == sum(1 for e in record["trajectory"] if e.get("action"))
