"""bench/env_throughput.py through its command line with a tiny budget (smoke)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_env_throughput_prints_every_comparison():
    out = subprocess.run(
        [sys.executable, "bench/env_throughput.py", "--tasks", "2", "--repeats", "2",
         "--group", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("workers=2", "sandbox overhead ratio", "verification, plain",
                 "verification, hardened", "verification overhead ratio", "cache hit rate"):  # fmt: skip
        assert line in out.stdout, out.stdout
    assert "(2/2 success)" in out.stdout


def test_env_throughput_vs_a_revision_prints_before_and_after(tmp_path):
    """--vs: the code at a revision (here HEAD) against the checkout, side by side."""
    out = subprocess.run(
        [sys.executable, "bench/env_throughput.py", "--vs", "HEAD", "--tasks", "1",
         "--rounds", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "before (HEAD)" in out.stdout and "after/before:" in out.stdout, out.stdout
    (written,) = tmp_path.glob("env-throughput-vs-*.md")
    assert "| after (" in written.read_text()
