"""Shared helpers for the data-layer tests: fixture paths and small record builders."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

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
