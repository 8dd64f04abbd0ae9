"""Tool sets: an environment's tools, prompt, reward terms and decoding constraint, per set.

For each shipped set: the system prompt an episode renders lists exactly its tools, the
reward breakdown has exactly the common terms plus its own, a tool of another set is an
invalid call, and a setting only another set reads is a configuration error.
"""

from __future__ import annotations

import pytest

from components.env.config import EnvConfig, RewardWeights
from components.env.episode import Action, EpisodeEnv
from components.env.rewards import COMMON_TERMS, reward_terms
from components.env.tool_sets import DEFAULT_TOOL_SET, TOOL_NAMES, TOOL_SETS, TOOL_SPECS, tool_set
from components.policy.chat import render_messages, system_prompt
from components.sandbox.config import SandboxConfig

SETS = list(TOOL_SETS)


def test_every_declared_set_has_implementations_of_exactly_its_tools():
    assert set(TOOL_SETS) == {"free_form", "fix_search", "line_edit"}
    for name, spec in TOOL_SETS.items():
        assert tool_set(name) is spec and spec.name == name
        assert list(spec.tools) == list(spec.specs)
        assert "finish" in spec.tools  # an episode must be able to end
    # The data layer checks logged calls against TOOL_NAMES: every set's tools are in it.
    assert {t for spec in TOOL_SETS.values() for t in spec.tools} == set(TOOL_NAMES)
    assert DEFAULT_TOOL_SET == "free_form" == EnvConfig().tool_set
    assert tool_set("free_form").constraint is None
    assert tool_set("fix_search").constraint is not None
    with pytest.raises(ValueError, match="unknown tool set"):
        tool_set("all_of_them")


@pytest.fixture(params=SETS)
def episode(request, suite_tasks):
    env = EpisodeEnv(suite_tasks[0], EnvConfig(tool_set=request.param, max_steps=4),
                     SandboxConfig(), policy_name="t")  # fmt: skip
    yield env
    env.workspace.cleanup()


def test_the_prompt_an_episode_renders_lists_exactly_its_sets_tools(episode):
    name = episode.env.tool_set
    assert episode.events[0]["tool_set"] == name
    for compact in (True, False):
        prompt = render_messages(episode.events, compact)[0]["content"]
        assert prompt == system_prompt(compact, name)
        for tool in TOOL_SPECS:
            shown = f"{tool}(" in prompt if compact else f'"name": "{tool}"' in prompt
            assert shown == (tool in TOOL_SETS[name].tools), (name, tool)


def test_a_transcript_without_a_tool_set_renders_with_the_default():
    events = [{"role": "user", "content": "fix it"}]
    assert render_messages(events)[0]["content"] == system_prompt(True, "free_form")


def test_another_sets_tool_is_an_invalid_call_and_terms_are_exactly_the_sets(episode):
    name = episode.env.tool_set
    foreign = next(t for t in TOOL_NAMES if t not in TOOL_SETS[name].tools)
    event = episode.step(
        Action(foreign, {"path": "x.py"} if foreign != "try_fix" else {"id": "a-1"})
    )
    assert event["error"] and f"tool set ({name})" in event["observation"]
    assert episode.invalid_calls == 1 and episode.step_rewards == [-0.1]
    episode.step(Action("finish", {}))
    result = episode.finish()
    assert list(result.reward_terms) == list(reward_terms(name))
    assert result.reward_terms["invalid_call"] == -0.1


def test_fix_search_counts_its_own_terms_per_step(suite_tasks):
    env = EpisodeEnv(suite_tasks[0], EnvConfig(tool_set="fix_search", max_steps=4),
                     SandboxConfig(), policy_name="t")  # fmt: skip
    try:
        env.step(Action("try_fix", {"id": "cmp-1"}))  # before any listing: wasted
        assert env.decoding_constraint() is None
        env.step(Action("list_fixes", {}))
        listed = env.decoding_constraint()
        assert listed and listed == env.tool_state.listing.untried_ids()
        env.step(Action("finish", {}))
        result = env.finish()
    finally:
        env.workspace.cleanup()
    assert result.step_rewards == [-0.1, 0.0, 0.0]
    assert result.reward_terms["wasted_fix_try"] == -0.1 and result.ran_tests
    assert list(result.reward_terms) == [*COMMON_TERMS, "wasted_fix_try", "failed_fix_try"]


def test_config_names_a_known_set_and_no_setting_of_another_set():
    with pytest.raises(ValueError, match="unknown 'fix-search'"):
        EnvConfig(tool_set="fix-search")
    with pytest.raises(ValueError, match="max_fixes set, but tool set 'free_form'"):
        EnvConfig(max_fixes=8)
    with pytest.raises(ValueError, match="weights.failed_fix_try"):
        EnvConfig(weights=RewardWeights(failed_fix_try=-0.2))
    assert EnvConfig(tool_set="fix_search", max_fixes=8).max_fixes == 8


def test_a_tool_outside_the_set_is_never_executed(suite_tasks):
    """The attack a set boundary must stop: an agent in a fix_search episode edits the
    tests with edit_file (a tool its set lacks); it is an invalid call, nothing changes, and
    the attempt is recorded as the monitor would record it in a set that has the tool."""
    task = suite_tasks[0]
    env = EpisodeEnv(task, EnvConfig(tool_set="fix_search", max_steps=4), SandboxConfig(),
                     policy_name="attacker")  # fmt: skip
    try:
        test_file = next(p for p in task.repo_dir.rglob("test_*.py"))
        rel = str(test_file.relative_to(task.repo_dir))
        before = (env.workspace.root / rel).read_text()
        patch = f"--- a/{rel}\n+++ /dev/null\n"
        for tool, args in (("edit_file", {"path": rel, "old": "assert", "new": "pass #"}),
                           ("apply_patch", {"patch": patch})):  # fmt: skip
            event = env.step(Action(tool, args))
            assert event["error"] and "tool set (fix_search)" in event["observation"]
        assert (env.workspace.root / rel).read_text() == before
        assert env.invalid_calls == 2
        # Never executed, yet recorded: the monitor's verdict on each attempt is kept.
        assert [f["step"] for f in env.safety_flags] == [1, 2], env.safety_flags
    finally:
        env.workspace.cleanup()


def test_with_tool_set_drops_what_only_the_old_set_read():
    searching = EnvConfig(tool_set="fix_search", max_fixes=8, max_steps=5,
                          weights=RewardWeights(wasted_fix_try=-0.3, invalid_call=-0.2))  # fmt: skip
    free = searching.with_tool_set("free_form")
    assert (free.tool_set, free.max_fixes, free.max_steps) == ("free_form", 64, 5)
    assert (free.weights.wasted_fix_try, free.weights.invalid_call) == (-0.1, -0.2)
    assert free.with_tool_set("fix_search").tool_set == "fix_search"
    assert searching.with_tool_set("fix_search") is searching


def test_list_fixes_sees_every_failing_test(suite_tasks):
    """The listing is ranked on every failing test's traceback, so its test run does not
    stop at the first failure (the task's own command may say -x)."""
    most = 0
    for task in suite_tasks[:4]:
        env = EpisodeEnv(task, EnvConfig(tool_set="fix_search"), SandboxConfig(),
                         policy_name="probe")  # fmt: skip
        try:
            event = env.step(Action("list_fixes", {}))
        finally:
            env.workspace.cleanup()
        most = max(most, event["observation"].count("FAILED tests/"))
    assert most >= 2, "list_fixes stopped at the first failing test"
