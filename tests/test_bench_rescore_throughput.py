"""bench/rescore_throughput.py through its command line with a tiny budget (smoke)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rescore_throughput_prints_rescore_beside_the_original_verification(tmp_path):
    out = subprocess.run(
        [sys.executable, "bench/rescore_throughput.py", "--tasks", "1", "--group", "2",
         "--workers", "2", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("original verification (inline, cache)", "rescore, 1 worker, no cache",
                 "rescore, 2 workers, cache", "vs original verification"):  # fmt: skip
        assert line in out.stdout, out.stdout
    (written,) = tmp_path.glob("rescore-throughput-*.md")
    rows = [r for r in written.read_text().splitlines() if r.startswith("| rescore")]
    assert len(rows) == 3
    # the same verifier reproduces every stored verdict: no flip, none without a verdict
    assert all(r.rstrip(" |").endswith("| 0 | 0") for r in rows), rows
