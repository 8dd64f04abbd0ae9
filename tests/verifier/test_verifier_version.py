"""The verifier version: a change to any file it names changes it, a change elsewhere
does not, and every artefact that holds a verdict records it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from components.verifier.version import (
    PACKAGE_ROOT,
    VERIFIER_SOURCES,
    compute_verifier_version,
    verifier_version,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the verifier's sources and one unrelated module."""
    for rel in (*VERIFIER_SOURCES, "components/scripted/reference.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE_ROOT / rel, tmp_path / rel)
    return tmp_path


def test_the_copy_hashes_like_the_checkout(tree):
    assert compute_verifier_version(tree) == verifier_version()
    assert verifier_version().startswith("vv-") and len(verifier_version()) == 19


@pytest.mark.parametrize("rel", VERIFIER_SOURCES)
def test_a_change_to_any_verifier_source_changes_the_version(tree, rel):
    before = compute_verifier_version(tree)
    with (tree / rel).open("a") as f:
        f.write("\n# a new rule\n")
    assert compute_verifier_version(tree) != before


def test_a_change_elsewhere_does_not(tree):
    before = compute_verifier_version(tree)
    with (tree / "components/scripted/reference.py").open("a") as f:
        f.write("\n# a policy change\n")
    (tree / "components/env/new_tool.py").write_text("x = 1\n")
    assert compute_verifier_version(tree) == before


def test_a_missing_source_is_an_error(tree):
    (tree / VERIFIER_SOURCES[0]).unlink()
    with pytest.raises(FileNotFoundError):
        compute_verifier_version(tree)


def test_an_episode_and_its_results_record_the_version(suite_tasks, tmp_path):
    import json

    from components.env.batch_eval import write_results
    from components.env.config import EnvConfig
    from components.env.episode import run_episode
    from components.sandbox.config import SandboxConfig
    from components.scripted.reference import OraclePolicy

    r = run_episode(suite_tasks[0], OraclePolicy(), EnvConfig(), SandboxConfig())
    assert r.verifier_version == verifier_version()
    assert r.record["metadata"]["verifier_version"] == verifier_version()
    write_results(tmp_path / "results.json", [r], None)
    assert json.loads((tmp_path / "results.json").read_text())["verifier_version"] == (
        verifier_version()
    )
