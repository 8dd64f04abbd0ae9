"""Reproducible runs (slow): a tiny retrain on a quiet machine, then `agentrl reproduce` of
the version it registered on one core (the process pinned to CPU 0, as `taskset -c 0`
does) and on two cores kept busy by CPU burners, must come out equal stage by stage (data
version, SFT weights, candidate weights, evaluation outcomes): the same candidate whatever
the core count and load; a data file and a preset value changed after registration are
each detected before anything runs."""

from __future__ import annotations

import os
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


def on_one_core(run):
    """`run()` with this process and everything it starts on CPU 0 only."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        return run()
    finally:
        os.sched_setaffinity(0, cpus)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_registered_version_reproduces_equal_on_one_core_and_loaded(workdir, prefect_harness):
    from flows.reproduce import reproduce
    from flows.retrain import retrain

    original = retrain("preset.yaml")  # quiet, every core
    version = original["promotion"]["version"]
    assert original["fingerprints"]["weights_sha256"]
    report = on_one_core(lambda: reproduce(str(version), preset="preset.yaml"))
    assert report["verdict"] == "equal", report
    Path(report["workdir"]).rename(report["workdir"] + "-one-core")  # the next one's folder
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
