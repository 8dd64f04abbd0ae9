"""The verification processes' interpreter start on a task environment older than 3.11
(issue 46): Python 3.10 refuses `-P` (exit 2, "Unknown option: -P"), which left every check
of a 3.10 Harbor task without a verdict (the differential cases' reference run). The start
keeps -P where the interpreter has it and drops it where it does not."""

from __future__ import annotations

import subprocess

import pytest

from components.sandbox.config import SandboxConfig
from components.tasks.environments import find_python
from components.verifier.checks import ISOLATED_PYTHON, isolated_python


def _venv(tmp_path, version: str):
    (tmp_path / "pyvenv.cfg").write_text(f"home = /x/bin\nversion = {version}\n")
    return SandboxConfig(python_env=str(tmp_path))


def test_minus_p_stays_for_3_11_and_the_projects_interpreter_and_goes_for_3_10(tmp_path):
    assert isolated_python(SandboxConfig()) == ISOLATED_PYTHON
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert isolated_python(_venv(tmp_path / "a", "3.11.7")) == ISOLATED_PYTHON
    assert isolated_python(_venv(tmp_path / "b", "3.10.13")) == ("python", "-s", "-B")
    assert isolated_python(SandboxConfig(python_env=str(tmp_path / "none"))) == ISOLATED_PYTHON


@pytest.mark.parametrize("version", ["3.10", "3.11"])
def test_each_interpreter_starts_a_script_with_its_flags(tmp_path, version):
    try:
        python = find_python(version)
    except Exception as e:  # noqa: BLE001 - this machine has no such interpreter
        pytest.skip(f"no Python {version} here: {e}")
    env = tmp_path / "env"
    subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True, timeout=300)
    script = tmp_path / "tools" / "runner.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint('ran', sys.version_info[:2])\n")
    flags = isolated_python(SandboxConfig(python_env=str(env)))[1:]
    run = subprocess.run([str(env / "bin" / "python"), *flags, str(script)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith("ran"), run.stderr
