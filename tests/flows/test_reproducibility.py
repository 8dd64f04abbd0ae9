"""Reproducible runs (slow): a tiny retrain, then `agentrl reproduce` of the version it
registered, once with both cores kept busy by a CPU burner, must come out equal stage by
stage (data version, SFT weights, candidate weights, evaluation outcomes); a data file and
a preset value changed after registration are each detected before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.tiny_pipeline import tiny_preset


@pytest.fixture
def workdir(pipeline_workdir):
    preset = tiny_preset({"mode": "in-process"})
    preset["name"] = "tiny-reproduce"
    (pipeline_workdir / "preset.yaml").write_text(yaml.safe_dump(preset))
    return pipeline_workdir


def burn_cpus(n: int = 2) -> list[subprocess.Popen]:
    """`n` processes that spin until killed: the machine is as busy as it gets."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_registered_version_reproduces_equal_on_a_loaded_machine(workdir, prefect_harness):
    from flows.reproduce import reproduce
    from flows.retrain import retrain

    original = retrain("preset.yaml")
    version = original["promotion"]["version"]
    assert original["fingerprints"]["weights_sha256"]
    burners = burn_cpus()
    try:
        report = reproduce(str(version), preset="preset.yaml")
    finally:
        for p in burners:
            p.kill()
    assert report["verdict"] == "equal", report
    assert Path(report["workdir"]).is_dir()

    # A data file changed after the run: the checkout of the version refuses to drop it.
    manifest = Path("data/validated/manifest.json")
    manifest.write_text(manifest.read_text() + "\n")
    report = reproduce(str(version), preset="preset.yaml")
    assert report["verdict"] == "cannot reproduce"
    assert any(p.startswith("data:") for p in report["problems"]), report
    manifest.write_text(manifest.read_text().removesuffix("\n"))

    changed = yaml.safe_load(Path("preset.yaml").read_text())
    changed["sft"]["learning_rate"] = changed["sft"]["learning_rate"] * 2
    Path("preset.yaml").write_text(yaml.safe_dump(changed))
    report = reproduce(str(version), preset="preset.yaml")
    assert report["verdict"] == "cannot reproduce"
    assert any(p.startswith("preset:") for p in report["problems"])
