"""fix_search on a task whose test command finds no tests (issue 46): a Harbor task's tests
live only in its verifier, so `python -m pytest -q` in the agent's repository collects
nothing. list_fixes and try_fix then get the task's own verifier's verdict in words
(components/verifier/tool_signal.py): the right fix reads PASSED, a wrong one FAILED, and
nothing of the hidden tests reaches an observation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import resolve_isolation
from components.sandbox.process import CommandResult
from components.tasks.harbor_import import import_harbor_task
from components.tasks.task import load_task
from components.verifier.tool_signal import found_no_tests

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "harbor_humanevalfix"
NO_TESTS = CommandResult(("python", "-m", "pytest", "-q"), 5, "\nno tests ran\n", False, False,
                         None, 0.2, "bwrap")  # fmt: skip


def test_no_tests_is_pytests_exit_status_5_with_its_line_and_no_limit():
    assert found_no_tests(NO_TESTS)
    assert not found_no_tests(dataclasses.replace(NO_TESTS, exit_code=1))  # tests that fail
    assert not found_no_tests(dataclasses.replace(NO_TESTS, output="usage: x\n"))  # another 5
    assert not found_no_tests(dataclasses.replace(NO_TESTS, limit_hit="wall_time"))


def _sums_squares(text: str) -> bool:
    """Does the module `text` compute sum_squares right on the instruction's examples?"""
    space: dict = {}
    exec(compile(text, "sum_squares.py", "exec"), space)  # a candidate of the fixture's module
    try:
        return space["sum_squares"]([1, 2, 3]) == 14 and space["sum_squares"]([4]) == 16
    except Exception:  # noqa: BLE001 - a candidate may raise: it is not the fix
        return False


@pytest.mark.skipif(
    resolve_isolation("auto") != "bwrap", reason="Harbor verification needs bubblewrap"
)
def test_fix_search_on_a_harbor_task_reads_the_verifiers_verdict(tmp_path):
    task = load_task(import_harbor_task(FIXTURE / "python-1", tmp_path))
    env = EpisodeEnv(task, EnvConfig(tool_set="fix_search", max_steps=10), SandboxConfig(),
                     policy_name="t")  # fmt: skip
    listing = env.step(Action("list_fixes", {}))["observation"]
    said = "`python -m pytest -q` found no tests; the task's own verifier: tests FAILED"
    assert said in listing and "Candidate fixes of sum_squares.py" in listing, listing
    candidates = env.tool_state.listing.candidates
    right = next(c.id for c in candidates if _sums_squares(c.text))
    wrong = next(c.id for c in candidates if not _sums_squares(c.text))
    tried = env.step(Action("try_fix", {"id": wrong}))["observation"]
    assert tried.startswith(f"{wrong} applied") and "tests FAILED" in tried, tried
    fixed = env.step(Action("try_fix", {"id": right}))["observation"]
    assert fixed.splitlines()[0].endswith("tests PASSED"), fixed
    assert "the task's own verifier: tests PASSED" in fixed
    hidden = (FIXTURE / "python-1" / "tests" / "test_outputs.py").read_text()
    for observation in (listing, tried, fixed):  # the verdict only, never the hidden tests
        assert "test_negative" not in observation and "30" not in observation
        assert not any(line.strip() in observation for line in hidden.splitlines()
                       if len(line.strip()) > 12)  # fmt: skip
    env.step(Action("finish", {}))
    result = env.finish()
    assert result.success and result.reward_terms["failed_fix_try"] == pytest.approx(-0.05)
