"""scripts/gpu_check.sh where there is no GPU: what it carries, that it refuses to "pass"
without CUDA, and (slow) its legs end to end at a tiny size on the CPU (ALLOW_CPU=1).

Imports nothing but the standard library and pytest at collection: tests/gpu/run_on_device.sh
collects this folder on a machine without the project's dependencies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _check_module():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gpu_check


def _wheel(path: Path, module: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "VALUE = 7\n")
        archive.writestr(f"{module}-1.0.dist-info/METADATA", "Name: x\n")
    return path


def test_carry_unpacks_absent_pure_python_wheels_only(tmp_path):
    check = _check_module()
    house, site = tmp_path / "house", tmp_path / "site"
    house.mkdir()
    _wheel(house / "agentrl_absent_probe-1.0-py3-none-any.whl", "agentrl_absent_probe")
    _wheel(house / "pytest-0.0-py3-none-any.whl", "pytest")  # present here: not carried
    _wheel(house / "compiled_probe-1.0-cp312-cp312-linux_x86_64.whl", "compiled_probe")
    assert check.carry(house, site) == ["agentrl_absent_probe-1.0-py3-none-any.whl"]
    assert (site / "agentrl_absent_probe" / "__init__.py").is_file()
    assert not (site / "pytest").exists() and not (site / "compiled_probe").exists()
    assert "agentrl_absent_probe" not in check.missing()  # only what the check needs counts


def test_without_cuda_it_stops_instead_of_passing(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "ALLOW_CPU": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no CUDA device" in done.stdout


@pytest.mark.slow
def test_the_legs_run_on_the_cpu_and_say_what_they_skip(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "ALLOW_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    for leg in ("environment", "data", "policy", "sft", "sft_lora", "logprob_agreement", "grpo"):
        assert "seconds" in report[leg] and "peak_memory_gib" in report[leg], leg
    assert report["sft"]["tokens_per_s"] > 0 and report["grpo"]["episodes"] == 2
    assert report["sft_lora"]["trainable_parameters"] < report["sft_lora"]["total_parameters"]
    assert report["logprob_agreement"]["tokens"] > 0
    assert "SKIP vllm:" in done.stdout and "gpu_check passed" in done.stdout
