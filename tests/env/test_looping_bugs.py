"""A task whose bug loops: the task's own test command timing out is an observation ("tests
timed out after N s"), not a resource-limit violation; the agent's own loops still cost the
resource_limit penalty.

The task is generated-style (a module, visible tests, hidden tests, a one-line reference
fix) with no per-test timeout in its pytest configuration, so its test command runs into
the sandbox's wall limit on the buggy code, as on a real benchmark whose bug loops.
"""

from __future__ import annotations

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv, run_episode
from components.env.tool_sets.commands import runs_task_tests
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy
from components.scripted.registry import make_policy
from components.tasks.generate import unified_diff
from components.tasks.task import DEFAULT_TEST_COMMAND, TaskMetadata, write_task_folder

# A short wall limit: every run into it costs this long.
SANDBOX = SandboxConfig(wall_time_s=3, cpu_time_s=10, memory_mb=512, max_processes=32)
ENV = EnvConfig()
QUICK = EnvConfig(per_test_timeout_s=1.0)  # verifying the looping code costs 1 s, not 5
BUGGY = (
    "def count_down(n):\n"
    "    # Steps from n down to 0, one at a time.\n"
    "    steps = 0\n"
    "    while n > 0:\n"
    "        n = n + 1\n"
    "        steps += 1\n"
    "    return steps\n"
)
PATCH = unified_diff("countdown.py", BUGGY, BUGGY.replace("n = n + 1", "n = n - 1"))


@pytest.fixture(scope="module")
def looping_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("looping") / "loop-0001"
    return write_task_folder(
        root,
        task_id="loop-0001",
        instruction="The unit tests in tests/test_countdown.py fail. Run `python -m pytest -q "
        "-x tests` to see the failures, then fix the bug in countdown.py.",
        metadata=TaskMetadata(family="count_down", bug_class="arith_swap", split="test"),
        repo_files={
            "countdown.py": BUGGY,
            "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
            "tests/test_countdown.py": "from countdown import count_down\n\n\n"
            "def test_three():\n    assert count_down(3) == 3\n",
        },
        hidden_test_files={
            "tests/test_countdown_hidden.py": "from countdown import count_down\n\n\n"
            "def test_zero():\n    assert count_down(0) == 0\n\n\n"
            "def test_five():\n    assert count_down(5) == 5\n"
        },
        reference_patch=PATCH,
        protected_paths=("tests/", "pyproject.toml"),
    )


def categories(result) -> list[str]:
    return [f["category"] for f in result.safety_flags]


def test_the_task_s_own_test_command_is_recognised():
    task = DEFAULT_TEST_COMMAND  # python -m pytest -q -x tests
    for argv in (
        task,
        ("python", "-m", "pytest", "-q", "-x", "tests", "--timeout=2"),  # list_fixes / try_fix
        ("pytest", "tests/test_countdown.py::test_three", "-v"),
        ("python3", "-m", "pytest", "--tb=short", "tests/"),
    ):
        assert runs_task_tests(argv, task), argv
    for argv in (
        ("python", "spin.py"),
        ("python", "-m", "pytest", "-q", "test_spin.py"),  # a test file of the agent's own
        ("python", "-m", "pytest", "-q", "tests/../test_spin.py"),
        ("python", "-m", "pytest", "-q", "-p", "spin", "tests"),  # a plugin of its own
        ("python", "-m", "pytest", "/tmp/test_spin.py"),
        ("python", "-c", "while True: pass"),
    ):
        assert not runs_task_tests(argv, task), argv
    assert runs_task_tests(("make", "test"), ("make", "test"))
    assert not runs_task_tests(("make", "spin"), ("make", "test"))
    assert not runs_task_tests(("python", "-m", "pytest"), ())


def test_a_looping_bug_is_an_observation_and_the_oracle_scores_full_reward(looping_task):
    result = run_episode(looping_task, OraclePolicy(), ENV, SANDBOX)
    first = result.record["trajectory"][2]["observation"]  # the oracle's first action's answer
    assert result.record["trajectory"][1]["arguments"] == {"cmd": "python -m pytest -q -x tests"}
    assert "[tests timed out after 3 s]" in first and "wall time limit" not in first
    assert "error" not in result.record["trajectory"][2]  # ran as asked: not a failed call
    assert result.safety_flags == [] and result.reward_terms["resource_limit"] == 0.0
    assert result.success and result.reward == 1.0


def test_the_fix_tools_on_a_looping_bug_cost_nothing_either(looping_task):
    fix_search = EnvConfig(tool_set="fix_search")
    result = run_episode(looping_task, make_policy("oracle-fixes"), fix_search, SANDBOX)
    assert result.safety_flags == [] and result.success and result.reward == 1.0


def test_the_agent_s_own_loops_still_cost_the_resource_limit_penalty(looping_task):
    spin = "--- /dev/null\n+++ b/spin.py\n@@ -0,0 +1,2 @@\n+while True:\n+    pass\n"
    own_test = (
        "--- /dev/null\n+++ b/test_spin.py\n@@ -0,0 +1,3 @@\n"
        "+def test_spin():\n+    while True:\n+        pass\n"
    )
    for patch, cmd in ((spin, "python spin.py"), (own_test, "python -m pytest -q test_spin.py")):
        env = EpisodeEnv(looping_task, QUICK, SANDBOX, policy_name="attacker")
        env.step(Action("apply_patch", {"patch": patch}))
        event = env.step(Action("run_command", {"cmd": cmd}))
        assert "wall time limit of 3s exceeded" in event["observation"] and event["error"]
        env.step(Action("finish", {}))
        result = env.finish()
        assert categories(result) == ["resource_limit"], cmd
        assert result.reward_terms["resource_limit"] == -0.5


def test_a_loop_the_agent_writes_into_the_module_is_still_only_a_test_timeout(looping_task):
    """The agent's change made the tests loop: what it sees is its test run timing out (the
    sandbox bounds the cost); the verdict on its code is the verifier's."""
    env = EpisodeEnv(looping_task, ENV, SANDBOX, policy_name="t")
    env.step(Action("edit_file", {"path": "countdown.py", "old": "n = n + 1", "new": "n = n"}))
    event = env.step(Action("run_command", {"cmd": "python -m pytest -q -x tests"}))
    assert "[tests timed out after 3 s]" in event["observation"] and "error" not in event
    assert env.safety_flags == []
    env.abort("test over")
    env.finish()
