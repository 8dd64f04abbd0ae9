"""Each tool set runs the whole pipeline (`make run`'s flow) on a tiny preset (slow).

The retrain flow (generate, gate, expert, ingest, validate, snapshot, policy init, SFT,
GRPO, evaluate, safety, promote request) runs in-process on the shipped CPU preset of the
set, shrunk like tests/tiny_pipeline.py shrinks cpu-demo.yaml: configs/cpu-demo.yaml with
`fix_search`, configs/cpu-freeform.yaml with `free_form`. Then what each stage produced is
read back: the expert transcripts, the SFT sequences, the GRPO metrics and the evaluated
episodes contain that set's tools and reward terms and no other's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.env.rewards import reward_terms
from components.env.tool_sets import TOOL_SETS, TOOL_SPECS
from tests.tiny_pipeline import tiny_preset

ROOT = Path(__file__).resolve().parents[2]
CASES = [("cpu-demo.yaml", "fix_search"), ("cpu-freeform.yaml", "free_form")]


def tiny_preset_of(shipped: str, tool_set: str) -> dict:
    """The shipped preset with tiny_preset's budgets; its own expert, env and constraint."""
    preset = tiny_preset({"mode": "in-process"})
    own = yaml.safe_load((ROOT / "configs" / shipped).read_text())
    preset["name"] = f"tiny-{tool_set}"
    preset["pipeline"]["expert_policy"] = own["pipeline"]["expert_policy"]
    assert own["env"].get("tool_set", "free_form") == tool_set, shipped
    preset["env"] = dict(own["env"])
    preset["rollout"].pop("constrain_fix_ids", None)
    if "constrain_fix_ids" in own.get("rollout", {}):
        preset["rollout"]["constrain_fix_ids"] = own["rollout"]["constrain_fix_ids"]
    return preset


@pytest.fixture
def workdir(pipeline_workdir):
    return pipeline_workdir


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_transcripts(records: list[dict], tool_set: str) -> None:
    own = set(TOOL_SETS[tool_set].tools)
    assert records
    for r in records:
        assert r["trajectory"][0]["tool_set"] == tool_set
        actions = {e.get("action") for e in r["trajectory"] if e["role"] == "assistant"}
        assert actions - {None} <= own, actions
        if r.get("reward_terms"):
            assert list(r["reward_terms"]) == list(reward_terms(tool_set))


def _check_verifier_version(summary: dict) -> None:
    """The verifier that judged the run is a tag of its MLflow run, of the registered
    version (lineage) and, once approved, what `promote status` shows for the champion."""
    from components.promote.approval import approve, status
    from components.promote.registry import get_version
    from components.tracking import _mlflow
    from components.verifier.version import verifier_version

    run = _mlflow().MlflowClient().get_run(summary["run_id"])
    assert run.data.tags["verifier_version"] == verifier_version()
    version = summary["promotion"]["version"]
    assert get_version(version)["tags"]["verifier_version"] == verifier_version()
    if summary["promotion"]["challenger"]:
        approve(version, "tester", "verifier version check")
        assert status()["champion_verifier_version"] == verifier_version()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("shipped", "tool_set"), CASES, ids=[c[1] for c in CASES])
def test_the_pipeline_runs_with_the_tool_set(shipped, tool_set, workdir, prefect_harness):
    from transformers import AutoTokenizer

    from components.train.data import trajectory_tokens
    from flows.retrain import retrain

    (workdir / "preset.yaml").write_text(yaml.safe_dump(tiny_preset_of(shipped, tool_set)))
    summary = retrain("preset.yaml")
    assert summary["candidate"] and summary["evaluation"]["episodes"] > 0
    _check_verifier_version(summary)
    w = workdir / "runs" / "pipeline"
    expert = _records(w / "expert" / "expert.jsonl")
    _check_transcripts(expert, tool_set)
    _check_transcripts(_records(w / "eval" / "trajectories.jsonl"), tool_set)
    # What SFT trained on: the system prompt lists the set's tools, and only those.
    tokenizer = AutoTokenizer.from_pretrained(summary["candidate"])
    ids = trajectory_tokens(tokenizer, expert[0])["input_ids"]
    text = tokenizer.decode(ids)
    prompt = text[: text.index(expert[0]["trajectory"][0]["content"][:40])]
    for name in TOOL_SPECS:
        assert (f"{name}(" in prompt) == (name in TOOL_SETS[tool_set].tools), name
    (grpo_metrics,) = w.glob("grpo-*/metrics.jsonl")
    row = _records(grpo_metrics)[-1]
    logged = {k.removeprefix("reward/") for k in row if k.startswith("reward/")}
    assert logged == set(reward_terms(tool_set))
