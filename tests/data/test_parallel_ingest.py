"""A large JSON-lines file is decoded and checked by worker processes (ingest.py): the
dataset it publishes must be the one a single process publishes, byte for byte, hostile
lines included, and a file that breaks mid-read still keeps what was read."""

from __future__ import annotations

import json
from pathlib import Path

from components.data.config import IngestConfig
from components.data.ingest import ingest, read_manifest
from tests.data.conftest import good


def _mixed_lines(path: Path) -> Path:
    """Good records, an array of two on one line, a BOM, bad JSON, a bad record, blanks."""
    lines = [json.dumps(good(f"ok-{i}")) for i in range(40)]
    lines[0] = "\ufeff" + lines[0]
    lines[5] = json.dumps([good("arr-1"), good("arr-2")])
    lines[9] = '{"id": "truncated", "trajectory": ['
    bad = good("bad-1")
    bad["reward"] = "high"
    lines[13] = json.dumps(bad)
    lines[17] = ""
    lines[21] = json.dumps(good("ok-1"))  # a duplicate id, kept for validation to judge
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _dataset_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_workers_publish_the_same_dataset_as_one_process(tmp_path, monkeypatch):
    import components.data.ingest as ingest_module

    src = _mixed_lines(tmp_path / "in.jsonl")
    one = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "one"), workers=1))

    def not_in_this_process(*args, **kwargs):
        raise AssertionError("the worker path must not read records in this process")

    monkeypatch.setattr(ingest_module, "read_records", not_in_this_process)
    # parallel_min_bytes=1: this small file takes the worker path (chunks of a few lines).
    two = ingest(
        [str(src)], IngestConfig(out_dir=str(tmp_path / "two"), workers=2, parallel_min_bytes=1)
    )
    assert one.counts == two.counts == {"ingested": 40, "valid": 38, "quarantined": 2}
    assert one.per_source == two.per_source
    assert _dataset_files(tmp_path / "one") == _dataset_files(tmp_path / "two")
    assert read_manifest(tmp_path / "two")["counts"]["ingested"] == 40


def test_a_file_that_breaks_mid_read_keeps_what_was_read_with_workers(tmp_path, monkeypatch):
    import components.data.ingest as ingest_module

    real = ingest_module.json_lines

    def breaks(*args, **kwargs):
        lines = real(*args, **kwargs)

        def gen():
            yield next(lines)
            yield next(lines)
            raise OSError(5, "Input/output error")

        return gen()

    monkeypatch.setattr(ingest_module, "json_lines", breaks)
    src = _mixed_lines(tmp_path / "in.jsonl")
    cfg = IngestConfig(out_dir=str(tmp_path / "out"), workers=2, parallel_min_bytes=1)
    result = ingest([str(src)], cfg)
    assert result.counts == {"ingested": 3, "valid": 2, "quarantined": 1}
    assert "field <file>: read failed after 2 records" in result.quarantine[0]["reasons"][0]
