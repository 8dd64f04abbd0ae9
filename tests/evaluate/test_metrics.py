"""Metric functions on hand-built EpisodeResults; expected values derived by hand below."""

from __future__ import annotations

import shutil

import pytest

from components.env.episode import EpisodeResult
from components.env.final_diff import repo_diff
from components.evaluate.metrics import (
    aggregate,
    episode_metrics,
    patch_stats,
    regression,
    trajectory_facts,
)
from components.tasks.generate import generate_suite
from components.tasks.patching import apply_unified_diff
from components.tasks.task import load_tasks
from components.verifier.snapshot import changed_files

PYTEST = {"cmd": "python -m pytest -q"}


def call(action, args=None, obs="ok", error=False):
    env = {"role": "environment", "observation": obs, "truncated": False}
    if error:
        env["error"] = True
    return [{"role": "assistant", "action": action, "arguments": args or {}}, env]


def result(task_id, *, split="test", status="ok", end="finished", success=False, reward=0.0,
           terms=None, steps=0, tool_calls=0, invalid=0, flags=(), tests=(10, 0), changed=(),
           tampered=(), events=None, tokens=None, family="fam_a", wall=1.0,
           diff=None):  # fmt: skip
    record = {}
    if events is not None:
        record = {"trajectory": [{"role": "user", "content": "fix it"}, *events],
                  "metadata": {"num_tokens": tokens, "family": family, "bug_class": "swap"}}  # fmt: skip
    return EpisodeResult(
        episode_id=f"p-{task_id}", task_id=task_id, split=split, policy="p", status=status,
        end_reason=end, success=success, reward=reward, reward_terms=terms or {}, steps=steps,
        tool_calls=tool_calls, invalid_calls=invalid, safety_flags=[dict(f) for f in flags],
        ran_tests=True, tests_total=tests[0], tests_failed=tests[1], changed_files=list(changed),
        tampered_files=list(tampered), wall_s=wall, final_diff=diff, record=record,
    )  # fmt: skip


def candidate() -> list[EpisodeResult]:
    """r1 clean success; r2 setback + lint + token limit; r3 setback then success;
    r4 infra failure with a destructive flag; r5 (val) tampering at max_steps, no record."""
    r1 = result("t1", success=True, reward=1.0, terms={"tests_pass": 1.0, "lint": 0.0},
                steps=4, tool_calls=4, changed=["m.py"],
                events=[*call("run_command", PYTEST, "1 failed\nexit code 1"),
                        *call("edit_file", {"path": "m.py", "old": "a", "new": "b"}),
                        *call("run_command", PYTEST, "4 passed\nexit code 0"),
                        *call("finish")])  # fmt: skip
    r2 = result("t2", end="token_limit", reward=-0.5, terms={"tests_pass": 0.0, "lint": -0.5},
                steps=5, tool_calls=4, invalid=1, tests=(10, 4), changed=["m.py", "other.py"],
                tokens=100,
                events=[*call(None, {}, "error: invalid tool call", error=True),
                        *call("edit_file", {}, "error: old text not found", error=True),
                        *call("edit_file", {}),
                        *call("run_command", PYTEST, "2 failed\nexit code 1"),
                        *call("finish")])  # fmt: skip
    r3 = result("t3", success=True, reward=0.7, terms={"tests_pass": 1.0, "lint": 0.0},
                steps=3, tool_calls=3, tests=(8, 0), changed=["m.py"], tokens=300,
                events=[*call("edit_file", {}, "error: old text not found", error=True),
                        *call("edit_file", {}), *call("finish")])  # fmt: skip
    r4 = result("t4", status="infra_failure", end="max_steps", reward=None, steps=2,
                tool_calls=2, flags=[{"step": 1, "category": "destructive", "reason": "rm"}],
                tests=(0, 0))  # fmt: skip
    r5 = result("t5", split="val", end="max_steps", reward=-1.3,
                terms={"tests_pass": 0.0, "lint": 0.0}, steps=16, tool_calls=16, tests=(5, 5),
                flags=[{"step": 3, "category": "test_tampering", "reason": "edit"}],
                changed=["tests/test_m.py"], tampered=["tests/test_m.py"])  # fmt: skip
    return [r1, r2, r3, r4, r5]


def champion() -> list[EpisodeResult]:
    return [result("t1", success=True), result("t2", success=True), result("t3"),
            result("t4", success=True), result("t5", split="val", success=True)]  # fmt: skip


def test_trajectory_facts_find_setbacks_and_errors():
    r1, r2, r3, _, r5 = candidate()
    # r1: the failing run happens before any edit (expected), the rerun passes: no setback.
    assert trajectory_facts(r1.record)["setback"] is False
    f2 = trajectory_facts(r2.record)
    assert (f2["error_calls"], f2["failed_calls"], f2["failed_rerun"]) == (2, 2, True)
    assert trajectory_facts(r3.record)["setback"] is True
    assert trajectory_facts(r5.record) is None


def test_blocked_actions_are_not_setbacks():
    r = result("t", events=[*call("run_command", {"cmd": "rm -rf ."},
                                  "blocked by safety monitor: destructive: rm", error=True)])  # fmt: skip
    assert trajectory_facts(r.record)["setback"] is False
    assert trajectory_facts(r.record)["error_calls"] == 1


def test_episode_metrics_row():
    r2 = candidate()[1]
    row = episode_metrics(r2)
    assert row["test_pass_fraction"] == pytest.approx(0.6)  # (10 - 4) / 10
    assert row["needs_human"] is True  # token_limit
    assert row["lint_clean"] is False and row["violation"] is False
    r4 = episode_metrics(candidate()[3])
    assert r4["test_pass_fraction"] is None and r4["needs_human"] and r4["violation"]


def test_aggregate_overall_by_hand():
    """Verified = r1, r2, r3, r5; all = r1..r5.
    success 2/4; test pass (1 + .6 + 1 + 0)/4 = .65; valid calls 1 - 1/28 (steps 4+5+3+16);
    tool-call accuracy over episodes with a trajectory (r1, r2, r3): 1 - 3/12 = .75;
    recovery: setbacks r2 (fail), r3 (success) -> 1/2; violations r4, r5 -> 2/5;
    tampering r5 -> 1/5; human: r2 (token limit), r4 (infra), r5 (max steps) -> 3/5;
    lint respected over verified episodes that changed files: r1, r3, r5 clean of 4 -> .75;
    step efficiency (oracle t1=4, t3=6): r1 4/4 = 1, r3 6/3 = 2 -> 1.5;
    tool calls 4+4+3+2+16 = 29; tokens 100 + 300 over 2 episodes."""
    agg = aggregate(candidate(), oracle_steps={"t1": 4, "t3": 6})
    o = agg["overall"]
    assert o["success_rate"] == 0.5 and o["verified"] == 4 and o["infra_failures"] == 1
    assert o["infra_failure_rate"] == 0.2  # 1 of 5 episodes
    assert o["test_pass_rate"] == pytest.approx(0.65)
    assert o["valid_call_rate"] == pytest.approx(1 - 1 / 28)
    assert o["tool_call_accuracy"] == pytest.approx(0.75)
    assert o["recovery_rate"] == 0.5 and o["recovery_episodes"] == 2
    assert o["safety_violation_rate"] == pytest.approx(0.4)
    assert o["tampering_rate"] == pytest.approx(0.2)
    assert o["human_intervention_rate"] == pytest.approx(0.6)
    assert o["lint_respected"] == pytest.approx(0.75)
    assert o["step_efficiency"] == pytest.approx(1.5) and o["mean_steps_success"] == 3.5
    assert o["cost"]["tool_calls_total"] == 29
    assert (o["cost"]["tokens_total"], o["cost"]["tokens_mean"]) == (400, 200)
    assert o["reward_term_means"]["lint"] == pytest.approx(-0.125)
    assert o["regression_rate"] is None and agg["regression"] is None
    assert o["patch_minimality"] is None  # no tasks given: no reference to compare with
    lo, hi = o["success_ci95"]
    assert lo < 0.5 < hi
    assert agg["by_split"]["test"]["success_rate"] == pytest.approx(2 / 3)
    assert agg["by_split"]["val"]["success_rate"] == 0.0


def test_regression_against_champion():
    """Common tasks (candidate t4 is an infra failure): t1, t2, t3, t5. The champion solved
    t1, t2, t5; the candidate fails t2 and t5 -> 2/3. t3 is newly solved."""
    reg = regression(candidate(), champion())
    assert reg["regression_rate"] == pytest.approx(2 / 3)
    assert reg["regressed_tasks"] == ["t2", "t5"] and reg["improved_tasks"] == ["t3"]
    agg = aggregate(candidate(), champion())
    assert agg["overall"]["regression_rate"] == pytest.approx(2 / 3)
    assert agg["by_split"]["val"]["regression_rate"] == 1.0  # t5
    assert agg["by_split"]["test"]["regression_rate"] == 0.5  # t1 kept, t2 lost


def fixed_repo_diff(task, repo, *edits) -> str:
    """The diff an episode stores for a repo holding the reference fix plus `edits`
    (functions of the repo folder)."""
    shutil.copytree(task.repo_dir, repo)
    apply_unified_diff(repo, task.reference_patch())
    for edit in edits:
        edit(repo)
    return repo_diff(task.repo_dir, repo, changed_files(task.repo_dir, repo))


def add_comment(module):
    def edit(repo):
        path = repo / module
        path.write_text("# note\n" + path.read_text())

    return edit


def test_patch_minimality_and_unrelated_changes(tmp_path):
    generate_suite(tmp_path / "tasks", 1, seed=3)
    (task,), _ = load_tasks(tmp_path / "tasks")
    module = task.metadata.extra["module"]
    exact = result(task.id, success=True, changed=[module],
                   diff=fixed_repo_diff(task, tmp_path / "exact"))  # fmt: skip
    stats = patch_stats(task, exact)
    assert stats["patch_ratio"] == 1.0 and stats["unrelated_files"] == []
    # The fix plus one extra comment line, and an empty file a script created (a changed
    # file with no line in the diff).
    empty_notes = lambda repo: (repo / "notes.txt").write_text("")  # noqa: E731
    bigger = result(task.id, success=True, changed=[module, "notes.txt"],
                    diff=fixed_repo_diff(task, tmp_path / "bigger", add_comment(module),
                                         empty_notes))  # fmt: skip
    stats = patch_stats(task, bigger)
    assert stats["patch_lines"] == stats["reference_lines"] + 1
    assert stats["unrelated_files"] == ["notes.txt"]
    agg = aggregate([exact, bigger], tasks={task.id: task})
    ref = stats["reference_lines"]
    assert agg["overall"]["patch_minimality"] == pytest.approx((1 + (ref + 1) / ref) / 2)
    assert agg["overall"]["unrelated_change_rate"] == 0.5
    assert agg["overall"]["minimal_patch_share"] == 0.5


def test_patch_size_counts_script_written_files_and_needs_a_stored_diff(tmp_path):
    """Lines a script wrote through run_command are part of the agent's patch; a result
    loaded from a file written before episodes kept a diff has no patch size (not a crash)
    but still its unrelated files."""
    generate_suite(tmp_path / "tasks", 1, seed=3)
    (task,), _ = load_tasks(tmp_path / "tasks")
    module = task.metadata.extra["module"]
    notes = lambda repo: (repo / "notes.txt").write_text("one\ntwo\n")  # noqa: E731
    scripted = result(task.id, success=True, changed=[module, "notes.txt"],
                      diff=fixed_repo_diff(task, tmp_path / "scripted", notes))  # fmt: skip
    stats = patch_stats(task, scripted)
    assert stats["patch_lines"] == stats["reference_lines"] + 2
    old = result(task.id, success=True, changed=[module, "notes.txt"],
                 events=[*call("apply_patch", {"patch": task.reference_patch()}),
                         *call("finish")])  # fmt: skip
    assert old.final_diff is None
    stats = patch_stats(task, old)
    assert stats["patch_lines"] is None and stats["patch_ratio"] is None
    assert stats["unrelated_files"] == ["notes.txt"]
    agg = aggregate([old], tasks={task.id: task})
    assert agg["overall"]["patch_minimality"] is None
    assert agg["overall"]["unrelated_change_rate"] == 1.0


def test_success_by_task_source():
    """Generated, imported and mined tasks are reported apart (the record's task_source)."""

    def sourced(task_id, source, success):
        r = result(task_id, success=success, reward=1.0 if success else 0.0, steps=1,
                   tool_calls=1, events=[*call("finish")])  # fmt: skip
        r.record["metadata"]["task_source"] = source
        return r

    agg = aggregate([sourced("g1", "builtin", True), sourced("g2", "builtin", False),
                     sourced("q1", "quixbugs", False), sourced("m1", "mined", True)])  # fmt: skip
    rates = {k: v["success_rate"] for k, v in agg["by_source"].items()}
    assert rates == {"builtin": 0.5, "mined": 1.0, "quixbugs": 0.0}
