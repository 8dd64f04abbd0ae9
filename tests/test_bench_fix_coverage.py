"""bench/fix_coverage.py smoke run at a tiny budget through its command line: the table
has every suite and listing, and the new listing holds the fix wherever the old one does
on these tasks."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fix_coverage_smoke(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fix_coverage.py"), "--n-tasks", "12",
         "--no-localise", "--out", str(tmp_path), "--name", "smoke"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "smoke.md").read_text()
    assert "| QuixBugs (6 programs) | grammar | 6 |" in report
    summary = json.loads((tmp_path / "smoke.json").read_text())["summary"]
    suites = {s["suite"] for s in summary}
    assert {"generated train", "QuixBugs (6 programs)"} <= suites
    assert {s["listing"] for s in summary} == {"operators", "grammar", "grammar, uncut"}
    for s in summary:
        assert 0 <= s["coverage"] <= 1
        assert s["size_p90"] <= 64 or s["listing"] == "grammar, uncut"
    by = {(s["suite"], s["listing"]): s for s in summary}
    for suite in suites:  # the cut listing is a part of the whole neighbourhood
        assert by[suite, "grammar, uncut"]["covered"] >= by[suite, "grammar"]["covered"]
    quix = {s["listing"]: s["covered"] for s in summary if s["suite"].startswith("QuixBugs")}
    assert quix["grammar"] >= quix["operators"]


def test_localisation_output_comes_from_the_sandboxed_tests():
    """The localised listing reads the visible tests' output on the buggy code, run in the
    sandbox (imported benchmark code never runs on the host)."""
    import importlib.util

    from components.tasks.task import load_tasks

    spec = importlib.util.spec_from_file_location("fix_coverage", ROOT / "bench/fix_coverage.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tasks, _ = load_tasks(ROOT / "tests/fixtures/external_quixbugs")
    gcd = next(t for t in tasks if "gcd" in t.id)
    output = bench.test_output(gcd)
    assert "failed" in output and "gcd" in output
