"""Per-test limits count CPU time, so load decides no verdict (issue 32).

A loop burns CPU time on any machine: it is still stopped and charged to the code, also
while other processes hog the core. A test that is slow only in wall time (its core shared
with burners) is not charged: it neither burns more CPU time nor waits longer, and a
wait past the limit is re-run before it is judged
(components/sandbox/harness_plugins/agentrl_cpu_timeout.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.rewards import EpisodeFacts, compute_reward
from components.sandbox.config import SandboxConfig
from components.sandbox.environ import HARNESS_PLUGINS
from components.tasks.generate import generate_suite
from components.tasks.patching import apply_unified_diff
from components.tasks.task import load_tasks
from components.verifier.verdict import verify

ENV = EnvConfig(per_test_timeout_s=1.0)
SANDBOX = SandboxConfig()
BURNERS = 3  # on the one core the test runs on: it gets at most a quarter of it


@contextlib.contextmanager
def one_busy_core(n: int = BURNERS):
    """This process and everything it starts on one core, shared with `n` CPU burners."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in burners:
            p.kill()
            p.wait()
        os.sched_setaffinity(0, cpus)


def spin_iterations(cpu_s: float) -> int:
    """Iterations of `for _ in range(n): pass` that take about `cpu_s` of CPU time here."""
    n, t0 = 2_000_000, time.process_time()
    for _ in range(n):
        pass
    return max(1, int(n * cpu_s / max(time.process_time() - t0, 1e-3)))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("load-proof")
    generate_suite(root, 2, seed=11)
    tasks, errors = load_tasks(root)
    assert not errors
    return tasks[0]


def fixed_repo(task, tmp_path: Path, body: str) -> Path:
    """The task's repo with the reference fix and `body` run first in the task's function."""
    import shutil

    repo = tmp_path / "agent"
    shutil.copytree(task.repo_dir, repo)
    apply_unified_diff(repo, task.reference_patch())
    module = repo / task.metadata.extra["module"]
    text = module.read_text()
    head = re.search(r"^def .*:\n", text, re.MULTILINE).group(0)
    module.write_text(text.replace(head, head + body, 1))
    return repo


def test_a_loop_is_charged_to_the_code_on_a_busy_core(task, tmp_path):
    env = EnvConfig(per_test_timeout_s=0.2)  # each looping test costs 0.2 s of CPU time
    repo = fixed_repo(task, tmp_path, "    while True:\n        pass\n")
    with one_busy_core():
        v = verify(task, repo, env, SANDBOX, cache=False)
    assert v.status == "ok" and not v.tests_passed and not v.verdict_lost, v.detail
    assert v.tests_failed == v.tests_total and not v.forged_pass
    assert compute_reward(v, EpisodeFacts(True, ()), env).total == 0.0  # never an infra fault


def test_a_test_slow_only_in_wall_time_on_a_busy_core_is_not_charged(task, tmp_path):
    # The first call (whichever test or case makes it) computes for 0.4 s of CPU time: on
    # a core shared with three burners that is well over the 1 s limit in wall time.
    n = spin_iterations(0.4)
    spin = (f"    if not globals().setdefault('_spun', []):\n"
            f"        _spun.append(1)\n        for _ in range({n}):\n            pass\n")  # fmt: skip
    repo = fixed_repo(task, tmp_path, spin)
    with one_busy_core():
        v = verify(task, repo, ENV, SANDBOX, cache=False)
    assert v.status == "ok" and v.tests_passed and v.limit_hit is None, v.detail
    assert compute_reward(v, EpisodeFacts(True, ()), ENV).total == 1.0


PLUGIN_TESTS = """
import os, time

import pytest

def test_loops():
    while True:
        pass

def test_waits_once():  # the first run waits past its limit (a stalled disk, say)
    if not os.path.exists("waited"):
        open("waited", "w").close()
        time.sleep(30)

def test_always_waits():
    time.sleep(30)

@pytest.mark.timeout(2)
def test_computes_for_a_while():
    for _ in range({n}):
        pass
"""


def run_pytest(folder: Path, plugins: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": plugins,
           "PYTHONPATH": str(HARNESS_PLUGINS)}  # fmt: skip
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "-rA", *args]  # fmt: skip
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_the_plugin_charges_loops_reruns_waits_and_ignores_load(tmp_path):
    # 0.5 s of CPU time (4x under its 2 s limit: the calibration here and the speed of a
    # shared core vary) on a core shared with four burners: at least 2.5 s of wall time.
    (tmp_path / "test_limits.py").write_text(PLUGIN_TESTS.format(n=spin_iterations(0.5)))
    both = "pytest_timeout,agentrl_cpu_timeout"
    with one_busy_core(4):
        # pytest-timeout alone counts the clock: the computing test fails on a busy core.
        wall = run_pytest(tmp_path, "pytest_timeout", "-k", "computes").stdout
        cpu = run_pytest(tmp_path, both, "-k", "computes").stdout
    assert "FAILED test_limits.py::test_computes_for_a_while - Failed: Timeout" in wall, wall
    assert "PASSED test_limits.py::test_computes_for_a_while" in cpu, cpu
    out = run_pytest(tmp_path, both, "--timeout=0.1").stdout
    lines = {
        line.split(" - ")[0] for line in out.splitlines() if line.startswith(("PASSED", "FAILED"))
    }
    assert lines == {
        "FAILED test_limits.py::test_loops", "FAILED test_limits.py::test_always_waits",
        "PASSED test_limits.py::test_waits_once", "PASSED test_limits.py::test_computes_for_a_while",
    }, out  # fmt: skip
    assert "test_loops - Failed: Timeout (>0.1s of CPU time)" in out
    stopped = re.findall(r"^E\s+Failed: (Timeout .*)$", out, re.M)
    # Waiting is judged only after it waited past its limit on every run (0.1, 0.2, 0.4 s).
    assert stopped == [
        "Timeout (>0.1s of CPU time)",
        "Timeout (>0.4s waiting, under 0.1s of CPU time)",
    ]


def test_code_that_ignores_the_cpu_timer_and_loops_still_fails_with_a_limit(task, tmp_path):
    """The attack on the plugin: the code under test ignores SIGPROF inside the test and
    loops. The sandbox's own limits end the run; the control verifies, so the lost
    verdict is the code's failure with the resource-limit penalty, never an infra fault."""
    env = EnvConfig(verify_timeout_s=4, per_test_timeout_s=1)
    body = "    __import__('signal').signal(27, __import__('signal').SIG_IGN)\n    while True:\n        pass\n"
    repo = fixed_repo(task, tmp_path, body)
    v = verify(task, repo, env, SandboxConfig(cpu_time_s=2), cache=False)
    assert v.status == "ok" and not v.tests_passed and v.verdict_lost, v.detail
    # The run's CPU limit (4 s, = verify_timeout_s) or, on a busy machine, its wall limit.
    assert v.limit_hit in ("cpu_time", "wall_time") and not v.forged_pass
    assert compute_reward(v, EpisodeFacts(True, ()), env).terms["resource_limit"] == -0.5
