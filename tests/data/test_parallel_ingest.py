"""A large JSON-lines file is decoded and checked by worker processes (ingest.py): the
dataset it publishes must be the one a single process publishes, byte for byte, hostile
lines included, and a file that breaks mid-read still keeps what was read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from components.data.config import IngestConfig
from components.data.ingest import ingest, read_manifest
from tests.data.conftest import good

REPO = Path(__file__).resolve().parents[2]


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


# Workers are forked only from a one-thread process (ingest.py), so the worker path runs
# in a fresh interpreter here: the test process may hold other tests' threads.
WORKER_RUN = """
import json, sys
import components.data.ingest as ingest_module
from components.data.config import IngestConfig

def not_in_this_process(*args, **kwargs):
    raise AssertionError("the worker path must not read records in this process")

ingest_module.read_records = not_in_this_process
cfg = IngestConfig(out_dir=sys.argv[2], workers=2, parallel_min_bytes=1)
result = ingest_module.ingest([sys.argv[1]], cfg)
print(json.dumps({"counts": result.counts, "per_source": result.per_source}))
"""


def test_workers_publish_the_same_dataset_as_one_process(tmp_path):
    src = _mixed_lines(tmp_path / "in.jsonl")
    one = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "one"), workers=1))
    proc = subprocess.run([sys.executable, "-c", WORKER_RUN, str(src), str(tmp_path / "two")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    two = json.loads(proc.stdout)
    assert one.counts == two["counts"] == {"ingested": 40, "valid": 38, "quarantined": 2}
    assert one.per_source == two["per_source"]
    assert _dataset_files(tmp_path / "one") == _dataset_files(tmp_path / "two")
    assert read_manifest(tmp_path / "two")["counts"]["ingested"] == 40


BREAKING_RUN = """
import json, sys
import components.data.ingest as ingest_module
from components.data.config import IngestConfig

real = ingest_module.json_lines

def breaks(*args, **kwargs):
    lines = real(*args, **kwargs)

    def gen():
        yield next(lines)
        yield next(lines)
        raise OSError(5, "Input/output error")

    return gen()

ingest_module.json_lines = breaks
cfg = IngestConfig(out_dir=sys.argv[2], workers=2, parallel_min_bytes=1)
result = ingest_module.ingest([sys.argv[1]], cfg)
print(json.dumps({"counts": result.counts, "reasons": result.quarantine[0]["reasons"]}))
"""


def test_a_file_that_breaks_mid_read_keeps_what_was_read_with_workers(tmp_path):
    src = _mixed_lines(tmp_path / "in.jsonl")
    proc = subprocess.run([sys.executable, "-c", BREAKING_RUN, str(src), str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["counts"] == {"ingested": 3, "valid": 2, "quarantined": 1}
    assert "field <file>: read failed after 2 records" in result["reasons"][0]
