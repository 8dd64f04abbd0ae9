"""Shared helpers for the data-layer tests: fixture paths and small record builders."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from components.data.config import IngestConfig, VersioningConfig
from components.data.ingest import ingest
from components.data.versioning import snapshot
from tests.data.trees import file_tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"

GOOD = {
    "schema_version": 1,
    "id": "good-0001",
    "task_id": "train-0001",
    "source": "oracle",
    "task": "Fix clamp() so tests/test_core.py passes.",
    "trajectory": [
        {"role": "user", "content": "Fix clamp() so tests/test_core.py passes."},
        {"role": "assistant", "action": "run_command", "arguments": {"cmd": "python -m pytest -q"}},
        {"role": "environment", "observation": "1 failed, 3 passed", "truncated": False},
        {"role": "assistant", "action": "finish", "arguments": {"summary": "done"}},
        {"role": "environment", "observation": "episode finished", "truncated": False},
    ],
    "reward": 1.0,
    "reward_terms": {"tests_pass": 1.0, "lint": 0.0},
    "metadata": {"policy": "oracle", "created_at": "2026-11-30T12:00:00Z", "split": "train"},
}


def good(record_id: str, **changes) -> dict:
    """A valid canonical record with a given id, top-level fields replaced by `changes`."""
    rec = copy.deepcopy(GOOD)
    rec["id"] = record_id
    rec.update(changes)
    return rec


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def make_record():
    """good(record_id, **changes): a valid canonical record (see GOOD)."""
    return good


@pytest.fixture
def versions(tmp_path):
    """A git repo with two data versions, v1 (all fixtures) and v2 (mission only, current)."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    cfg = VersioningConfig(repo_root=str(root), lock_timeout_s=5)
    data = root / "data"
    ingest([str(FIXTURES)], IngestConfig(out_dir=str(data / "ingested")))
    v1 = snapshot(cfg)["version"]
    tree1 = file_tree(data)
    ingest([str(FIXTURES / "mission.jsonl")], IngestConfig(out_dir=str(data / "ingested")),
           overwrite=True)  # fmt: skip
    v2 = snapshot(cfg)["version"]
    return {"cfg": cfg, "root": root, "data": data, "v1": v1, "v2": v2, "tree1": tree1}
