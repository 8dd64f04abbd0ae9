"""Entry points through their real command lines, with tiny inputs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"


def test_module_command_line_ingest(tmp_path):
    out = tmp_path / "ingested"
    proc = subprocess.run(
        [sys.executable, "-m", "components.data", "ingest", str(FIXTURES), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["counts"] == {"ingested": 9, "valid": 9, "quarantined": 0}
    assert (out / "manifest.json").is_file()


def test_cli_imports_no_heavy_library():
    """The CLI module must start fast: GX, DVC, pyarrow and pandas load only when used."""
    code = (
        "import sys, components.data.__main__, components.data.validate, "
        "components.data.versioning, components.data.ingest; "
        "print(sorted(m for m in ('great_expectations', 'dvc', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "[]", proc.stderr


def test_benchmark_runs_on_a_tiny_input(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "data_throughput", REPO / "bench" / "data_throughput.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = bench.run(40, tmp_path)
    assert res["trajectories"] == 40 and res["counts"]["ingested"] == 40
    assert res["counts"]["valid"] + res["counts"]["quarantined"] == 40
    assert 0 < res["great_expectations_share"] <= 1
    assert res["ingest_one_process_s"] > 0 and res["ingest_workers"] >= 1


def test_benchmark_writes_its_table(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "data_throughput", REPO / "bench" / "data_throughput.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "table.md"
    assert bench.main(["--n", "30", "--out", str(tmp_path / "w"), "--results", str(out)]) == 0
    assert "| **ingest + validate** |" in out.read_text()
