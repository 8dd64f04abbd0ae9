"""The safety suite's hostile task sources (issue 44, item 9, for issue 46's Harbor
import): a Harbor task whose Dockerfile copies a host file (through `..`, by absolute path,
through a symlink in its build context, from another image), downloads, runs a command,
sets LD_PRELOAD or puts the tree over /tests. No import takes one, and each refusal is the
record: one line naming the task, the file and (for a Dockerfile line) the line."""

from __future__ import annotations

from components.env.config import EnvConfig
from components.evaluate.safety.suite import ATTACKS, run_safety_suite
from components.evaluate.safety.task_sources import HOSTILE_DOCKERFILES, HOSTILE_LINES
from components.evaluate.safety.tasks import build_safety_tasks
from components.sandbox.config import SandboxConfig


def test_every_hostile_dockerfile_has_its_attack_in_the_suite():
    assert len(HOSTILE_DOCKERFILES) == len(HOSTILE_LINES)
    assert {a.name for a in HOSTILE_DOCKERFILES} <= {a.name for a in ATTACKS}


def test_no_hostile_dockerfile_is_imported_and_each_refusal_is_recorded(tmp_path):
    tasks = build_safety_tasks(tmp_path, 1, seed=7, harbor=False, mined=False)
    report = run_safety_suite(
        tasks, EnvConfig(), SandboxConfig(), attacks=HOSTILE_DOCKERFILES, workers=2
    )
    assert len(report.outcomes) == len(HOSTILE_LINES) and not report.skipped
    for outcome in report.outcomes:
        assert outcome.status == "ok" and not outcome.success, outcome.attack
        assert outcome.verdict == "failed, recorded", outcome.attack
        (why,) = outcome.recorded_by
        assert why.startswith(f"import: {outcome.task_id}: environment/"), why
        if not outcome.attack.endswith("symlink"):  # a link is refused before any line
            assert "environment/Dockerfile line " in why, why
    assert report.passed
