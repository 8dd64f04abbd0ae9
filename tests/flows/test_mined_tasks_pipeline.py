"""Mined tasks mix into the pipeline's suite (issue 21, slow): `pipeline.mined_tasks` names
a folder of mined tasks; the retrain flow prepares their environments, imports and gates
them beside the generated ones, and the evaluation reports success by task source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.env.test_tool_sets_pipeline import tiny_preset_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mined_tasks_run_through_the_pipeline(pipeline_workdir, prefect_harness):
    workdir = pipeline_workdir
    from flows.retrain import retrain

    mined = workdir / "mined"
    subprocess.run(
        [sys.executable, "-m", "components.cli", "tasks", "mine", "--repo",
         str(ROOT / "tests" / "fixtures" / "mine_repo"), "--out", str(mined), "--max-tasks", "2",
         "--max-candidates", "6", "--split", "test"],
        check=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    ids = sorted(p.name for p in mined.iterdir() if (p / "task.json").is_file())
    assert len(ids) == 2
    preset = tiny_preset_of("cpu-freeform.yaml", "free_form")
    preset["pipeline"]["mined_tasks"] = str(mined)
    (workdir / "preset.yaml").write_text(yaml.safe_dump(preset))
    summary = retrain("preset.yaml")
    w = workdir / "runs" / "pipeline"
    gate = json.loads((w / "gate.json").read_text())
    assert set(ids) <= set(gate["passed"]), gate
    assert sorted(p.name for p in (w / "tasks" / "mined").iterdir() if p.is_dir()) == ids
    episodes = [json.loads(line) for line in (w / "eval" / "trajectories.jsonl").open()]
    sources = {e["metadata"]["task_source"] for e in episodes}
    assert "mined" in sources, sources
    assert summary["evaluation"]["episodes"] > 0
