"""The validate stage as a whole: secret policy, failure threshold, report and data docs."""

from __future__ import annotations

import json

import yaml

from components.data.__main__ import main_ingest, main_validate, main_versions
from components.data.config import DEFAULT_SECRET_PATTERNS
from components.data.ingest import load_records, read_quarantine
from components.data.redaction import redact_text, secret_regex
from components.verifier.provenance import sign_record

KEYS = {
    "openai_key": "sk-proj-" + "Zx9" * 9,
    "aws_access_key_id": "AKIA" + "IOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2c3D4" * 5,
    "slack_token": "xoxb-" + "1234567890-abcdefghij",
    "google_api_key": "AIza" + "Sy" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "private_key_block": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
}


def test_every_default_secret_kind_is_redacted_and_lookalikes_are_not():
    rx = secret_regex(DEFAULT_SECRET_PATTERNS)
    for kind, key in KEYS.items():
        counts: dict[str, int] = {}
        out = redact_text(f"token: {key} end", rx, counts)
        assert out == f"token: [REDACTED:{kind}] end", kind
        assert counts == {kind: 1}
    # "task-" / "risk-" contain "sk-" but are not keys; the word boundary keeps them.
    text = "see task-0123456789abcdefghijklmno and risk-assessment-for-the-project-plan"
    assert redact_text(text, rx) == text


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _args(tmp_path, *extra):
    return [
        "--in",
        str(tmp_path / "ingested"),
        "--out",
        str(tmp_path / "validated"),
        "--report-dir",
        str(tmp_path / "report"),
        *extra,
    ]


def test_redact_policy_keeps_the_record_without_the_key(tmp_path, make_record, capsys):
    rec = make_record("leaky-1")
    rec["trajectory"][2]["observation"] = f"AWS_ACCESS_KEY_ID={KEYS['aws_access_key_id']}\nok"
    _write(tmp_path / "in.jsonl", [rec, make_record("clean-1")])
    assert main_ingest([str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "ingested")]) == 0
    assert main_validate(_args(tmp_path, "--secret-policy", "redact")) == 0
    assert '"passed": true' in capsys.readouterr().out
    records = {r["id"]: r for r in load_records(tmp_path / "validated")}
    assert set(records) == {"leaky-1", "clean-1"}
    assert (
        records["leaky-1"]["trajectory"][2]["observation"]
        == "AWS_ACCESS_KEY_ID=[REDACTED:aws_access_key_id]\nok"
    )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["redactions"] == {"aws_access_key_id": 1}
    for path in (tmp_path / "validated").iterdir():
        assert KEYS["aws_access_key_id"].encode() not in path.read_bytes(), path


def test_stage_fails_over_the_threshold(tmp_path, make_record, capsys):
    bad = make_record("bad-1", reward=9.0)
    assert sign_record(bad)  # our own episode's verdict: ingest keeps it, validate checks it
    _write(tmp_path / "in.jsonl", [bad, make_record("good-1"), make_record("good-2")])
    assert main_ingest([str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "ingested")]) == 0
    capsys.readouterr()
    assert main_validate(_args(tmp_path, "--max-failure-rate", "0.2")) == 1
    err = capsys.readouterr().err
    assert "validation failed: 1 of 3 records quarantined (33.3% > 20.0%)" in err
    manifest = json.loads((tmp_path / "validated" / "manifest.json").read_text())
    assert manifest["validation"]["passed"] is False
    assert [q["record"] for q in read_quarantine(tmp_path / "validated")] == ["bad-1"]
    # Same data, looser threshold: passes.
    assert main_validate(_args(tmp_path, "--max-failure-rate", "0.5")) == 0


def test_eval_task_ids_from_the_command_line(tmp_path, make_record):
    _write(tmp_path / "in.jsonl", [make_record("a-1", task_id="test-0042"), make_record("a-2")])
    main_ingest([str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "ingested")])
    assert (
        main_validate(_args(tmp_path, "--eval-task-id", "test-0042", "--max-failure-rate", "1"))
        == 0
    )
    (entry,) = read_quarantine(tmp_path / "validated")
    assert entry["reasons"] == [
        "record a-1 field task_id: task 'test-0042' is in an evaluation split (val/test): contamination"
    ]


def test_the_presets_data_section_reaches_every_data_stage(tmp_path, make_record, capsys):
    """Non-default values in a preset's `data` section configure ingest, validate and the
    version log; a flag given on the command line still wins."""
    folders = {name: str(tmp_path / name) for name in ("ingested", "validated", "report")}
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"data": {
        "ingest": {"out_dir": folders["ingested"], "rows_per_shard": 1},
        "validate": {"in_dir": folders["ingested"], "out_dir": folders["validated"],
                     "report_dir": folders["report"], "max_failure_rate": 0.2,
                     "eval_task_ids": ["test-0042"]},
        "versioning": {"repo_root": str(tmp_path), "version_log": "our-versions.jsonl"},
    }}))  # fmt: skip
    records = [make_record("a-1", task_id="test-0042"), make_record("b-1"), make_record("b-2")]
    _write(tmp_path / "in.jsonl", records)
    assert main_ingest([str(tmp_path / "in.jsonl"), "--preset", str(preset)]) == 0
    assert len(list((tmp_path / "ingested").glob("trajectories-*.parquet"))) == 3
    capsys.readouterr()
    assert main_validate(["--preset", str(preset)]) == 1  # the preset's eval id and threshold
    assert "1 of 3 records quarantined (33.3% > 20.0%)" in capsys.readouterr().err
    assert main_validate(["--preset", str(preset), "--max-failure-rate", "0.5"]) == 0
    (tmp_path / "our-versions.jsonl").write_text(json.dumps({"version": "v-preset"}) + "\n")
    capsys.readouterr()
    assert main_versions(["--preset", str(preset), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": "v-preset"}
