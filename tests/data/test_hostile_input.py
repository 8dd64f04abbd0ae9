"""Input that once aborted an ingest or slipped through it (issue 18): each case becomes a
quarantined record with its reason or a skipped file with its reason, the counts
reconcile per source, and no command prints a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.data.config import IngestConfig, ValidationConfig
from components.data.ingest import (
    DatasetError,
    ingest,
    load_records,
    read_manifest,
    read_quarantine,
    write_dataset,
)
from components.data.validate import validate_dataset
from tests.data.conftest import good

REPO = Path(__file__).resolve().parents[2]


def _ingest(tmp_path: Path, *sources, **cfg):
    return ingest([str(s) for s in sources], IngestConfig(out_dir=str(tmp_path / "out"), **cfg))


def _validate(tmp_path: Path, **cfg) -> dict:
    return validate_dataset(
        ValidationConfig(in_dir=str(tmp_path / "out"), out_dir=str(tmp_path / "validated"),
                         report_dir=str(tmp_path / "report"), max_failure_rate=1.0, **cfg)
    )  # fmt: skip


def _lines(path: Path, *objs) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def _reconciles(result) -> None:
    for stats in result.per_source.values():
        assert stats["ingested"] == stats["valid"] + stats["quarantined"], stats


def _reasons(result) -> list[str]:
    return [r for q in result.quarantine for r in q["reasons"]]


def _nested(depth: int) -> dict:
    inner: dict = {"leaf": 1}
    for _ in range(depth):
        inner = {"a": inner}
    return inner


def test_deeply_nested_records_are_quarantined_not_fatal(tmp_path):
    deep = good("deep-1")
    deep["trajectory"][1]["arguments"] = {"cmd": "ls", "x": _nested(300)}
    src = _lines(tmp_path / "in.jsonl", good("ok-1"), deep)
    with src.open("a") as f:  # deeper than the JSON parser's own recursion limit
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    result = _ingest(tmp_path, src)
    assert result.counts == {"ingested": 3, "valid": 1, "quarantined": 2}
    reasons = _reasons(result)
    assert any(
        "field trajectory[1].arguments.x.a.a... (100 levels): nested more than 100 levels deep" in r
        for r in reasons
    ), reasons
    assert any(f"{src}:3 field <json>: nested too deeply to parse" in r for r in reasons), reasons
    _reconciles(result)


@pytest.mark.parametrize(
    ("stamp", "hint"), [(1_732_968_000_000, "milliseconds?"), (1e20, "seconds since 1970")]
)
def test_timestamps_in_milliseconds_or_out_of_range_are_quarantined(tmp_path, stamp, hint):
    chat = {"id": "chat-1", "messages": [{"role": "user", "content": "hi"}], "created": stamp}
    swe = {
        "trajectory_format": "mini-swe-agent-1",
        "messages": [{"role": "user", "content": "fix", "extra": {"timestamp": stamp}}],
    }
    result = _ingest(tmp_path, _lines(tmp_path / "in.jsonl", chat, swe))
    assert result.counts["quarantined"] == 2
    reasons = _reasons(result)
    assert any("field created: timestamp" in r and hint in r for r in reasons), reasons
    assert any("field messages[0].extra.timestamp: timestamp" in r for r in reasons), reasons


def test_an_unreadable_file_is_skipped_with_its_reason(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    _lines(folder / "a.jsonl", good("ok-1"))
    locked = _lines(folder / "locked.jsonl", good("ok-2"))
    real_open = os.open

    def deny(path, *args, **kwargs):  # root reads a chmod 000 file anyway: refuse here
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result = _ingest(tmp_path, folder)
    monkeypatch.undo()
    assert result.counts == {"ingested": 1, "valid": 1, "quarantined": 0}
    skipped = read_manifest(tmp_path / "out")["skipped_files"]
    assert f"{locked}: cannot be read (Permission denied)" in skipped


def test_line_separators_in_a_quarantined_record_survive_validate(tmp_path):
    odd = {"note": "line\u2028separator and next\u0085line", "no": "format"}
    result = _ingest(tmp_path, _lines(tmp_path / "in.jsonl", good("ok-1"), odd))
    assert result.counts["quarantined"] == 1
    report = _validate(tmp_path)
    assert report["counts"] == {"ingested": 2, "valid": 1, "quarantined": 1}
    (entry,) = read_quarantine(tmp_path / "validated")
    assert entry["raw"]["note"] == odd["note"]


def test_non_finite_rewards_are_quarantined_at_ingest(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps(good("ok-1")) + "\n"
        + json.dumps(good("nan-1", reward=float("nan"))) + "\n"
        + json.dumps(good("inf-1", reward_terms={"tests_pass": float("inf")})) + "\n"
        + json.dumps(good("big-1")).replace('"reward": 1.0', '"reward": 1e999') + "\n"
    )  # fmt: skip
    result = _ingest(tmp_path, src)
    assert result.counts == {"ingested": 4, "valid": 1, "quarantined": 3}
    reasons = _reasons(result)
    assert f"record {src}:2 field reward: nan is not a finite number" in " ".join(reasons)
    assert any("field reward_terms.tests_pass: inf is not a finite number" in r for r in reasons)
    assert any(f"{src}:4 field reward: inf is not a finite number" in r for r in reasons)
    # Kept as the line's text: the quarantine file stays strict JSON (no bare NaN).
    for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in quarantine"))


def _dataset_with(tmp_path: Path, records: list[dict], edits=None) -> None:
    """A dataset written directly, not through ingest's checks (what validate must catch):
    `edits(trajectory rows, step rows)` changes the rows before they are written."""
    import pyarrow as pa

    from components.data.schema import arrow_schemas, parse_record, record_to_rows

    trajs, steps = [], []
    for i, rec in enumerate(records):
        t, s = record_to_rows(parse_record(rec, "r")[0], "hand-made.jsonl", i + 1)
        trajs.append(t)
        steps.append(s)
    if edits:
        edits(trajs, steps)
    traj_schema, step_schema = arrow_schemas()
    n = len(records)
    write_dataset(
        tmp_path / "out",
        pa.Table.from_pylist(trajs, schema=traj_schema),
        pa.Table.from_pylist([row for s in steps for row in s], schema=step_schema),
        [],
        {"stage": "ingest", "counts": {"ingested": n, "valid": n, "quarantined": 0},
         "sources": {"hand-made.jsonl": {"ingested": n, "valid": n, "quarantined": 0}}},
        rows_per_shard=100,
    )  # fmt: skip


def test_validation_rejects_non_finite_numbers_and_nul_text(tmp_path):
    def edits(trajs, steps):
        trajs[1]["reward"] = float("nan")
        trajs[2]["reward_terms"] = '{"tests_pass":-Infinity}'
        steps[3][2]["observation"] = "\x00" * 50_000
        steps[4][1]["arguments"] = '{"cmd":"ls","n":NaN}'

    _dataset_with(tmp_path, [good(rid) for rid in ("ok-1", "nan-1", "terms-1", "nul-1", "args-1")],
                  edits)  # fmt: skip
    report = _validate(tmp_path)
    assert report["counts"] == {"ingested": 5, "valid": 1, "quarantined": 4}
    reasons = {q["record"]: q["reasons"] for q in read_quarantine(tmp_path / "validated")}
    assert "record nan-1 field reward: nan is not a finite number" in reasons["nan-1"]
    assert (
        "record terms-1 field reward_terms.tests_pass: -inf is not a finite number"
        in (reasons["terms-1"])
    )
    assert (
        "record nul-1 field trajectory[2].observation: holds 50000 NUL characters "
        "(binary, not text)" in reasons["nul-1"]
    )
    assert (
        "record args-1 field trajectory[1].arguments.n: nan is not a finite number"
        in (reasons["args-1"])
    )
    assert [r["id"] for r in load_records(tmp_path / "validated")] == ["ok-1"]


def test_a_nul_observation_from_ingest_is_quarantined_by_validate(tmp_path):
    rec = good("nul-1")
    rec["trajectory"][2]["observation"] = "\x00" * 50_000
    _ingest(tmp_path, _lines(tmp_path / "in.jsonl", rec, good("ok-1")))
    report = _validate(tmp_path)
    assert report["quarantined_by_check"] == {"step_values": 1}


def test_only_empty_files_fail_with_one_line(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text("")
    (folder / "b.jsonl").write_text("\n  \n")
    with pytest.raises(DatasetError, match=r"no records in the input \(2 files read, all empty"):
        _ingest(tmp_path, folder)
    assert not (tmp_path / "out").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "components.data", "ingest", str(folder), "--out",
         str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert (
        proc.stderr.startswith("error: no records in the input") and "Traceback" not in proc.stderr
    )
    # A dataset of zero records written some other way fails the gate as well.
    _dataset_with(tmp_path, [])
    with pytest.raises(
        DatasetError, match="holds no records: an empty dataset fails the data gate"
    ):
        _validate(tmp_path)


def test_json_arrays_in_jsonl_count_every_element(tmp_path):
    src = _lines(tmp_path / "in.jsonl", [good("a-1"), good("a-2")], [good("b-1"), 5], good("c-1"))
    result = _ingest(tmp_path, src)
    assert result.counts == {"ingested": 5, "valid": 4, "quarantined": 1}
    (bad,) = result.quarantine
    assert bad["record"] == f"{src}:2[1]" and (bad["source_index"], bad["source_item"]) == (2, 1)
    assert sorted(r["id"] for r in load_records(tmp_path / "out")) == ["a-1", "a-2", "b-1", "c-1"]
    _reconciles(result)


def test_a_pretty_printed_document_in_jsonl_is_read_whole(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(good("p-1"), indent=2) + "\n")
    many = tmp_path / "many.jsonl"
    many.write_text(json.dumps([good("p-2"), good("p-3")], indent=2))
    result = _ingest(tmp_path, one, many)
    assert result.counts == {"ingested": 3, "valid": 3, "quarantined": 0}


def test_json_lines_in_a_json_file_are_read_as_lines(tmp_path):
    src = _lines(tmp_path / "in.json", good("j-1"), good("j-2"))
    assert _ingest(tmp_path, src).counts == {"ingested": 2, "valid": 2, "quarantined": 0}


def test_a_utf8_byte_order_mark_loses_nothing(tmp_path):
    lines = tmp_path / "bom.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + json.dumps(good("bom-1")).encode() + b"\n")
    doc = tmp_path / "bom.json"
    doc.write_bytes(b"\xef\xbb\xbf" + json.dumps(good("bom-2"), indent=1).encode())
    result = _ingest(tmp_path, lines, doc)
    assert result.counts == {"ingested": 2, "valid": 2, "quarantined": 0}


def test_symbolic_links_are_never_followed_out_of_the_input_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "passwd.jsonl"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    _lines(outside / "other.jsonl", good("outside-1"))
    folder = tmp_path / "in"
    folder.mkdir()
    _lines(folder / "a.jsonl", good("ok-1"))
    (folder / "passwd.jsonl").symlink_to(secret)
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    os.mkfifo(folder / "pipe.jsonl")  # opening it would block: never opened
    result = _ingest(tmp_path, folder)
    assert result.counts == {"ingested": 1, "valid": 1, "quarantined": 0}
    skipped = read_manifest(tmp_path / "out")["skipped_files"]
    assert f"{folder / 'passwd.jsonl'}: symbolic link (not followed)" in skipped
    assert f"{folder / 'linked'}: symbolic link to a folder (not followed)" in skipped
    assert f"{folder / 'pipe.jsonl'}: not a regular file" in skipped
    for path in (tmp_path / "out").iterdir():
        assert b"root:x:0:0" not in path.read_bytes()


def test_the_command_line_prints_no_traceback_on_hostile_input(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    deep = good("deep-1")
    deep["trajectory"][1]["arguments"] = {"cmd": "ls", "x": _nested(400)}
    src = folder / "mixed.jsonl"
    src.write_text(
        json.dumps(good("ok-1")) + "\n" + json.dumps(deep) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "x"}], "created": 1e15}) + "\n"
        + json.dumps(good("nan-1", reward=float("nan"))) + "\n"
        + json.dumps([good("arr-1"), good("arr-2")]) + "\n"
    )  # fmt: skip
    (folder / "link.jsonl").symlink_to(src)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "components.data"]
    ingest_run = subprocess.run([*cmd, "ingest", str(folder), "--out", str(out)],
                                cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ingest_run.returncode == 0 and "Traceback" not in ingest_run.stderr
    counts = json.loads(ingest_run.stdout)["counts"]
    assert counts == {"ingested": 6, "valid": 3, "quarantined": 3}
    again = subprocess.run([*cmd, "ingest", str(folder), "--out", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "already holds a dataset; pass --overwrite" in again.stderr


def test_an_unexpected_error_in_one_record_quarantines_only_that_record(tmp_path, monkeypatch):
    import components.data.ingest as ingest_module

    real = ingest_module.to_canonical

    def boom(obj, *args, **kwargs):
        if obj.get("id") == "boom-1":
            raise RecursionError("maximum recursion depth exceeded")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(ingest_module, "to_canonical", boom)
    result = _ingest(tmp_path, _lines(tmp_path / "in.jsonl", good("ok-1"), good("boom-1")))
    assert result.counts == {"ingested": 2, "valid": 1, "quarantined": 1}
    assert _reasons(result) == [
        f"record {tmp_path / 'in.jsonl'}:2 field <record>: could not be processed "
        "(RecursionError: maximum recursion depth exceeded)"
    ]


def test_a_file_that_breaks_mid_read_keeps_what_was_read(tmp_path, monkeypatch):
    import components.data.ingest as ingest_module

    real = ingest_module.read_records

    def breaks(*args, **kwargs):
        records = real(*args, **kwargs)
        yield next(records)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ingest_module, "read_records", breaks)
    src = _lines(tmp_path / "in.jsonl", good("ok-1"), good("ok-2"))
    result = _ingest(tmp_path, src)
    assert result.counts == {"ingested": 2, "valid": 1, "quarantined": 1}
    assert (
        "field <file>: read failed after 1 records ([Errno 5] Input/output error)"
        in (_reasons(result)[0])
    )
    _reconciles(result)


def test_a_trajectory_must_call_only_its_tool_sets_tools(tmp_path):
    """The first event names the tool set the policy's prompt listed (issue 23): a call
    outside it, an unknown set, or fix-search calls with no set named are quarantined."""

    def with_set(record_id: str, tool_set: str | None, action: str, arguments: dict) -> dict:
        rec = good(record_id)
        if tool_set is not None:
            rec["trajectory"][0]["tool_set"] = tool_set
        rec["trajectory"][1] = {"role": "assistant", "action": action, "arguments": arguments}
        return rec

    src = _lines(
        tmp_path / "in.jsonl",
        with_set("free-ok", None, "read_file", {"path": "core.py"}),
        with_set("fix-ok", "fix_search", "list_fixes", {}),
        with_set("fix-edit", "fix_search", "edit_file", {"path": "a.py", "old": "a", "new": "b"}),
        with_set("unnamed-fix", None, "list_fixes", {}),
        with_set("no-such-set", "telepathy", "read_file", {"path": "core.py"}),
    )
    _ingest(tmp_path, src)
    report = _validate(tmp_path)
    assert report["counts"] == {"ingested": 5, "valid": 2, "quarantined": 3}
    reasons = {e["record"]: e["reasons"] for e in read_quarantine(tmp_path / "validated")}
    assert reasons["fix-edit"] == [
        "record fix-edit field trajectory[1].action: tool 'edit_file' is not in the "
        "trajectory's tool set 'fix_search'"
    ]
    assert (
        "tool 'list_fixes' is not in the trajectory's tool set 'free_form'"
        in (reasons["unnamed-fix"][0])
    )
    assert reasons["no-such-set"][0].startswith(
        "record no-such-set field trajectory[0].tool_set: unknown tool set 'telepathy'"
    )
