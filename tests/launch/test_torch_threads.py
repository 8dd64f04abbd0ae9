"""Every stage runs with the preset's intra-op thread count, not the machine's (issue
32.2): in-process the launcher sets torch's, a child process or Job gets it through
OMP_NUM_THREADS / MKL_NUM_THREADS, which torch reads at start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from components.launch.config import LauncherConfig, stage_environment
from components.launch.launcher import run_stage


def test_the_thread_count_is_validated_and_reaches_every_mode():
    with pytest.raises(ValueError, match="torch_threads"):
        LauncherConfig(torch_threads=-1)
    assert stage_environment(LauncherConfig(torch_threads=3, env={"A": "1"})) == {
        "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "AGENTRL_TORCH_THREADS": "3",
        "A": "1"}  # fmt: skip
    assert stage_environment(LauncherConfig(torch_threads=0)) == {}  # torch's own default
    # More threads than this machine has cores (2 here, 1 under taskset): still the preset's.
    code = 'import torch; from components.cli import main; main(["--help"]); ' + (
        "print('threads', torch.get_num_threads())"
    )
    env = {**os.environ, **stage_environment(LauncherConfig(torch_threads=5))}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)  # fmt: skip
    assert child.stdout.splitlines()[-1] == "threads 5"


def test_an_in_process_stage_runs_with_the_preset_threads():
    import torch

    before = torch.get_num_threads()
    try:
        run_stage("help", ["demo", "--help"], LauncherConfig(torch_threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
