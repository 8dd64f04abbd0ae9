"""A tool set is one module plus one registry line (docs/tool-sets.md's worked example).

The toy set below is written the way the doc says a new set is: its own tool (schema,
implementation, safety rule side by side), the shared tools it keeps, its own counted
reward term, all in one place; registering it is one entry in `TOOL_SETS` (here through
monkeypatch, so the registry is left as it was). An episode then runs with it end to end:
prompt, calls, the monitor, the reward breakdown and the per-step credit.
"""

import shlex

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, run_episode
from components.env.rewards import COMMON_TERMS, reward_terms
from components.env.rubric import tool_count
from components.env.tool_sets import TOOL_SETS, classify_action, tool_set
from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import Tool, ToolContext, ToolResult, ToolSet, tools_of
from components.policy.chat import system_prompt
from components.sandbox.config import SandboxConfig

# ------------------------------------------------------------------ the plug-in "module"

RUN_TESTS = {
    "description": "Run the task's tests; prints pytest's output, then its exit code.",
    "parameters": {"type": "object", "properties": {}, "required": [],
                   "additionalProperties": False},
}  # fmt: skip
TEST_RUN = tool_count("test_run", default_weight=-0.02)  # no RewardWeights field yet


def run_tests(ctx: ToolContext, arguments: dict) -> ToolResult:
    ctx.counts[TEST_RUN.name] += 1
    return SHARED_TOOLS["run_command"].run(ctx, {"cmd": shlex.join(ctx.task.test_command)})


def run_tests_rule(monitor, arguments: dict) -> None:
    """Nothing of the call to judge (no arguments); the command it runs is the task's."""


TOOL_SET = ToolSet(
    "free_form_tests",
    tools_of(
        Tool(
            "run_tests", RUN_TESTS, run_tests, monitor=run_tests_rule, demo=("Run the tests.", {})
        ),
        *(SHARED_TOOLS[t] for t in ("read_file", "search", "edit_file", "apply_patch", "finish")),
    ),  # fmt: skip
    summary="free-form tools with a no-argument test runner",
    rubric=(TEST_RUN,),
)

# ------------------------------------------------------------------ the test


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(TOOL_SETS, "free_form_tests", TOOL_SET)  # the one registry line


class _Plan:
    name = "toy-plan"

    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, task, events):
        return self.actions.pop(0)


def test_a_registered_set_runs_an_episode(registered, suite_tasks):
    task = suite_tasks[0]
    env = EnvConfig(tool_set="free_form_tests", max_steps=5)
    assert tool_set("free_form_tests") is TOOL_SET
    prompt = system_prompt(True, "free_form_tests")
    assert "run_tests()" in prompt and "run_command" not in prompt
    plan = _Plan([
        Action("run_tests", {}),
        Action("run_command", {"cmd": "python -m pytest -q"}),  # not this set's: invalid
        Action("run_tests", {}),
        Action("finish", {"summary": "looked only"}),
    ])  # fmt: skip
    result = run_episode(task, plan, env, SandboxConfig())
    assert result.status == "ok" and result.end_reason == "finished"
    assert result.ran_tests and result.invalid_calls == 1
    assert tuple(result.reward_terms) == reward_terms("free_form_tests")
    assert tuple(result.reward_terms) == (*COMMON_TERMS, "test_run")
    assert result.reward_terms["test_run"] == pytest.approx(-0.04)
    assert result.reward_terms["invalid_call"] == pytest.approx(-0.1)
    assert result.step_rewards == pytest.approx([-0.02, -0.1, -0.02, 0.0])
    observations = [e for e in result.record["trajectory"] if e.get("role") == "environment"]
    assert "exit code" in observations[0]["observation"]
    assert "unknown tool 'run_command'" in observations[1]["observation"]


def test_a_registered_tools_rule_is_the_monitors(registered):
    assert classify_action("run_tests", {}).allowed
    # Another set's settings and weights stay errors under the new set, as for any set.
    with pytest.raises(ValueError, match="does not read it"):
        EnvConfig(tool_set="free_form_tests", max_fixes=3)
