"""Canonical schema: the documented examples load unchanged, rows round-trip, configs load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from components.data.adapters import from_mission
from components.data.config import (
    DataConfig,
    IngestConfig,
    S3RemoteConfig,
    ValidationConfig,
    VersioningConfig,
    load_config,
)
from components.data.schema import parse_record, record_to_rows, rows_to_record
from components.preset import load_preset
from components.typed_config import ConfigError, config_from_dict

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"


def test_mission_example_loads_unchanged():
    """MISSION.md's example, with its "..." placeholders as strings, is a valid record."""
    line = (FIXTURES / "mission.jsonl").read_text().splitlines()[0]
    example = json.loads(line)
    assert example == {
        "task": "...",
        "trajectory": [
            {"role": "user", "content": "..."},
            {"role": "assistant", "action": "run_command", "arguments": {"cmd": "pytest"}},
            {"role": "environment", "observation": "test_x failed: expected 4 got 5"},
        ],
        "reward": 1.0,
    }
    model, reasons = parse_record(from_mission(example), "mission.jsonl:1")
    assert reasons == []
    assert [e.role for e in model.trajectory] == ["user", "assistant", "environment"]
    assert model.reward == 1.0 and model.id.startswith("mission-")


def test_contracts_example_is_a_valid_rollout():
    text = (REPO / "docs" / "CONTRACTS.md").read_text()
    block = text.split("```json", 1)[1].split("```", 1)[0]
    model, reasons = parse_record(json.loads(block), "contracts")
    assert reasons == [] and model.id == "oracle-train-0001-ab12"


def test_rows_round_trip_keeps_unknown_fields(make_record):
    rec = make_record("good-0001")
    rec["group_id"] = "g7"
    rec["metadata"]["sampler"] = "vllm"
    rec["trajectory"][1]["token_ids"] = [5, 6]
    rec["trajectory"][1]["logprobs"] = [-0.1, -2.0]
    model, _ = parse_record(rec, "x")
    traj_row, step_rows = record_to_rows(model, "f.jsonl", 1)
    assert json.loads(step_rows[1]["extra"]) == {"token_ids": [5, 6], "logprobs": [-0.1, -2.0]}
    back = rows_to_record(traj_row, step_rows)
    assert back == model.model_dump(mode="json")
    assert back["group_id"] == "g7" and back["trajectory"][1]["logprobs"] == [-0.1, -2.0]


def test_wrong_types_are_named_by_field(make_record):
    rec = make_record("good-0001")
    rec["reward"] = "1.0"
    rec["trajectory"][2]["truncated"] = "no"
    _, reasons = parse_record(rec, "x")
    assert "record good-0001 field reward: Input should be a valid number (got str)" in reasons
    assert any(r.startswith("record good-0001 field trajectory[2].truncated:") for r in reasons)


@pytest.mark.parametrize(
    "model", [DataConfig, IngestConfig, ValidationConfig, VersioningConfig, S3RemoteConfig]
)
def test_every_config_field_has_help(model):
    for field in dataclasses.fields(model):
        assert field.metadata.get("help"), f"{model.__name__}.{field.name} has no help string"


def test_shipped_preset_data_section_loads(tmp_path):
    cfg = load_preset(REPO / "configs" / "cpu-demo.yaml").section("data")
    assert isinstance(cfg, DataConfig) and cfg.validate.secret_policy == "redact"
    path = tmp_path / "data.yaml"
    path.write_text("validate: {eval_splits: [test]}\nversioning: {s3: {url: s3://b/p}}\n")
    loaded = load_config(path)
    assert loaded.validate.eval_splits == ("test",) and loaded.versioning.s3.url == "s3://b/p"
    assert loaded.ingest == IngestConfig()


@pytest.mark.parametrize(
    "bad",
    [
        {"validate": {"max_failure_rate": 1.5}},
        {"validate": {"secret_policy": "ignore"}},
        {"validate": {"reward_min": 2.0, "reward_max": 1.0}},
        {"validate": {"secret_patterns": {"broken": "(unclosed"}}},
        {"versioning": {"s3": {"url": "http://not-s3"}}},
        {"ingest": {"unknown_key": 1}},
    ],
)
def test_invalid_config_is_rejected_where_defined(bad):
    with pytest.raises(ConfigError):
        config_from_dict(DataConfig, bad)
