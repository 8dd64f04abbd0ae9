"""bench/env_service.py through its command line with a tiny budget (smoke)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # starts two servers and verifies a dozen episodes
def test_env_service_bench_prints_every_comparison():
    out = subprocess.run(
        [sys.executable, "bench/env_service.py", "--tasks", "1", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for line in (
        "in-process, 1 at a time",
        "server 2 workers, 2 at a time",
        "service overhead ratio",
        "step p50 ratio",
        "2 workers / 1 worker",
    ):
        assert line in out.stdout, out.stdout
    assert "(1/1 success)" in out.stdout
