"""A test stopped by pytest-timeout reads the same whatever the machine's speed (issue
32.2): where the timeout interrupted a loop is cut from every command output, other
failures keep their tracebacks."""

from __future__ import annotations

import subprocess
import sys

from components.env.tool_sets.commands import without_timeout_frames

MODULE = """def spin(n):
    i = 0
    total = 0
    while i < n:
        total += 1
        total -= 1
        total = total * 1
    return total


def wrong(n):
    return n + 1
"""
TESTS = """from m import spin, wrong


def test_spin():
    assert spin(3) == 0


def test_wrong():
    assert wrong(1) == 1
"""


def _pytest(tmp_path, timeout: float) -> str:
    (tmp_path / "m.py").write_text(MODULE)
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_m.py").write_text(TESTS)
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                           f"--timeout={timeout}", "tests"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": ""},
                          check=False)  # fmt: skip
    return proc.stdout


def test_a_timed_out_test_keeps_only_its_timeout_line(tmp_path):
    raw = _pytest(tmp_path, 0.5)
    assert "Failed: Timeout" in raw and "\nm.py:" in raw  # the frame where it was interrupted
    cut = without_timeout_frames(raw)
    spin = cut.split("test_spin", 1)[1].split("test_wrong", 1)[0]
    assert "\nm.py:" not in spin and "while" not in spin and "Failed: Timeout (>0.5s)" in spin
    # The other failure's traceback is untouched.
    assert "assert wrong(1) == 1" in cut and "tests/test_m.py:9: AssertionError" in cut
    assert cut.count("FAILED") == raw.count("FAILED")


def test_the_same_failures_read_the_same_on_each_run(tmp_path):
    from components.env.tool_sets.commands import without_durations

    runs = {without_timeout_frames(without_durations(_pytest(tmp_path, 0.3))) for _ in range(3)}
    assert len(runs) == 1
