"""Rollback cannot lose data (issue 18): it refuses to drop changes no snapshot holds
(or snapshots them first), refuses a version whose objects are gone before touching
data/, writes data.dvc only once data/ holds the version, and the next command completes
or undoes a snapshot or rollback that was killed midway (states built by hand here; the
slow test in test_faults.py kills real processes)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from components.data.__main__ import main_rollback, main_versions
from components.data.config import VersioningConfig
from components.data.dvc_store import VersioningError, current_version
from components.data.version_log import read_log
from components.data.versioning import rollback, snapshot
from components.data.writers import Lock, LockTimeout, locked, sibling
from tests.data.trees import file_tree  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "data"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc")


def _state(v: dict) -> tuple:
    return file_tree(v["data"]), (v["root"] / "data.dvc").read_text()


def _bookkeeping(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".agentrl-" in p.name and "lock" not in p.name)


def test_unsnapshotted_changes_are_refused_or_snapshotted_first(versions, capsys):
    v, data = versions, versions["data"]
    (data / "notes.txt").write_text("my unsaved notes\n")
    before = _state(v)
    with pytest.raises(VersioningError, match=r"has changes no snapshot holds \(new file notes"):
        rollback(v["cfg"], v["v1"])
    assert _state(v) == before
    assert main_rollback([v["v1"], "--repo-root", str(v["root"])]) == 1
    assert "--snapshot-first" in capsys.readouterr().err
    result = rollback(v["cfg"], v["v1"], snapshot_first=True)
    assert result["version"] == v["v1"] and file_tree(data) == v["tree1"]
    saved = read_log(v["cfg"])[-1]
    assert saved["message"] == f"before rollback to {v['v1']}" and "notes.txt" in saved["files"]
    rollback(v["cfg"], saved["version"])
    assert (data / "notes.txt").read_text() == "my unsaved notes\n"


def test_a_missing_data_folder_is_not_a_change(versions):
    shutil.rmtree(versions["data"])
    assert rollback(versions["cfg"], versions["v1"])["pulled"] is False
    assert file_tree(versions["data"]) == versions["tree1"]


def test_a_version_with_missing_objects_is_refused_before_data_is_touched(versions):
    v = versions
    entry = next(e for e in read_log(v["cfg"]) if e["version"] == v["v1"])
    gone = entry["files"]["ingested/manifest.json"]
    for store in (v["root"] / ".dvc" / "cache", v["root"] / ".dvc-remote"):
        for obj in store.rglob(gone[2:]):
            obj.chmod(0o644)
            obj.unlink()
    before = _state(v)
    with pytest.raises(VersioningError) as e:
        rollback(v["cfg"], v["v1"])
    assert "in neither the local cache nor remote 'local' (ingested/manifest.json)" in str(e.value)
    assert "data/ was not touched" in str(e.value)
    assert _state(v) == before and current_version(v["cfg"]) == v["v2"]
    assert _bookkeeping(v["root"]) == []


def _interrupted_rollback(v: dict, stage: str) -> None:
    """Leave what a rollback to v1 killed at `stage` leaves: built aside; swapped out;
    swapped in (data.dvc not yet written)."""
    root, data = v["root"], v["data"]
    tmp, old = sibling(data, "tmp-99"), sibling(data, "old-99")
    journal = {"op": "rollback", "version": v["v1"], "tmp": tmp.name, "old": old.name}
    sibling(data, "journal").write_text(json.dumps(journal))
    tmp.mkdir()
    for rel, content in v["tree1"].items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(content)
    if stage in ("swapped out", "swapped in"):
        os.rename(data, old)
    if stage == "swapped in":
        os.rename(tmp, data)
    assert (root / "data.dvc").read_text().count(v["v2"]) == 1


@pytest.mark.parametrize(
    ("stage", "expected"),
    [("built aside", "v2"), ("swapped out", "v2"), ("swapped in", "v1")],
)
def test_a_killed_rollback_is_completed_or_undone_by_the_next_command(
    versions, stage, expected, capsys
):
    v = versions
    tree2 = file_tree(v["data"])
    _interrupted_rollback(v, stage)
    assert main_versions(["--repo-root", str(v["root"])]) == 0  # read-only: says, does not fix
    assert "an interrupted rollback to" in capsys.readouterr().err
    assert sibling(v["data"], "journal").exists()
    snapshot(v["cfg"])  # the next writer finishes the interrupted one first
    assert current_version(v["cfg"]) == v[expected]
    assert file_tree(v["data"]) == (v["tree1"] if expected == "v1" else tree2)
    assert _bookkeeping(v["root"]) == []


def test_a_killed_snapshot_is_undone_by_the_next_command(versions):
    v = versions
    log = v["root"] / "data-versions.jsonl"
    dvc_before, log_before = (v["root"] / "data.dvc").read_text(), log.read_bytes()
    journal = {"op": "snapshot", "dvc_file": dvc_before, "log_size": len(log_before)}
    sibling(v["data"], "journal").write_text(json.dumps(journal))
    (v["root"] / "data.dvc").write_text("outs:\n- md5: 0123")  # cut short by the kill
    with log.open("ab") as f:
        f.write(b'{"version": "half a li')
    sibling(sibling(v["data"], "journal"), "tmp-7-abc").write_text('{"op": "sna')
    assert [e["version"] for e in read_log(v["cfg"])] == [v["v1"], v["v2"]]  # damaged: skipped
    assert rollback(v["cfg"], v["v1"])["version"] == v["v1"]
    assert log.read_bytes() == log_before
    assert current_version(v["cfg"]) == v["v1"] and _bookkeeping(v["root"]) == []


def test_rollback_waits_for_a_writer_inside_data(versions):
    v = versions
    with locked([Lock(v["data"] / "ingested")], timeout_s=1), pytest.raises(LockTimeout):
        rollback(VersioningConfig(repo_root=str(v["root"]), lock_timeout_s=0.2), v["v1"])
    assert current_version(v["cfg"]) == v["v2"]


def test_bookkeeping_files_are_never_versioned(versions):
    v = versions
    (v["root"] / ".dvcignore").read_text().splitlines().index(".*.agentrl-*")
    stale = sibling(v["data"] / "ingested", "lock")  # left by a killed ingest
    stale.write_text("pid 1 on nowhere\n")
    assert snapshot(v["cfg"])["version"] == v["v2"]
    assert not stale.exists()  # taken and released by the snapshot: removed


def test_dvcs_own_lock_file_cut_short_by_a_kill_is_repaired(versions):
    v = versions
    rwlock = v["root"] / ".dvc" / "tmp" / "rwlock"
    rwlock.write_text('{"read": {"da')  # DVC rewrites it in place: a kill can cut it
    assert snapshot(v["cfg"])["version"] == v["v2"]
    assert rollback(v["cfg"], v["v1"])["version"] == v["v1"]
