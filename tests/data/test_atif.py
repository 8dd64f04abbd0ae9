"""ATIF in and out (issue 33): our episodes written as ATIF-v1.6 validate against harbor's
own Trajectory model and read back losslessly; ATIF from another producer (several tool
calls per step, metrics, a system prompt) ingests into canonical records; a malformed ATIF
file is quarantined with a field-named reason and nothing else is lost."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from components.data.adapters import from_atif
from components.data.atif import to_atif
from components.data.config import IngestConfig, ValidationConfig
from components.data.ingest import ingest, load_records, read_quarantine
from components.data.schema import parse_record
from components.data.validate import validate_dataset
from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.evaluate.safety.tasks import build_safety_tasks
from components.rollout.__main__ import main_export
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy
from components.verifier.provenance import as_claimed, is_signed_by_us, sign_record
from tests.harbor_wheel import harbor_root

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "data"


def _canonical(record: dict) -> dict:
    model, reasons = parse_record(record, "r")
    assert not reasons, reasons
    return model.model_dump(mode="json")


def _read_back(record: dict) -> dict:
    """What reading `record`'s ATIF back gives: the record itself when its verdict is signed
    by this installation (or it has none); otherwise its verdict only as claimed_* (issue 44)."""
    carries = record.get("reward") is not None or (record.get("metadata") or {}).get("success")
    if not carries or is_signed_by_us(record):
        return _canonical(record)
    return _canonical(as_claimed(copy.deepcopy(record)))


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> list[dict]:
    """Real records: a sampled rollout (token ids, logprobs, extra keys), an OpenAI log as
    ingested (system prompt, tool call ids) and an oracle episode run in the sandbox."""
    # our sampled rollouts, signed as the episode's finish signs them
    records = [json.loads(line) for line in (FIXTURES / "rollouts.jsonl").read_text().splitlines()]
    assert all(sign_record(r) for r in records)
    out = tmp_path_factory.mktemp("ingested")
    ingest([str(FIXTURES / "openai_chat.jsonl")], IngestConfig(out_dir=str(out)))
    records += list(load_records(out))
    task = build_safety_tasks(tmp_path_factory.mktemp("tasks"), 1, seed=7)[0]
    records.append(run_episode(task, OraclePolicy(), EnvConfig(), SandboxConfig()).record)
    return records


def test_round_trip_is_lossless_on_every_field_we_use(episodes):
    for record in episodes:
        back = from_atif(json.loads(json.dumps(to_atif(record))))
        assert _canonical(back) == _read_back(record), record["id"]


def test_the_export_validates_against_harbors_trajectory_model(episodes, tmp_path):
    harbor_root()
    from harbor.models.trajectories import Trajectory

    src = tmp_path / "samples.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in episodes))
    assert main_export([str(src), "--format", "atif", "--out", str(tmp_path / "atif")]) == 0
    # (a dotfile beside them is the command's own bookkeeping, components/outputs.py)
    files = sorted((tmp_path / "atif").glob("[!.]*.json"))
    assert len(files) == len(episodes)
    for f in files:
        doc = json.loads(f.read_text())
        traj = Trajectory.model_validate(doc)
        assert traj.schema_version == "ATIF-v1.6"
        calls = sum(len(s.tool_calls or []) for s in traj.steps)
        record = next(r for r in episodes if r["id"] == traj.session_id)
        assert calls == sum(1 for e in record["trajectory"] if e.get("action"))
    # and the folder ingests back to the same records
    result = ingest([str(tmp_path / "atif")], IngestConfig(out_dir=str(tmp_path / "back")))
    assert result.counts["valid"] == len(episodes) and result.counts["quarantined"] == 0
    back = {r["id"]: _canonical(r) for r in load_records(tmp_path / "back")}
    assert back == {r["id"]: _without_mac(_read_back(r)) for r in episodes}
    # the per-installation verdict MAC stays out of versioned data (schema.record_to_rows)
    assert all("verdict_mac" not in r["metadata"] for r in back.values())


def _without_mac(record: dict) -> dict:
    meta = {k: v for k, v in record["metadata"].items() if k != "verdict_mac"}
    return {**record, "metadata": meta}


FOREIGN = {
    "schema_version": "ATIF-v1.5",
    "session_id": "run-7f2a",
    "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "gpt-5-mini"},
    "steps": [
        {"step_id": 1, "source": "system", "message": "You are a coding agent."},
        {"step_id": 2, "source": "user", "timestamp": "2026-11-30T10:00:00Z",
         "message": "tests/test_dates.py fails for 1900. Fix is_leap in dates.py."},
        {"step_id": 3, "source": "agent", "message": "Look first.",
         "reasoning_content": "read both files",
         "tool_calls": [
             {"tool_call_id": "c1", "function_name": "read_file", "arguments": {"path": "dates.py"}},
             {"tool_call_id": "c2", "function_name": "run_command",
              "arguments": {"cmd": "python -m pytest -q"}},
         ],
         "observation": {"results": [
             {"source_call_id": "c2", "content": "1 failed"},
             {"source_call_id": "c1", "content": "def is_leap(y): return y % 4 == 0"},
         ]},
         "metrics": {"prompt_tokens": 120, "completion_tokens": 30, "cost_usd": 0.0001}},
        {"step_id": 4, "source": "agent", "message": "",
         "tool_calls": [{"tool_call_id": "c3", "function_name": "finish",
                         "arguments": {"summary": "fixed"}}],
         "observation": {"results": [{"source_call_id": "c3", "content": "episode finished"}]}},
    ],
    "final_metrics": {"total_prompt_tokens": 120, "total_completion_tokens": 30},
}  # fmt: skip


def test_atif_from_another_producer_ingests_with_calls_paired_to_their_results(tmp_path):
    harbor_root()
    from harbor.models.trajectories import Trajectory

    Trajectory.model_validate(FOREIGN)  # the input is real ATIF
    src = tmp_path / "trajectory.json"
    src.write_text(json.dumps(FOREIGN))
    result = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "ingested")))
    assert result.counts == {"ingested": 1, "valid": 1, "quarantined": 0}
    (rec,) = load_records(tmp_path / "ingested")
    roles = [(e["role"], e.get("action"), e.get("observation")) for e in rec["trajectory"]]
    assert roles == [
        ("user", None, None),
        ("assistant", "read_file", None),
        ("environment", None, "def is_leap(y): return y % 4 == 0"),
        ("assistant", "run_command", None),
        ("environment", None, "1 failed"),
        ("assistant", "finish", None),
        ("environment", None, "episode finished"),
    ]
    assert rec["system"] == "You are a coding agent." and rec["id"] == "run-7f2a"
    assert rec["metadata"]["policy"] == "terminus-2"
    assert rec["metadata"]["model_version"] == "gpt-5-mini"
    assert rec["metadata"]["num_tokens"] == 150 and rec["reward"] is None
    assert rec["trajectory"][1]["atif_metrics"]["cost_usd"] == 0.0001
    assert rec["atif"]["final_metrics"] == FOREIGN["final_metrics"]


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda d: d["steps"][2]["tool_calls"][0].pop("function_name"),
         "steps[2].tool_calls[0].function_name"),
        (lambda d: d["steps"][2]["observation"]["results"][0].update(source_call_id="nope"),
         "steps[2].observation.results[0].source_call_id"),
        (lambda d: d["steps"][3].update(step_id=9), "steps[3].step_id"),
        (lambda d: d["steps"][1].update(tool_calls=[]), "steps[1].tool_calls"),
        (lambda d: d.pop("agent"), "agent"),
    ],
    ids=["no-function-name", "dangling-result", "step-id", "user-tool-calls", "no-agent"],
)  # fmt: skip
def test_a_malformed_atif_file_is_quarantined_with_the_field_and_nothing_else_lost(
    tmp_path, damage, field
):
    bad = json.loads(json.dumps(FOREIGN))
    damage(bad)
    src = tmp_path / "in"
    src.mkdir()
    (src / "good.json").write_text(json.dumps(FOREIGN))
    (src / "bad.json").write_text(json.dumps({**bad, "session_id": "bad-run"}))
    (src / "chat.jsonl").write_text((FIXTURES / "openai_chat.jsonl").read_text())
    result = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "ingested")))
    assert result.counts == {"ingested": 4, "valid": 3, "quarantined": 1}
    (entry,) = read_quarantine(tmp_path / "ingested")
    assert entry["source_file"].endswith("bad.json") and entry["format"] == "atif"
    assert any(f"field {field}:" in r for r in entry["reasons"]), entry["reasons"]


def test_validate_passes_atif_records_and_keeps_the_quarantine(tmp_path):
    bad = json.loads(json.dumps(FOREIGN))
    bad["steps"][2]["tool_calls"][0]["arguments"] = "path=dates.py"
    src = tmp_path / "in"
    src.mkdir()
    (src / "good.json").write_text(json.dumps(FOREIGN))
    (src / "bad.json").write_text(json.dumps(bad))
    ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "ingested")))
    report = validate_dataset(ValidationConfig(
        in_dir=str(tmp_path / "ingested"), out_dir=str(tmp_path / "validated"),
        report_dir=str(tmp_path / "reports"), max_failure_rate=0.5,
    ))  # fmt: skip
    assert report["counts"] == {"ingested": 2, "valid": 1, "quarantined": 1}
    (entry,) = read_quarantine(tmp_path / "validated")
    assert any("field steps[2].tool_calls[0].arguments:" in r for r in entry["reasons"])
