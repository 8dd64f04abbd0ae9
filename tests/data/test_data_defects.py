"""Six data-path defects found by an adversarial round (issue 32), one test each: a damaged
data.dvc is reported and repaired from the version log; rollback keeps what it did not
write; a boolean is not a timestamp; a validate that fails on a full disk leaves nothing
half-written and names the path; version counts cover every dataset a version holds; a
corrupted object in the remote is not reported as a missing one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.data.__main__ import main, main_versions
from components.data.config import IngestConfig, ValidationConfig
from components.data.dvc_store import VersioningError, current_version
from components.data.ingest import ingest, read_quarantine
from components.data.validate import validate_dataset
from components.data.version_log import read_log
from components.data.versioning import rollback, snapshot
from tests.data.test_rollback_safety import _state
from tests.data.trees import file_tree

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "data"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc")


def test_a_damaged_data_dvc_is_reported_and_repaired_from_the_version_log(versions, capsys):
    v, dvc_file = versions, versions["root"] / "data.dvc"
    good = dvc_file.read_text()
    dvc_file.write_text("outs: [garbage\n")
    root = ["--repo-root", str(v["root"])]
    assert main_versions(root) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.dvc is damaged" in err[0] and "agentrl data repair" in err[0]
    with pytest.raises(VersioningError, match="agentrl data repair"):
        snapshot(v["cfg"])
    with pytest.raises(VersioningError, match="agentrl data repair"):
        rollback(v["cfg"], v["v1"])
    assert main(["repair", *root]) == 0  # data/ is byte-identical to v2: data.dvc rebuilt
    assert json.loads(capsys.readouterr().out)["version"] == v["v2"]
    assert dvc_file.read_text() == good and main_versions(root) == 0
    assert rollback(v["cfg"], v["v1"])["version"] == v["v1"]

    # data/ that matches no version: nothing is written, the line says what to do.
    dvc_file.write_text("outs:\n- garbage\n")
    (v["data"] / "notes.txt").write_text("new\n")
    assert main(["repair", *root]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matches no version" in err[0]
    assert dvc_file.read_text() == "outs:\n- garbage\n"


def test_rollback_never_deletes_a_file_it_did_not_write(versions):
    v, data = versions, versions["data"]
    notes = data / ".notes.agentrl-x"  # looks like the tool's bookkeeping; is the user's
    notes.write_text("my notes\n")
    inner = data / "ingested" / ".scratch.agentrl-tmp-1-abcdef"
    inner.mkdir()
    (inner / "half.txt").write_text("a folder named like a leftover\n")
    result = rollback(v["cfg"], v["v1"])
    assert result["version"] == v["v1"]
    assert notes.read_text() == "my notes\n"
    assert (inner / "half.txt").read_text() == "a folder named like a leftover\n"
    assert sorted(result["kept"]) == [".notes.agentrl-x", "ingested/.scratch.agentrl-tmp-1-abcdef"]
    assert {k: b for k, b in file_tree(data).items() if ".agentrl-" not in k} == v["tree1"]
    assert rollback(v["cfg"], v["v2"])["version"] == v["v2"] and notes.is_file()


def test_a_boolean_is_not_a_timestamp(tmp_path):
    record = json.loads((FIXTURES / "openai_chat.jsonl").read_text().splitlines()[0])
    record["created"] = True
    src = tmp_path / "chat.jsonl"
    src.write_text(json.dumps(record) + "\n")
    result = ingest([str(src)], IngestConfig(out_dir=str(tmp_path / "ingested")))
    assert result.counts == {"ingested": 1, "valid": 0, "quarantined": 1}
    (entry,) = read_quarantine(tmp_path / "ingested")
    assert any("field created" in r and "bool" in r for r in entry["reasons"]), entry["reasons"]


def _validate_cfg(tmp: Path, report_dir: Path) -> ValidationConfig:
    return ValidationConfig(
        in_dir=str(tmp / "ingested"), out_dir=str(tmp / "validated"), report_dir=str(report_dir)
    )


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare to mount a tmpfs")
def test_a_validate_on_a_full_disk_leaves_nothing_half_written_and_names_the_path(tmp_path):
    ingest([str(FIXTURES)], IngestConfig(out_dir=str(tmp_path / "ingested")))
    disk = tmp_path / "disk"
    disk.mkdir()
    report_dir = disk / "reports"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.strip()}")
    # A 64 KiB disk: GX's context and data docs do not fit. A private mount namespace, so
    # nothing outside this command sees the mount.
    cmd = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} && "
        f"{sys.executable} -m components.data validate --in {tmp_path / 'ingested'} "
        f"--out {tmp_path / 'validated'} --report-dir {report_dir}; rc=$?; "
        f"find {disk} -mindepth 1 | sort; exit $rc"
    )
    run = subprocess.run(
        ["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    err = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and str(report_dir) in err[0] and "No space left" in err[0], run.stderr
    assert run.stdout.strip() == ""  # the tmpfs holds nothing: no half report folder
    assert not (tmp_path / "validated").exists()
    # On a disk with room the same command works and publishes the whole report.
    report = validate_dataset(_validate_cfg(tmp_path, tmp_path / "reports"))
    assert (tmp_path / "reports" / "report.json").is_file() and report["data_docs"]
    assert Path(report["data_docs"]).is_file()


def test_version_counts_cover_every_dataset_the_version_holds(versions, capsys):
    v, data = versions, versions["data"]
    validate_dataset(_validate_cfg(data, v["root"] / "reports"))
    ingest([str(FIXTURES / "openai_chat.jsonl")], IngestConfig(out_dir=str(data / "other")))
    entry = snapshot(v["cfg"])
    validated = entry["datasets"]["validated"]["counts"]
    other = entry["datasets"]["other"]["counts"]
    assert main_versions(["--repo-root", str(v["root"])]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    header_valid, header_quarantined, header_unvalidated = 3, 4, 5
    assert row[0] == entry["version"]
    assert int(row[header_valid]) == validated["valid"]
    assert int(row[header_quarantined]) == validated["quarantined"] + other["quarantined"]
    assert int(row[header_unvalidated]) == other["valid"] > 0  # data/other was never validated


@pytest.mark.parametrize("mode", [0o444, 0o644], ids=["read-only", "writable"])
def test_a_corrupted_object_in_the_remote_is_not_called_missing(versions, mode):
    v = versions
    entry = next(e for e in read_log(v["cfg"]) if e["version"] == v["v1"])
    oid = entry["files"]["ingested/manifest.json"]
    for obj in (v["root"] / ".dvc" / "cache").rglob(oid[2:]):
        obj.chmod(0o644)
        obj.unlink()
    (remote_obj,) = (v["root"] / ".dvc-remote").rglob(oid[2:])
    remote_obj.chmod(0o644)
    remote_obj.write_bytes(b"bit rot\n")
    remote_obj.chmod(mode)  # DVC trusts a read-only object without hashing it
    before = _state(v)
    with pytest.raises(VersioningError) as e:
        rollback(v["cfg"], v["v1"])
    msg = str(e.value)
    assert "corrupted in remote 'local'" in msg and "ingested/manifest.json" in msg, msg
    assert "in neither" not in msg and "data/ was not touched" in msg
    assert _state(v) == before and current_version(v["cfg"]) == v["v2"]
    assert remote_obj.read_bytes() == b"bit rot\n"  # the evidence stays where it was
