"""Concurrency and faults with real processes (issue 18), `slow` tier.

- Races: two `agentrl data ingest` into one --out at once, many times. Without --overwrite
  one wins and the other refuses; with it both finish one after the other. Either way the
  dataset is one input's, whole (every file matches the manifest's md5).
- Kills: ingest, snapshot and rollback are SIGKILLed after a random delay (uniform over
  one unkilled run's duration; runs that end first do not count), then the invariants
  are checked: nothing half-published, counts reconcile, data/ and data.dvc agree after
  the next command, every logged version is in the remote.

Counts: AGENTRL_RACE_TRIALS (default 4 per mode) and AGENTRL_KILLS (kills per command,
default 6); the acceptance run used AGENTRL_KILLS=100. Each test prints its tally (-s).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.data.config import VersioningConfig
from components.data.dvc_store import current_version
from components.data.ingest import read_manifest, read_tables
from components.data.version_log import finish_interrupted, read_log, verify
from components.data.writers import MARK
from tests.data.conftest import good

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"
RACE_TRIALS = int(os.environ.get("AGENTRL_RACE_TRIALS", "4"))
KILLS = int(os.environ.get("AGENTRL_KILLS", "6"))
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc")]


def _data(*argv, cwd=REPO) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "components.data", *map(str, argv)],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _inputs(tmp_path: Path, scale: int = 1) -> dict[str, set[str]]:
    """Two inputs of different sizes; {path: the ids it holds}."""
    out = {}
    for name, n in (("a", 120 * scale), ("b", 81 * scale)):
        ids = {f"{name}-{i:04d}" for i in range(n)}
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(good(i)) + "\n" for i in sorted(ids)))
        out[str(path)] = ids
    return out


def _whole_dataset(out: Path, inputs: dict[str, set[str]]) -> str:
    """The dataset is complete and one input's; returns which input."""
    trajs, _ = read_tables(out)  # every file against the manifest's md5
    manifest = read_manifest(out)
    for stats in manifest["sources"].values():
        assert stats["ingested"] == stats["valid"] + stats["quarantined"]
    ids = set(trajs.column("id").to_pylist())
    (source,) = manifest["sources"]
    assert ids == inputs[source], f"{out} mixes inputs"
    return source


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(f".*{MARK}*") if not p.name.endswith("lock"))


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_ingests_into_one_folder_never_mix(tmp_path, overwrite):
    inputs = _inputs(tmp_path)
    tally = {"one refused": 0, "both ran": 0}
    for trial in range(RACE_TRIALS):
        out = tmp_path / f"out-{trial}"
        flags = ["--overwrite"] if overwrite else []
        procs = [_data("ingest", src, "--out", out, *flags) for src in inputs]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        codes = sorted(code for code, _ in results)
        for _, err in results:
            assert "Traceback" not in err, err
        if overwrite:
            assert codes == [0, 0], results
            tally["both ran"] += 1
        else:
            assert codes == [0, 1], results
            assert any("already holds a dataset" in err for _, err in results)
            tally["one refused"] += 1
        _whole_dataset(out, inputs)
        assert _leftovers(tmp_path) == [] and not any(tmp_path.glob(f".out-{trial}{MARK}lock"))
    print(f"\nrace trials (overwrite={overwrite}): {tally}")


def _kill_after(proc: subprocess.Popen, delay: float) -> str:
    """SIGKILL `proc` after `delay` s unless it ended first: "killed" or "finished" (and
    then it must have succeeded)."""
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return "killed"
    assert proc.returncode == 0, proc.stderr.read()
    return "finished"


def _until_killed(tally: dict):
    """Attempt numbers until KILLS processes were killed (a run that ends before its
    delay is not a kill; at most 4 * KILLS attempts)."""
    for k in range(4 * KILLS):
        if tally["killed"] >= KILLS:
            return
        yield k
    pytest.fail(f"only {tally['killed']} of {KILLS} kills landed: {tally}")


def _count_recovery(tally: dict, done: list[str]) -> None:
    """Tally what the next command found to finish or undo (where the kill landed)."""
    for line in done:
        kind = "removed leftovers" if line.startswith("removed") else line.split(" (")[0]
        kind = re.sub(r" to [0-9a-f]{32}", "", kind)
        tally[kind] = tally.get(kind, 0) + 1


def _timed(*argv, cwd=REPO) -> float:
    start = time.monotonic()
    proc = _data(*argv, cwd=cwd)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return time.monotonic() - start


def test_killed_ingests_never_leave_a_half_dataset(tmp_path):
    inputs = _inputs(tmp_path, scale=20)  # big enough that kills land mid-read and mid-write
    sources = list(inputs)
    out = tmp_path / "out"
    duration = _timed("ingest", sources[0], "--out", out)
    rng = random.Random(18)
    tally = {"killed": 0, "finished": 0, "mid-write": 0, "found old": 0, "found new": 0,
             "found aside": 0}  # fmt: skip
    for k in _until_killed(tally):
        expected = sources[(k + 1) % 2]
        proc = _data("ingest", expected, "--out", out, "--overwrite")
        tally[_kill_after(proc, rng.uniform(0, duration))] += 1
        tally["mid-write"] += any(tmp_path.glob(f".out{MARK}tmp-*"))
        if out.exists():
            tally["found new" if _whole_dataset(out, inputs) == expected else "found old"] += 1
        else:  # killed between the two renames: the old dataset is whole, aside
            (aside,) = tmp_path.glob(f".out{MARK}old-*")
            _whole_dataset(aside, inputs)
            tally["found aside"] += 1
    assert _timed("ingest", sources[0], "--out", out, "--overwrite") > 0  # recovers first
    assert _whole_dataset(out, inputs) == sources[0] and _leftovers(tmp_path) == []
    print(f"\ningest kills: {tally}")


def _repo(tmp_path: Path) -> tuple[Path, VersioningConfig]:
    """A git repo whose data/ holds the fixtures and a bigger dataset (so that kills land
    while DVC hashes and copies, not only at start-up)."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (big,) = [p for p in _inputs(tmp_path, scale=20) if p.endswith("a.jsonl")]
    assert _timed("ingest", big, "--out", root / "data" / "big") > 0
    assert _timed("ingest", FIXTURES, "--out", root / "data" / "ingested") > 0
    return root, VersioningConfig(repo_root=str(root))


def _objects_in_remote(root: Path, entry: dict) -> bool:
    remote = root / ".dvc-remote" / "files" / "md5"
    oids = [entry["version"] + ".dir", *entry["files"].values()]
    return all((remote / oid[:2] / oid[2:]).is_file() for oid in oids)


def _agree(root: Path, cfg: VersioningConfig) -> str:
    """data.dvc names a logged version and data/ holds exactly its bytes; its id."""
    version = current_version(cfg)
    entry = next(e for e in read_log(cfg) if e["version"] == version)
    assert verify(root / "data", entry["files"]) == []
    return version


def test_killed_snapshots_are_undone_or_complete(tmp_path):
    root, cfg = _repo(tmp_path)
    data = root / "data"
    duration = _timed("snapshot", "--repo-root", root)
    rng = random.Random(18)
    tally = {"killed": 0, "finished": 0, "undone": 0, "completed": 0}
    for k in _until_killed(tally):
        (data / f"notes-{k}.txt").write_text(f"change {k}\n")  # a new version to take
        before_tree = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
        before_version = current_version(cfg)
        proc = _data("snapshot", "--repo-root", root)
        tally[_kill_after(proc, rng.uniform(0, duration))] += 1
        _count_recovery(tally, finish_interrupted(cfg))
        assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before_tree
        assert _leftovers(root) == []
        now = current_version(cfg)
        if now == before_version:
            tally["undone"] += 1
        else:
            assert _agree(root, cfg) == now
            tally["completed"] += 1
        assert all(_objects_in_remote(root, e) for e in read_log(cfg))
    assert _timed("snapshot", "--repo-root", root) > 0
    _agree(root, cfg)
    print(f"\nsnapshot kills: {tally}")


def test_killed_rollbacks_are_undone_or_complete(tmp_path):
    root, cfg = _repo(tmp_path)
    data = root / "data"
    assert _timed("snapshot", "--repo-root", root) > 0
    assert _timed("ingest", FIXTURES / "mission.jsonl", "--out", data / "ingested", "--overwrite")
    assert _timed("snapshot", "--repo-root", root) > 0
    versions = [e["version"] for e in read_log(cfg)]
    trees = {}
    for v in versions:
        assert _timed("rollback", v, "--repo-root", root) > 0
        trees[v] = {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()}
    duration = _timed("rollback", versions[0], "--repo-root", root)
    rng = random.Random(18)
    tally = {"killed": 0, "finished": 0, "undone": 0, "completed": 0}
    for k in _until_killed(tally):
        before, target = current_version(cfg), versions[k % 2]
        if k % 5 == 4:  # now and then the objects must come from the remote
            shutil.rmtree(root / ".dvc" / "cache", ignore_errors=True)
        proc = _data("rollback", target, "--repo-root", root)
        tally[_kill_after(proc, rng.uniform(0, duration))] += 1
        _count_recovery(tally, finish_interrupted(cfg))
        assert _leftovers(root) == []
        now = _agree(root, cfg)
        assert now in (before, target)
        assert {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()} == (
            trees[now]
        )
        tally["completed" if now == target != before else "undone"] += 1
    print(f"\nrollback kills: {tally}")
