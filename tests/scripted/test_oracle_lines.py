"""The oracle on the line_edit tool set (issue 43): it reads the lines around the fix and
edits them by number, succeeds with full reward on built-in tasks, and shows recoveries
(a refused edit that would not parse, wrong line numbers) as turns not to imitate."""

from __future__ import annotations

import pytest

from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy, _slipped, line_edits
from components.scripted.registry import POLICY_TOOL_SETS, env_for_policy, make_policy

LINE_EDIT = EnvConfig(tool_set="line_edit")


def _assistant(result) -> list[dict]:
    return [e for e in result.record["trajectory"] if e["role"] == "assistant"]


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_oracle_lines_succeeds_on_built_in_tasks(suite_tasks, rate):
    assert POLICY_TOOL_SETS["oracle-lines"] == "line_edit"
    assert env_for_policy("oracle-lines", EnvConfig()).tool_set == "line_edit"
    for task in suite_tasks[:4]:
        policy = make_policy("oracle-lines", seed=3)
        policy.recovery_rate = rate
        r = run_episode(task, policy, LINE_EDIT, SandboxConfig())
        assert r.success and r.reward == pytest.approx(1.0), (task.id, r.reward_terms)
        calls = _assistant(r)
        tools = [e["action"] for e in calls]
        assert tools[0] == "run_command" and tools[-1] == "finish"
        assert "edit_lines" in tools and "edit_file" not in tools and "apply_patch" not in tools
        first_edit = tools.index("edit_lines")
        assert "read_file" in tools[:first_edit] or "read_file" in tools[first_edit:]
        wrong = [e for e in calls if e.get("train") is False]
        if rate == 0.0:
            assert not wrong
            read = calls[first_edit - 1]["arguments"]
            edit = calls[first_edit]["arguments"]
            # a short module is read whole: what to read never depends on the answer
            assert read == {"path": edit["path"]}
        else:  # one refused edit_lines, then the right one
            (slip,) = wrong
            assert slip["action"] == "edit_lines"
            answer = r.record["trajectory"][r.record["trajectory"].index(slip) + 1]
            assert answer["observation"].startswith("error:")
            assert "no longer parse" in answer["observation"] or "past the end" in answer[
                "observation"]  # fmt: skip


def test_the_oracle_adapts_to_a_line_edit_episode(suite_tasks):
    r = run_episode(suite_tasks[0], OraclePolicy(recovery_rate=0.0), LINE_EDIT, SandboxConfig())
    assert r.success and "edit_lines" in [e["action"] for e in _assistant(r)]


def test_line_edits_go_bottom_up_with_the_unedited_files_numbers():
    before = "a\nb\nc\nd\ne\n"
    after = "a\nB\nc\nd\nE\nF\n"
    edits = line_edits({"m.py": (before, after)})
    assert [(e.start, e.end, e.text) for e in edits] == [(5, 5, "E\nF\n"), (2, 2, "B\n")]
    (merged,) = line_edits({"m.py": (before, after)}, merged=True)
    assert (merged.start, merged.end, merged.text) == (2, 5, "B\nc\nd\nE\nF\n")


def test_the_free_form_slip_is_not_matched_by_edit_files_fallbacks():
    from components.env.tool_sets.text_edits import whitespace_matches

    text = "def f(a):\n    return a + 1\n"
    for old in ("    return a + 1\n", "return\n"):
        slipped = _slipped(old)
        assert slipped not in text and not whitespace_matches(text, slipped)
