"""bench/torch_threads.py runs through its command line at a tiny budget (it cannot rot)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_torch_threads_bench_smoke(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "torch_threads.py"), "--steps", "1", "--seq", "16",
         "--hidden", "32", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    assert out.count("| one (pinned) |") == 2 and out.count("| all |") == 2
    assert list(tmp_path.glob("threads-*.md"))
