"""bench/timing_margin.py runs through its command line at a tiny budget (it cannot rot)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_timing_margin_bench_smoke():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "timing_margin.py"), "--tasks", "2", "--burners", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert "command wall limit" in out and out.count("x\n") == 3
