"""Writers are safe (issue 18): one writer per target at a time (a second one waits, then
fails naming the holder), datasets published whole, leftovers of a killed write undone,
nothing replaced without being asked, and a damaged dataset never read as if it were
whole. Locks are tested in one process: two flock()s on separate opens conflict there too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.data.config import IngestConfig, ValidationConfig
from components.data.ingest import (
    DatasetError,
    ingest,
    load_records,
    read_manifest,
    read_tables,
)
from components.data.validate import validate_dataset
from components.data.writers import (
    Lock,
    LockTimeout,
    locked,
    publish_dir,
    recover_dir,
    sibling,
)
from tests.data.conftest import good

REPO = Path(__file__).resolve().parents[2]


def _input(tmp_path: Path, *ids: str) -> Path:
    src = tmp_path / f"in-{'-'.join(ids)}.jsonl"
    src.write_text("".join(json.dumps(good(i)) + "\n" for i in ids))
    return src


def _ingest(src: Path, out: Path, **kwargs):
    timeout = kwargs.pop("lock_timeout_s", 5.0)
    return ingest([str(src)], IngestConfig(out_dir=str(out), lock_timeout_s=timeout), **kwargs)


def _ids(dataset: Path) -> list[str]:
    return sorted(r["id"] for r in load_records(dataset))


def test_a_second_writer_gives_up_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with locked([Lock(out)], timeout_s=1):
        started = time.monotonic()
        with pytest.raises(LockTimeout) as e:
            _ingest(_input(tmp_path, "a-1"), out, lock_timeout_s=0.3)
        assert 0.3 <= time.monotonic() - started < 3
    assert f"{out} is locked by pid {os.getpid()}" in str(e.value)
    assert not out.exists()
    assert not sibling(out, "lock").exists()  # the holder removed its lock file


def test_a_waiting_writer_goes_on_when_the_holder_is_done(tmp_path):
    out = tmp_path / "out"
    release = threading.Event()

    def hold():
        with locked([Lock(out)], timeout_s=1):
            release.set()
            time.sleep(0.4)

    holder = threading.Thread(target=hold)
    holder.start()
    release.wait()
    _ingest(_input(tmp_path, "a-1"), out, lock_timeout_s=5)
    holder.join()
    assert _ids(out) == ["a-1"]


def test_writers_inside_a_locked_data_folder_wait(tmp_path):
    """snapshot/rollback hold data/ exclusively; ingest and validate inside it hold it
    shared, so they wait rather than change data/ under a version being taken."""
    data = tmp_path / "data"
    _ingest(_input(tmp_path, "a-1"), data / "ingested")
    with locked([Lock(data, keep_file=True)], timeout_s=1):
        with pytest.raises(LockTimeout, match=f"{data} is locked by pid {os.getpid()}"):
            _ingest(_input(tmp_path, "b-1"), data / "ingested", overwrite=True, lock_timeout_s=0.2)
        with pytest.raises(LockTimeout):
            validate_dataset(
                ValidationConfig(in_dir=str(data / "ingested"), out_dir=str(data / "validated"),
                                 report_dir=str(tmp_path / "report"), lock_timeout_s=0.2)
            )  # fmt: skip
    assert sibling(data, "lock").is_file()  # kept: later writers inside data/ find it
    _ingest(_input(tmp_path, "b-1"), data / "ingested", overwrite=True)
    assert _ids(data / "ingested") == ["b-1"]


def test_validate_waits_for_the_ingest_of_its_input(tmp_path):
    _ingest(_input(tmp_path, "a-1"), tmp_path / "ingested")
    cfg = ValidationConfig(in_dir=str(tmp_path / "ingested"), out_dir=str(tmp_path / "validated"),
                           report_dir=str(tmp_path / "report"), lock_timeout_s=0.2)  # fmt: skip
    with locked([Lock(tmp_path / "ingested")], timeout_s=1), pytest.raises(LockTimeout):
        validate_dataset(cfg)


def test_an_existing_dataset_is_replaced_only_when_asked(tmp_path):
    out = tmp_path / "out"
    _ingest(_input(tmp_path, "a-1"), out)
    with pytest.raises(DatasetError, match="already holds a dataset; pass --overwrite"):
        _ingest(_input(tmp_path, "b-1"), out)
    assert _ids(out) == ["a-1"]
    _ingest(_input(tmp_path, "b-1"), out, overwrite=True)
    assert _ids(out) == ["b-1"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"holds files that are not part of a dataset \(notes"):
        _ingest(_input(tmp_path, "c-1"), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_failed_write_leaves_the_published_dataset_whole(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    _ingest(_input(tmp_path, "a-1"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = pq.write_table
    calls = []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "write_table", fail_second)
    with pytest.raises(OSError, match="No space left"):
        _ingest(_input(tmp_path, "b-1", "b-2"), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if ".agentrl-" in p.name) == []


def test_leftovers_of_a_killed_publish_are_undone(tmp_path):
    out = tmp_path / "out"
    _ingest(_input(tmp_path, "a-1"), out)
    # Killed between the two renames: the old dataset is aside, the new one half-written.
    os.rename(out, sibling(out, "old-1-abc"))
    half = sibling(out, "tmp-1-abc")
    half.mkdir()
    (half / "trajectories-00000.parquet").write_bytes(b"PAR1 cut")
    assert recover_dir(out) == [
        f"restored {out} from an interrupted write",
        f"removed {half.name}",
    ]
    assert _ids(out) == ["a-1"] and not half.exists()
    # The next writer does the same on its own.
    os.rename(out, sibling(out, "old-2-abc"))
    _ingest(_input(tmp_path, "b-1"), out, overwrite=True)
    assert _ids(out) == ["b-1"]
    assert [p.name for p in tmp_path.iterdir() if ".agentrl-" in p.name] == []


def test_publish_dir_removes_its_folder_on_failure(tmp_path):
    target = tmp_path / "target"
    with pytest.raises(RuntimeError), publish_dir(target) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_dataset_is_never_read_as_whole(tmp_path):
    out = tmp_path / "out"
    _ingest(_input(tmp_path, "a-1", "a-2"), out)
    shard = out / "steps-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(DatasetError, match="steps-00000.parquet does not match its manifest md5"):
        read_tables(out)
    proc = subprocess.run(
        [sys.executable, "-m", "components.data", "validate", "--in", str(out), "--out",
         str(tmp_path / "validated"), "--report-dir", str(tmp_path / "report")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: dataset {out} is damaged")
    assert read_manifest(out)["counts"]["ingested"] == 2
