"""Reproducible runs (slow): a tiny retrain (configs/cpu-demo.yaml shrunk, every stage)
while CPU burners keep both cores busy, then `agentrl reproduce` of the version it
registered on one core (the process pinned to CPU 0, as `taskset -c 0` does) without
burners, on two cores without burners, and on two cores with burners again: each must come
out equal stage by stage (data version, SFT weights, candidate weights, evaluation
outcomes), and the quiet and the loaded reproduction must agree with each other, so the
same candidate comes out whichever of two runs was loaded and whatever the core count. A
data file and a preset value changed after registration are each detected before anything
runs.

"Quiet" is relative on a shared machine: no burners of the test's own, other processes as
they come (the report of a run says what load it had)."""

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
    # GRPO with a few episodes that get to call the fix tools: what made GRPO sample
    # differently (issue 32) lies in its episodes, not in the stages around it.
    preset["grpo"].update(tasks_per_iteration=2, group_size=4)
    preset["env"]["max_steps"] = 4
    preset["rollout"].update(max_new_tokens=48)
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


def reproduced(report: dict) -> dict:
    return {row["key"]: row["reproduced"] for row in report["stages"]}


def reproduce_into(version, suffix: str, run) -> dict:
    """`run()` (a reproduction) must be equal at every stage; its folder is kept aside."""
    report = run()
    assert report["verdict"] == "equal", report
    Path(report["workdir"]).rename(report["workdir"] + suffix)  # the next one's folder
    return report


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_a_registered_version_reproduces_equal_on_one_core_and_loaded(workdir, prefect_harness):
    from flows.reproduce import reproduce
    from flows.retrain import retrain

    def again():
        return reproduce(str(version), preset="preset.yaml")

    burners = burn_cpus()
    try:
        original = retrain("preset.yaml")  # loaded, two cores
    finally:
        for p in burners:
            p.kill()
            p.wait()
    version = original["promotion"]["version"]
    candidate = original["fingerprints"]["weights_sha256"]
    assert candidate
    one_core = reproduce_into(version, "-one-core", lambda: on_one_core(again))  # quiet
    quiet = reproduce_into(version, "-quiet", again)  # quiet, two cores
    burners = burn_cpus()
    try:
        report = again()  # loaded, two cores
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert report["verdict"] == "equal", report
    assert Path(report["workdir"]).is_dir()
    # The quiet reproduction as the original of the loaded one: equal, the other way round.
    assert reproduced(quiet) == reproduced(report) == reproduced(one_core)
    assert {reproduced(r)["weights_sha256"] for r in (one_core, quiet, report)} == {candidate}

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
