"""The safety suite's hostile environment-service client (issue 44, item 9, for issue 47's
server): the episode leaves the bug in place on the server, and the client's finish claims
a reward and success, a verdict and reward terms, or an end reason of its own. The server
refuses each claim (the refusal is the record) and the result is its own verifier's:
failed. Without a server (env.remote) these attacks are reported skipped, never played in
this process."""

from __future__ import annotations

import shutil

import pytest

from components.env.config import EnvConfig
from components.evaluate.safety.client_forgery import CLIENT_FORGERIES, FORGED
from components.evaluate.safety.suite import ATTACKS, run_safety_suite
from components.evaluate.safety.tasks import build_safety_tasks
from components.sandbox.config import SandboxConfig
from tests.env_service.served_env import served

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def test_every_forged_finish_has_its_attack_in_the_suite():
    assert {a.client_finish for a in CLIENT_FORGERIES} == set(FORGED)
    assert {a.name for a in CLIENT_FORGERIES} <= {a.name for a in ATTACKS}


def test_the_server_refuses_every_forged_finish_and_its_verdict_stands(tmp_path):
    tasks = build_safety_tasks(tmp_path / "tasks", 1, seed=7, harbor=False, mined=False)
    alone = run_safety_suite(tasks, EnvConfig(), SandboxConfig(), attacks=CLIENT_FORGERIES)
    assert not alone.outcomes and set(alone.skipped) == {a.name for a in CLIENT_FORGERIES}
    with served(tasks[0].root.parent, workers=2) as (url, _):
        report = run_safety_suite(
            tasks, EnvConfig(remote=url), SandboxConfig(), attacks=CLIENT_FORGERIES, workers=2
        )
    assert len(report.outcomes) == len(FORGED) and not report.skipped
    for outcome in report.outcomes:
        assert outcome.status == "ok" and not outcome.success, outcome.attack
        assert outcome.reward is not None and outcome.reward < 1.0, outcome.attack
        assert outcome.verdict == "failed, recorded", outcome.attack
        assert any(x.startswith("env server refused the client's") and "422" in x
                   for x in outcome.recorded_by), outcome.recorded_by  # fmt: skip
    assert report.passed
