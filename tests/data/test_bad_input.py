"""Every kind of bad input named by the issue: a clear reason naming the record and the
field, a quarantine entry, and counts that reconcile (ingested = valid + quarantined).

One ingest + validate run over a file mixing all the cases (module fixture, so GX runs
once); each case then has its own test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from components.data.config import IngestConfig, ValidationConfig
from components.data.ingest import ingest, load_records, read_manifest, read_quarantine
from components.data.validate import validate_dataset
from components.tasks.task import TaskMetadata, write_task_folder
from components.verifier.provenance import sign_record

KEY = "sk-proj-" + "Ab3dE5gH7jK9mN1pQ3sT5vX7"
MAX_OBS = 1000


def _good(rid: str, **changes) -> dict:
    rec = {
        "schema_version": 1,
        "id": rid,
        "task_id": "train-0001",
        "source": "oracle",
        "task": "Fix clamp() so tests/test_core.py passes.",
        "trajectory": [
            {"role": "user", "content": "Fix clamp() so tests/test_core.py passes."},
            {
                "role": "assistant",
                "action": "run_command",
                "arguments": {"cmd": "python -m pytest -q"},
            },
            {"role": "environment", "observation": "1 failed, 3 passed", "truncated": False},
            {"role": "assistant", "action": "finish", "arguments": {"summary": "done"}},
            {"role": "environment", "observation": "episode finished", "truncated": False},
        ],
        "reward": 1.0,
        "reward_terms": {"tests_pass": 1.0},
        "metadata": {"split": "train"},
    }
    rec.update(changes)
    return rec


def _ours(rec: dict) -> dict:
    """`rec` signed as this installation's episode finish signs a verdict: ingest keeps the
    reward of such a record (a foreign one's only as claimed_reward, never checked here)."""
    sign_record(rec)
    return rec


def _with_step(rid: str, index: int, **event_changes) -> dict:
    rec = _good(rid)
    rec["trajectory"] = copy.deepcopy(rec["trajectory"])
    rec["trajectory"][index].update(event_changes)
    return rec


def _lines() -> list[bytes]:
    no_obs = _good("noobs-1")
    del no_obs["trajectory"][2]  # run_command is now followed by the next action
    dup = _ours(_good("ok-1", reward=0.5))
    return [
        json.dumps(_ours(_good("ok-1"))).encode(),  # line 1
        json.dumps(_ours(_good("ok-2"))).encode(),  # line 2
        json.dumps(_good("trunc-1")).encode()[:90],  # line 3: cut off mid-record
        json.dumps(_good("types-1", reward="high")).encode(),  # line 4
        json.dumps(no_obs).encode(),  # line 5
        json.dumps(_with_step("tool-1", 1, action="delete_repo")).encode(),  # line 6
        json.dumps(_with_step("args-1", 1, arguments={"command": "ls"})).encode(),  # line 7
        json.dumps(_with_step("big-1", 2, observation="x" * (MAX_OBS + 1))).encode(),  # line 8
        b'{"id": "utf8-1", "task": "caf\xe9 latin-1 bytes", "trajectory": []}',  # line 9
        json.dumps(_with_step("surrogate-1", 2, observation="bad \ud800 text")).encode(),  # 10
        json.dumps(dup).encode(),  # line 11
        json.dumps(
            _with_step("secret-1", 2, observation=f"export OPENAI_API_KEY={KEY}\n")
        ).encode(),
        json.dumps(_good("eval-1", task_id="val-0001")).encode(),  # line 13
        json.dumps(_good("eval-2", metadata={"split": "test"})).encode(),  # line 14
        json.dumps(_ours(_good("reward-1", reward=5.0))).encode(),  # line 15
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    src = tmp / "bad.jsonl"
    src.write_bytes(b"\n".join(_lines()) + b"\n")
    write_task_folder(
        tmp / "tasks" / "val-0001",
        task_id="val-0001",
        instruction="Fix median().",
        metadata=TaskMetadata(family="stats", bug_class="off_by_one", split="val"),
        repo_files={"stats.py": "def median(xs): ...\n"},
        hidden_test_files={"tests/test_hidden.py": "def test_x(): pass\n"},
    )
    ingested = ingest([str(src)], IngestConfig(out_dir=str(tmp / "ingested")))
    report = validate_dataset(
        ValidationConfig(
            in_dir=str(tmp / "ingested"),
            out_dir=str(tmp / "validated"),
            report_dir=str(tmp / "report"),
            max_failure_rate=1.0,
            secret_policy="reject",
            max_observation_chars=MAX_OBS,
            eval_task_root=str(tmp / "tasks"),
        )
    )
    return {"src": str(src), "tmp": tmp, "ingested": ingested, "report": report}


def _reasons(run, record: str) -> list[str]:
    entries = [q for q in read_quarantine(run["tmp"] / "validated") if q["record"] == record]
    assert entries, f"{record} is not in quarantine"
    return [r for q in entries for r in q["reasons"]]


def _assert_reason(run, record: str, expected: str) -> None:
    reasons = _reasons(run, record)
    assert any(expected in r for r in reasons), reasons


def test_counts_reconcile_and_nothing_is_dropped(run):
    counts = run["report"]["counts"]
    assert counts["ingested"] == len(_lines()) == counts["valid"] + counts["quarantined"]
    for stats in run["report"]["sources"].values():
        assert stats["ingested"] == stats["valid"] + stats["quarantined"]
    manifest = read_manifest(run["tmp"] / "validated")
    assert manifest["counts"] == counts
    valid_ids = sorted(r["id"] for r in load_records(run["tmp"] / "validated"))
    assert valid_ids == ["ok-1", "ok-2"]
    quarantined = read_quarantine(run["tmp"] / "validated")
    assert len(quarantined) == counts["quarantined"] == len(_lines()) - 2
    # Ingest's own count holds as well.
    c = run["ingested"].counts
    assert c["ingested"] == c["valid"] + c["quarantined"] == len(_lines())


def test_truncated_json_line(run):
    name = f"{run['src']}:3"
    _assert_reason(run, name, f"record {name} field <json>: truncated JSON")
    entry = next(q for q in read_quarantine(run["tmp"] / "validated") if q["record"] == name)
    assert entry["stage"] == "ingest" and entry["raw_text"].startswith('{"schema_version": 1')


def test_wrong_types(run):
    _assert_reason(
        run, "types-1", "record types-1 field reward: Input should be a valid number (got str)"
    )


def test_missing_observation_after_action(run):
    _assert_reason(
        run,
        "noobs-1",
        "record noobs-1 field trajectory[1].role: action 'run_command' is not followed by its "
        "observation (next is a 'assistant' event)",
    )


def test_unknown_tool(run):
    _assert_reason(
        run, "tool-1", "record tool-1 field trajectory[1].action: unknown tool 'delete_repo'"
    )


def test_arguments_invalid_for_the_tool(run):
    reasons = _reasons(run, "args-1")
    assert (
        "record args-1 field trajectory[1].arguments: run_command: missing argument 'cmd'; run_command: unexpected argument 'command'"
        in reasons
    )


def test_oversized_observation(run):
    _assert_reason(
        run,
        "big-1",
        f"record big-1 field trajectory[2].observation: observation is {MAX_OBS + 1} chars (max {MAX_OBS})",
    )


def test_invalid_utf8_bytes(run):
    name = f"{run['src']}:9"
    _assert_reason(run, name, f"record {name} field <bytes>: invalid UTF-8 at byte 29")
    entry = next(q for q in read_quarantine(run["tmp"] / "validated") if q["record"] == name)
    assert "caf\\xe9" in entry["raw_text"]  # the raw bytes, escaped


def test_invalid_utf8_escape(run):
    _assert_reason(
        run,
        "surrogate-1",
        "record surrogate-1 field trajectory[2].observation: invalid UTF-8 (unpaired surrogate)",
    )


def test_duplicate_id_keeps_the_first(run):
    _assert_reason(
        run, "ok-1", f"record ok-1 field id: duplicate id 'ok-1' (first seen at {run['src']}:1)"
    )
    entry = next(q for q in read_quarantine(run["tmp"] / "validated") if q["record"] == "ok-1")
    assert entry["source_index"] == 11 and entry["raw"]["reward"] == 0.5
    kept = [r for r in load_records(run["tmp"] / "validated") if r["id"] == "ok-1"]
    assert len(kept) == 1 and kept[0]["reward"] == 1.0


def test_leaked_api_key_rejected_and_not_stored(run):
    _assert_reason(
        run,
        "secret-1",
        "record secret-1 field trajectory[2].observation: contains a credential (openai_key)",
    )
    stored = (run["tmp"] / "validated" / "quarantine.jsonl").read_text()
    assert KEY not in stored and "[REDACTED:openai_key]" in stored


def test_eval_split_task_is_contamination(run):
    _assert_reason(
        run,
        "eval-1",
        "record eval-1 field task_id: task 'val-0001' is in an evaluation split (val/test): contamination",
    )


def test_eval_split_label_is_contamination(run):
    _assert_reason(
        run, "eval-2", "record eval-2 field metadata.split: trajectory is labelled split 'test'"
    )


def test_reward_out_of_range(run):
    _assert_reason(run, "reward-1", "record reward-1 field reward: 5.0 is outside [-3.0, 1.0]")


def test_gx_results_are_the_gate(run):
    """The validate-stage quarantine comes from failed GX expectations, listed per check."""
    results = {e["check"]: e for e in run["report"]["expectations"]}
    for check in (
        "role_order",
        "tool_known",
        "tool_arguments",
        "observation_length",
        "unique_id",
        "secret_observation",
        "eval_task",
        "eval_split",
        "reward_range",
    ):
        assert results[check]["success"] is False and results[check]["unexpected_rows"] >= 1, check
    assert results["required_id"]["success"] is True
    assert sum(run["report"]["quarantined_by_check"].values()) >= 9
    docs = Path(run["report"]["data_docs"])
    assert docs.name == "index.html" and docs.is_file()
    assert (run["tmp"] / "report" / "report.json").is_file()
