"""Each adapter on realistic fixtures, format detection, and a mixed folder in one call."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from components.data.adapters import detect_format, from_miniswe, from_openai, to_canonical
from components.data.config import IngestConfig
from components.data.ingest import ingest, load_records, read_quarantine
from components.data.schema import parse_record
from components.verifier.provenance import as_claimed

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "data"


def _load(name: str):
    path = FIXTURES / name
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


def _checked(record: dict):
    model, reasons = parse_record(record, "test")
    assert reasons == []
    return model


def _shape(model) -> list[tuple[str, str | None]]:
    return [(e.role, getattr(e, "action", None)) for e in model.trajectory]


def test_mission_records_get_stable_ids_and_task_ids(tmp_path):
    first = ingest([str(FIXTURES / "mission.jsonl")], IngestConfig(out_dir=str(tmp_path / "a")))
    again = ingest([str(FIXTURES / "mission.jsonl")], IngestConfig(out_dir=str(tmp_path / "b")))
    ids = [r["id"] for r in load_records(tmp_path / "a")]
    assert ids == [r["id"] for r in load_records(tmp_path / "b")]
    assert first.manifest["files"] == again.manifest["files"]  # byte-identical shards
    records = {r["task_id"]: r for r in load_records(tmp_path / "a")}
    assert "train-0003" in records  # given task_id kept
    assert any(t.startswith("task-") for t in records)  # hashed from the task text
    # a MISSION file's reward is no verdict of ours: kept as a claim, never as the reward
    assert records["train-0003"]["claimed_reward_terms"]["tests_pass"] == 1.0
    assert records["train-0003"]["reward"] is None and records["train-0003"]["reward_terms"] == {}


def test_openai_parallel_tool_calls_become_action_observation_pairs():
    conv = _load("openai_chat.jsonl")[0]
    model = _checked(to_canonical(conv, detect_format(conv, "x.jsonl"), file_name="x.jsonl"))
    assert model.id == "chatcmpl-run-000193" and model.task_id == "train-0007"
    assert _shape(model) == [
        ("user", None),
        ("assistant", "read_file"),
        ("environment", None),
        ("assistant", "read_file"),
        ("environment", None),
        ("assistant", "edit_file"),
        ("environment", None),
        ("assistant", "run_command"),
        ("environment", None),
        ("assistant", None),  # the final plain-text answer
    ]
    # Tool messages arrived in the other order; each observation follows its own call.
    ev = model.trajectory
    assert ev[1].arguments == {"path": "dates.py"} and "def is_leap" in ev[2].observation
    assert ev[3].arguments == {"path": "tests/test_dates.py"} and "test_leap" in ev[4].observation
    assert ev[5].content.startswith("Century years")
    assert model.metadata.model_version == "gpt-4o-2024-08-06"
    assert model.metadata.created_at == "2025-11-30T12:00:00Z"
    assert model.__pydantic_extra__["system"][0].startswith("You are a coding agent")


def test_openai_content_parts_and_generated_ids():
    conv = _load("openai_chat.jsonl")[1]
    model = _checked(from_openai(conv))
    assert model.task == "Run the test suite and report what fails."
    assert model.id.startswith("openai-") and model.task_id.startswith("task-")
    assert model.metadata.split == "train" and model.metadata.num_tool_calls == 2
    assert model.metadata.__pydantic_extra__ == {"session": "a91f"}


def test_openai_single_json_file():
    conv = _load("single_chat.json")
    assert detect_format(conv, "single_chat.json") == "openai"
    model = _checked(from_openai(conv))
    assert model.reward == -0.3 and model.reward_terms["tests_never_run"] == -0.3
    assert [e.action for e in model.trajectory if e.role == "assistant"] == [
        "search",
        "apply_patch",
        "finish",
    ]


def test_miniswe_v1_text_actions():
    traj = _load("miniswe/django__django-11099.traj.json")
    name = "miniswe/django__django-11099.traj.json"
    assert detect_format(traj, name) == "miniswe"
    model = _checked(from_miniswe(traj, file_name=name))
    assert model.task_id == "django__django-11099" and model.source == "mini-swe-agent"
    assert _shape(model) == [
        ("user", None),
        ("assistant", "run_command"),
        ("environment", None),
        ("assistant", None),  # two bash blocks: the harness rejected the reply
        ("user", None),  # ... and said so
        ("assistant", "run_command"),
        ("environment", None),
        ("assistant", "run_command"),  # the submit command
        ("environment", None),  # its output: the patch
    ]
    ev = model.trajectory
    assert ev[1].arguments == {
        "cmd": 'grep -rn "UsernameValidator" django/contrib/auth/validators.py'
    }
    assert ev[1].content.startswith("THOUGHT:")
    assert ev[8].observation.startswith("diff --git a/django/contrib/auth/validators.py")
    assert model.metadata.model_version == "anthropic/claude-sonnet-4-20250514"
    assert model.metadata.__pydantic_extra__["exit_status"] == "Submitted"


def test_miniswe_v2_tool_calls():
    traj = _load("miniswe/astropy__astropy-12907.traj.json")
    model = _checked(from_miniswe(traj, file_name="astropy__astropy-12907.traj.json"))
    assert model.task_id == "astropy__astropy-12907"
    actions = [e for e in model.trajectory if e.role == "assistant"]
    assert all(a.action == "run_command" and set(a.arguments) == {"cmd"} for a in actions)
    observations = [e for e in model.trajectory if e.role == "environment"]
    assert len(observations) == len(actions) == 4
    assert [o.truncated for o in observations] == [False, True, False, False]
    assert observations[-1].observation.startswith("--- a/astropy/modeling/separable.py")
    assert model.metadata.created_at.startswith("2026-06-")
    # Per-message harness data (raw output, return code, API response) is kept, not dropped.
    assert observations[0].__pydantic_extra__["extra"]["returncode"] == 0


def test_rollout_extra_fields_survive_ingest(tmp_path):
    ingest([str(FIXTURES / "rollouts.jsonl")], IngestConfig(out_dir=str(tmp_path)))
    by_id = {r["id"]: r for r in load_records(tmp_path)}
    policy = by_id["policy-v3-train-0002-7f3e"]
    assert policy["trajectory"][1]["token_ids"] == [1012, 88, 2044, 13]
    assert policy["trajectory"][1]["logprobs"] == [-0.12, -0.003, -1.7, -0.05]
    assert policy["group_id"] == "grpo-step-17-g4"
    assert policy["metadata"]["sampler"] == "vllm"
    original = json.loads((FIXTURES / "rollouts.jsonl").read_text().splitlines()[0])
    # Canonical in, canonical out: only optional fields left out are filled (content: null),
    # and its verdict, signed by no installation here, is kept as claimed_* (issue 44).
    assert by_id["oracle-train-0001-ab12"] == _checked(as_claimed(original)).model_dump(mode="json")
    assert by_id["oracle-train-0001-ab12"]["claimed_reward"] == 1.0
    assert by_id["oracle-train-0001-ab12"]["trajectory"][3] == {
        **original["trajectory"][3],
        "content": None,
    }


def test_mixed_folder_ingests_in_one_call(tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(FIXTURES, mixed)
    (mixed / "README.md").write_text("notes, not data\n")
    result = ingest([str(mixed)], IngestConfig(out_dir=str(tmp_path / "out")))
    formats = {}
    for stats in result.per_source.values():
        for fmt, n in stats["formats"].items():
            formats[fmt] = formats.get(fmt, 0) + n
    assert formats == {"mission": 2, "rollout": 2, "openai": 3, "miniswe": 2}
    assert result.counts == {"ingested": 9, "valid": 9, "quarantined": 0}
    assert any("README.md" in s for s in result.manifest["skipped_files"])
    assert len(list(load_records(tmp_path / "out"))) == 9
    assert read_quarantine(tmp_path / "out") == []


def test_forced_format_applies_to_every_record(tmp_path):
    result = ingest(
        [str(FIXTURES / "mission.jsonl")], IngestConfig(out_dir=str(tmp_path), format="openai")
    )
    assert result.counts == {"ingested": 2, "valid": 0, "quarantined": 2}
    reason = result.quarantine[0]["reasons"][0]
    assert "field messages: must be a list of chat messages (openai format)" in reason


def test_undetectable_record_is_quarantined(tmp_path):
    src = tmp_path / "odd.jsonl"
    src.write_text(json.dumps({"prompt": "hi", "completion": "there"}) + "\n")
    result = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "out")))
    assert result.counts["quarantined"] == 1
    assert (
        f"record {src}:1 field <record>: cannot detect the format"
        in result.quarantine[0]["reasons"][0]
    )


@pytest.mark.parametrize("missing", ["nope.jsonl"])
def test_missing_input_is_an_error(tmp_path, missing):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest([str(tmp_path / missing)], IngestConfig(out_dir=str(tmp_path / "out")))
