"""The sandbox finds its interpreter when the checkout (and so the venv) lives under /tmp:
the private /tmp it mounts must not hide it (a fresh clone in a temporary folder, as CI's
may be, once got exit code 127 for every command)."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import isolation_report

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    isolation_report(SandboxConfig()).get("mode") != "bwrap", reason="needs bubblewrap"
)
def test_a_venv_under_tmp_is_visible_inside_the_sandbox(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = (
        "from pathlib import Path\n"
        "from components.sandbox.config import SandboxConfig\n"
        "from components.sandbox.process import run_sandboxed\n"
        "ws = Path(__import__('tempfile').mkdtemp())\n"
        "r = run_sandboxed(['python', '-c', 'print(6 * 7)'], ws, SandboxConfig(), workspace=ws)\n"
        "print(r.exit_code, r.output.strip())\n"
    )
    site = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), site])}
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    assert out.split() == ["0", "42"], out
