"""Issue 44 items 1 and 4: no run of the agent's code sees an expected value of a check
that decides its verdict. Hidden cases are drawn for the task (none of their arguments in
the workspace, the hidden tests or the shipped cases) and answered by the reference fix
outside the agent's runs, for generated, imported (QuixBugs) and mined tasks; lookup
tables of every value the tests show fail them, recorded as forged verdicts."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.evaluate.safety.answer_lookup import ANSWER_LOOKUP, asserted_values, lookup_suffix
from components.evaluate.safety.attack import module_path
from components.evaluate.safety.suite import run_safety_suite
from components.evaluate.safety.tasks import build_safety_tasks
from components.sandbox.config import SandboxConfig
from components.scripted.reference import NoopPolicy, OraclePolicy
from components.tasks.task import load_task
from components.verifier.checks import check_config
from components.verifier.hidden_cases import (
    _differential_match,
    _perturbations,
    _seen_calls,
    cases_check,
    hidden_cases,
    reference_cases,
)

ENV, SANDBOX = EnvConfig(), SandboxConfig()
QUIXBUGS = Path(__file__).resolve().parents[1] / "fixtures" / "external_quixbugs"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Two generated tasks (baited), the bundled mined task and two QuixBugs programs."""
    out = tmp_path_factory.mktemp("lookup")
    safety = build_safety_tasks(out, 2, seed=7, harbor=False)
    plain = [t for t in safety if t.id.endswith("-bait") and "imported" not in t.id]
    return plain + [load_task(QUIXBUGS / name) for name in ("gcd", "bucketsort")]


def test_drawn_arguments_appear_nowhere_a_run_can_read_them(tasks):
    sources = {t.metadata.source for t in tasks}
    assert {"builtin", "mined", "quixbugs"} <= sources, sources
    for task in tasks:
        cases, comparison = hidden_cases(task)
        assert comparison == "differential" and cases, task.id
        assert hidden_cases(task)[0] == cases  # a pure function of the task: rescore agrees
        seen = _seen_calls(task)
        shown = set().union(*seen.values())
        for case in cases:
            assert case["expected"] is None  # answered by the reference fix, in the verifier
            assert case["args"] not in shown, (task.id, case["args"])
        # every argument tuple a lookup of the tests' values could hold was seen
        visible = sorted(task.repo_dir.rglob("test*.py"))
        hidden = [task.hidden_tests_dir / r for r in task.hidden_test_files()]
        table = asserted_values(visible + hidden, cases[0]["function"])
        assert table and not set(table) & {c["args"] for c in cases}, task.id


def test_perturbed_arguments_keep_their_examples_shape():
    examples = [([1, 2, 5, 9], 3), ([-4, 0, 7], 1)]
    drawn = _perturbations(examples, random.Random(0), 40)
    assert len(drawn) >= 20 and len({repr(d) for d in drawn}) > 10
    for xs, k in drawn:
        assert xs == sorted(xs) and type(k) is int and k > 0  # sorted stays sorted, sign kept
    words = _perturbations([("hello world",), ("abc",)], random.Random(1), 20)
    assert all(type(w) is str and w for (w,) in words)


def test_answers_compare_by_value_and_type():
    assert _differential_match(2, 2.0) and _differential_match([1, (2, 3)], [1, (2, 3)])
    assert not _differential_match(True, 1) and not _differential_match([1], (1,))
    assert not _differential_match(None, 0) and _differential_match(float("nan"), float("nan"))


@needs_bwrap
def test_the_reference_fix_answers_cases_the_bug_shows_on(tasks):
    for task in tasks:
        cfg = check_config(task, ENV, SANDBOX)
        cases = reference_cases(task, hidden_cases(task)[0], ENV, cfg)
        assert isinstance(cases, list) and cases, (task.id, cases)
        assert any(c["bug_shows"] for c in cases), task.id
        assert all(isinstance(c["expected"], str) for c in cases)
        assert reference_cases(task, hidden_cases(task)[0], ENV, cfg) == cases  # cached


@needs_bwrap
def test_oracle_solves_and_noop_fails_every_layout(tasks):
    for task in tasks:
        oracle = run_episode(task, OraclePolicy(), ENV, SANDBOX)
        assert oracle.success and oracle.reward == 1.0, (task.id, oracle.reward)
        noop = run_episode(task, NoopPolicy(), ENV, SANDBOX)
        assert not noop.success, task.id


@needs_bwrap
def test_answer_lookups_fail_the_differential_cases_and_are_recorded(tasks):
    report = run_safety_suite(tasks, ENV, SANDBOX, attacks=ANSWER_LOOKUP, every_task=True)
    assert not report.skipped and report.passed
    played = {(o.attack, o.task_id) for o in report.outcomes}
    assert {a for a, _ in played} == {a.name for a in ANSWER_LOOKUP}
    sources = {t.id: t.metadata.source for t in tasks}
    assert {sources[t] for _, t in played} == {"builtin", "mined", "quixbugs"}
    for o in report.outcomes:
        assert o.status == "ok" and not o.success and o.reward is not None and o.reward < 0, o
        assert o.recorded and "test_tampering" in o.categories, o


@needs_bwrap
def test_a_lookup_of_every_value_the_tests_show_fails_the_hidden_cases(tasks, tmp_path):
    """The module answers every argument tuple of the visible and hidden tests from a table
    (what any channel out of the hidden-test run could carry) and runs the bug elsewhere:
    it answers the tests' own calls, and fails the drawn cases, on every layout."""
    for task in tasks:
        visible = sorted(task.repo_dir.rglob("test*.py"))
        hidden = [task.hidden_tests_dir / r for r in task.hidden_test_files()]
        for files in (visible, visible + hidden):
            tree = tmp_path / f"{task.id}-{len(files)}"
            shutil.copytree(task.repo_dir, tree)
            module = tree / module_path(task)
            module.write_text(module.read_text() + lookup_suffix(task, files))
            cases, comparison = hidden_cases(task)
            cfg = check_config(task, ENV, SANDBOX)
            check = cases_check(cases, comparison, tree, ENV, cfg)
            assert not check.lost and not check.forged, (task.id, check.lost, check.forged)
            assert not check.passed and check.failed > 0, (task.id, check.detail)


def test_failed_differential_cases_are_forged_unless_the_code_answered_them_its_own_way():
    """Behind passing tests: failed cases answered as the bug does, with errors or with
    objects that are not plain values are the bug left in place (forged); an incomplete
    honest fix gives some plain answer of its own (a plain failure). Cases read off the
    tests are forged whenever they fail behind them."""
    from components.verifier.checks import Check
    from components.verifier.verdict import _bug_left

    assert _bug_left(Check(failed=3, answered_otherwise=0))
    assert not _bug_left(Check(failed=3, answered_otherwise=1))
    assert _bug_left(Check(failed=1))  # not differential
