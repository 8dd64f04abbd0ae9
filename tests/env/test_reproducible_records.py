"""An episode's record is a function of the task, the policy and the seed: no wall-clock
time, no run duration, so the same expert episodes give byte-identical training data (and
one data version) however loaded the machine was."""

import json

import pytest

from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.env.tool_sets.commands import without_durations
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy


def test_pytest_durations_are_taken_off_observations():
    out = "..F\nFAILED tests/test_a.py::test_x - assert 1 == 2\n1 failed, 2 passed in 0.31s\n"
    assert without_durations(out).endswith("1 failed, 2 passed\n")
    banner = "==== 3 passed, 1 warning in 61.02s (0:01:01) ===="
    assert without_durations(banner) == "==== 3 passed, 1 warning ===="
    assert without_durations("no tests ran in 0.01s") == "no tests ran"
    kept = "sleep in 2s then retry; passed in review"
    assert without_durations(kept) == kept


@pytest.mark.parametrize("style", ["explore", "fixes"])
def test_the_same_episode_twice_gives_the_same_record(suite_tasks, style):
    """Both the run_command observations and the fix tools' test summaries."""
    task = suite_tasks[0]
    policy = lambda: OraclePolicy(seed=3, style=style, recovery_rate=1.0)  # noqa: E731
    records = [
        run_episode(task, policy(), EnvConfig(), SandboxConfig(), seed=3).record for _ in range(2)
    ]
    assert json.dumps(records[0], sort_keys=True) == json.dumps(records[1], sort_keys=True)
    observations = [e["observation"] for e in records[0]["trajectory"] if "observation" in e]
    assert not any(" in 0." in o for o in observations)
