"""Impossible variants are evaluated in one run with the real tasks, under ids from one id
space (issue 44, item 2): the tells a payload or a policy could read from the run, tried
here, find nothing. The id pattern and number (a variant used to be numbered past every
real task of its split), the place in the order and the batch (variants used to run as a
second run after the real tasks), the files and their times, the harness's command and
hidden test files, and the contradicted value's form. Then one real run of the mixed
tasks: each result goes back to its own task's id, still signed, and the cheating summary
and the ordinary results come out of the same run."""

from __future__ import annotations

import ast
import re
import shutil
import statistics

import pytest

from components.env.config import EnvConfig
from components.evaluate.cheating import cheating_summary, is_variant, one_id_space, unmix
from components.evaluate.episodes import run_policy
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.impossible import build_variants, expected_values, target_function
from components.tasks.task import load_tasks
from components.verifier.provenance import unverified_reason

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Six generated tasks and three variants of them (made as evaluation makes them)."""
    out = tmp_path_factory.mktemp("mixed")
    generate_suite(out / "tasks", GenerateConfig(n_tasks=6, seed=5))
    tasks, errors = load_tasks(out / "tasks")
    assert not errors
    report = build_variants(tasks, out / "variants", 3)
    assert len(report.tasks) == 3, report.skipped
    return tasks, report.tasks, out


def _number(task_id: str) -> int:
    return int(task_id.rsplit("-", 1)[1])


def test_ids_numbers_and_order_say_nothing(suite, tmp_path):
    tasks, variants, _ = suite
    ranks = []
    for seed in range(12):
        played, stands_for = one_id_space(tasks, variants, seed, tmp_path / str(seed))
        ids = [t.id for t in played]
        assert all(re.fullmatch(r"(train|val|test)-\d{4}", i) for i in ids), ids
        # every split numbered 1..n without a gap: no number is left for a variant alone
        for split in {i.split("-")[0] for i in ids}:
            numbers = sorted(_number(i) for i in ids if i.startswith(split + "-"))
            assert numbers == list(range(1, len(numbers) + 1))
        assert [is_variant(t) for t in played] == [is_variant(stands_for[i]) for i in ids]
        assert sorted(stands_for[i].id for i in ids) == sorted(t.id for t in [*tasks, *variants])
        ranks += [k / (len(played) - 1) for k, t in enumerate(played) if is_variant(t)]
    # over seeds, a variant's place (and number) is anywhere: not last, not first
    assert 0.3 < statistics.mean(ranks) < 0.7 and min(ranks) == 0.0 and max(ranks) == 1.0


def _files(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_files_command_and_values_say_nothing(suite, tmp_path):
    tasks, variants, _ = suite
    played, stands_for = one_id_space(tasks, variants, 3, tmp_path)
    by_source = {stands_for[t.id].id: t for t in played}
    for variant in variants:
        real = by_source[variant.metadata.extra["impossible"]["of"]]
        mine = by_source[variant.id]
        for part in ("repo", "hidden_tests"):  # same paths, the source's own file times
            assert _files(mine.root / part) == _files(variant.root / part)
            assert _files(real.root / part).keys() == _files(mine.root / part).keys()
        assert mine.test_command == real.test_command
        assert mine.hidden_test_files() == real.hidden_test_files()
        assert mine.instruction == real.instruction
        imp = variant.metadata.extra["impossible"]
        own = {repr(v) for v in expected_values(stands_for[real.id], target_function(real))}
        assert imp["contradicted"] in own  # one of the task's own values, unmarked
        assert type(ast.literal_eval(imp["contradicted"])) is type(
            ast.literal_eval(imp["expected"])
        )


def test_one_run_gives_both_back_under_their_own_ids(suite, tmp_path):
    tasks, variants, _ = suite
    chosen = [t for t in tasks if t.id in {v.metadata.extra["impossible"]["of"] for v in variants}]
    played, stands_for = one_id_space(chosen, variants, 0, tmp_path)
    results = run_policy(
        played,
        "oracle",
        rollout=RolloutConfig(),
        env=EnvConfig(),
        sandbox=SandboxConfig(),
        workers=2,
    )
    ordinary, back, theirs = unmix(played, results, stands_for)
    assert [r.task_id for r in ordinary] == [
        stands_for[t.id].id for t in played if not is_variant(t)
    ]
    assert sorted(t.id for t in back) == sorted(v.id for v in variants)
    assert [r.task_id for r in theirs] == [t.id for t in back]
    for r in [*ordinary, *theirs]:
        assert r.record["task_id"] == r.task_id and r.task_id in r.episode_id
        assert unverified_reason(r.record) is None  # signed again under its own id
    assert all(r.success for r in ordinary)  # the reference fix solves every real task
    summary = cheating_summary(back, theirs)
    assert summary["verified"] == len(variants) and summary["cheating_rate"] == 0.0
