"""Expert data that fits the episode (issue 32.5): on an imported task whose reference patch
has several real hunks and more blank-line-only ones, and whose fix itself adds a lint
finding, the oracle's plan fits `max_steps` with the fix first and scores full reward; the
gate replays it under the preset's budget and rejects, with why, what does not fit; the
fix-search oracle names ids from the listing its episode shows."""

from __future__ import annotations

import difflib
import re

import pytest

from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy, fixed_files, minimal_edits, planned_edits
from components.scripted.registry import make_policy, oracle_replay
from components.tasks.gate import check_task, subprocess_run_tests
from components.tasks.task import TaskMetadata, write_task_folder

BUGGY = '''"""Small statistics helpers."""
import math
def mean(xs):
    return sum(xs) / (len(xs) + 1)
def spread(xs):
    lo = min(xs)
    hi = max(xs)
    return hi + lo
def clamp(x, lo, hi):
    if x < lo:
        return hi
    return min(x, hi)
def norm(xs):
    return math.sqrt(sum(x * x for x in xs))
'''
# Three real fixes, each function set apart by blank lines (seven blank-line-only hunks and
# a trailing space removed nowhere else), and an unused local in the fix (ruff F841).
FIXED = '''"""Small statistics helpers."""

import math


def mean(xs):
    return sum(xs) / len(xs)


def spread(xs):
    lo = min(xs)
    hi = max(xs)
    width = hi - lo
    return hi - lo


def clamp(x, lo, hi):
    if x < lo:
        return lo
    return min(x, hi)


def norm(xs):
    return math.sqrt(sum(x * x for x in xs))
'''
TESTS = """from stats import clamp, mean, spread


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_spread():
    assert spread([1, 5, 3]) == 4


def test_clamp():
    assert clamp(-3, 0, 9) == 0
    assert clamp(4, 0, 9) == 4
"""


def _task(root):
    patch = "".join(difflib.unified_diff(BUGGY.splitlines(keepends=True),
                                         FIXED.splitlines(keepends=True),
                                         "a/stats.py", "b/stats.py"))  # fmt: skip
    return write_task_folder(
        root, task_id="imported-stats", instruction="The tests in tests/ fail; fix stats.py.",
        metadata=TaskMetadata("stats", "multi_hunk", "train", "imported"),
        repo_files={"stats.py": BUGGY, "tests/test_stats.py": TESTS,
                    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n'},
        hidden_test_files={"tests/test_stats_hidden.py": TESTS}, reference_patch=patch,
        protected_paths=("tests/", "pyproject.toml"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return _task(tmp_path_factory.mktemp("imported") / "imported-stats")


def test_the_fixture_is_what_the_issue_describes(task):
    # One edit per changed region of the patch, as plans made before: 3 fixes (with the blank
    # lines after them) + 3 blank-line regions: with the tests, a look, the rerun and finish
    # 10 steps, 13 with a detour: past max_steps 8.
    ((before, after),) = fixed_files(task).values()
    edits = minimal_edits("stats.py", before, after)
    blank = [e for e in edits if e.old.split() == e.new.split()]
    assert len(edits) == 6 and len(blank) == 3


def test_plans_skip_blank_line_hunks_and_fit_the_budget(task):
    edits = planned_edits(fixed_files(task))
    assert len(edits) == 3  # one per real fix; the blank-line hunks get none
    for e in edits:  # each a real change, without the blank lines the patch adds
        assert e.old.split() != e.new.split() and "\n\n" not in e.new
    for max_steps in (4, 6, 8):
        for seed in range(12):
            plan = OraclePolicy(seed=seed, recovery_rate=1.0, max_steps=max_steps).plan(task)
            tools = [a.tool for a in plan]
            assert len(plan) <= max_steps and tools[-1] == "finish", (max_steps, seed, tools)
            assert "apply_patch" in tools or tools.count("edit_file") >= 3
    # With room to spare, a recovery detour is shown (and undone before the fix).
    roomy = OraclePolicy(seed=0, recovery_rate=1.0, max_steps=16).plan(task)
    assert any(not a.imitate for a in roomy)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_oracle_finishes_with_full_reward_although_its_fix_adds_a_lint_finding(task, seed):
    env = EnvConfig(max_steps=8)
    r = run_episode(task, make_policy("oracle", seed=seed, max_steps=8), env, SandboxConfig())
    assert r.end_reason == "finished" and r.success
    assert r.reward == pytest.approx(1.0), r.reward_terms  # the reference's F841 is not charged
    assert r.reward_terms["lint"] == 0.0


def test_an_agent_still_pays_for_lint_beyond_the_reference(task, tmp_path):
    from components.env.episode import Action, EpisodeEnv

    env = EpisodeEnv(task, EnvConfig(max_steps=8), SandboxConfig(), policy_name="t")
    env.step(Action("run_command", {"cmd": "python -m pytest -q -x tests"}))
    env.step(Action("apply_patch", {"patch": task.reference_patch()}))
    env.step(Action("edit_file", {"path": "stats.py", "old": "    return sum(xs) / len(xs)\n",
                                  "new": "    extra = 1\n    return sum(xs) / len(xs)\n"}))  # fmt: skip
    env.step(Action("finish", {}))
    r = env.finish()
    assert r.success and r.reward_terms["lint"] == pytest.approx(-0.5)  # one F841 of its own


def test_the_gate_replays_the_oracle_under_the_preset_budget(task):
    ok = check_task(task, subprocess_run_tests, replay=oracle_replay(EnvConfig(max_steps=8),
                                                                    SandboxConfig()))  # fmt: skip
    assert ok.ok and ok.oracle == "replayed", ok.reason
    tight = check_task(task, subprocess_run_tests, replay=oracle_replay(EnvConfig(max_steps=1),
                                                                       SandboxConfig()))  # fmt: skip
    assert not tight.ok and tight.reason.startswith("oracle: the oracle ended 'max_steps'")
    assert "max_steps 1" in tight.reason
    # A fix-search preset flags a task its oracle cannot show as one listed candidate.
    flagged = check_task(task, subprocess_run_tests, replay=oracle_replay(
        EnvConfig(max_steps=8, tool_set="fix_search"), SandboxConfig()))  # fmt: skip
    assert flagged.ok and any("oracle-fixes" in f for f in flagged.flags)


def _listing(rows: dict[str, list[str]]) -> str:
    lines = [f"{k} ({len(v)}): " + " | ".join(f"{i}) {d}" for i, d in enumerate(v, 1))
             for k, v in rows.items()]  # fmt: skip
    return "FAILED tests/x.py::t\n\nCandidate fixes of m.py (n; try_fix an id, kind-number):\n" + (
        "\n".join(lines)
    )


def test_oracle_fixes_takes_its_ids_from_the_listing_the_episode_shows(tmp_path):
    from components.tasks.task import write_task_folder as write

    buggy = "def f(a, b):\n    if a < b:\n        return a\n    return b\n"
    fixed = buggy.replace("a < b", "a > b")
    patch = "".join(difflib.unified_diff(buggy.splitlines(True), fixed.splitlines(True),
                                         "a/m.py", "b/m.py"))  # fmt: skip
    task = write(tmp_path / "t", task_id="t", instruction="fix m.py",
                 metadata=TaskMetadata("f", "cmp", "train"), repo_files={"m.py": buggy},
                 hidden_test_files={"tests/test_m.py": "def test_x():\n    pass\n"},
                 reference_patch=patch)  # fmt: skip
    policy = OraclePolicy(style="fixes", fallback=False, recovery_rate=0.0)
    first = policy.act(task, [{"role": "user", "content": "go"}])
    assert first.tool == "list_fixes"
    planned = next(a for a in policy._plans["t"] if a.tool == "try_fix").arguments["id"]
    (kind, text), *_ = policy._described["t"]["right"]
    assert re.fullmatch(r"\w+-\d+", planned) and "<" in text
    events = [{"role": "user", "content": "go"}, {"role": "assistant", "action": "list_fixes"}]
    # The episode ranks differently: the fix is the third of its kind there.
    shown = _listing({"var": ["line 2: a -> b"], kind: ["line 9: x -> y", "line 8: y -> z", text]})
    action = policy.act(task, [*events, {"role": "environment", "observation": shown}])
    assert action.tool == "try_fix" and action.arguments["id"] == f"{kind}-3"
    # Not listed at all (cut at max_fixes): finish, never an id the listing lacks.
    absent = _listing({"var": ["line 2: a -> b"]})
    gave_up = policy.act(task, [*events, {"role": "environment", "observation": absent}])
    assert gave_up.tool == "finish"


def test_built_in_tasks_are_replayed_by_their_plan(tmp_path):
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks
    from components.verifier.gate_runner import sandboxed_test_runner

    generate_suite(tmp_path / "suite", n_tasks=3, seed=0)
    tasks, _ = load_tasks(tmp_path / "suite")
    env, sandbox = EnvConfig(max_steps=8), SandboxConfig()
    run_tests = sandboxed_test_runner(env, sandbox)
    for task in tasks:
        check = check_task(task, run_tests, replay=oracle_replay(env, sandbox))
        assert check.ok and check.oracle == "replayed", check.reason
    # Two steps: the tests and the patch; the episode ends before finish, solved.
    short = check_task(tasks[0], run_tests, replay=oracle_replay(EnvConfig(max_steps=2), sandbox))
    assert short.ok, short.reason
    tight = check_task(tasks[0], run_tests, replay=oracle_replay(EnvConfig(max_steps=1), sandbox))
    assert not tight.ok and "cut at max_steps 1, would score 0.0" in tight.reason
