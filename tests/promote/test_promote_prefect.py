"""The Prefect path: a flow pauses with the typed approval form; another thread resumes it.

One session-wide prefect_test_harness (a temporary local server and database), per
Prefect's testing guide. Runs offline.
"""

from __future__ import annotations

import threading
import time

import pytest
from promote_helpers import candidate

from components.promote import approval
from components.promote.__main__ import main_reject
from components.promote.audit import read_history
from components.promote.registry import get_alias

# A Prefect server starts (~20-30 s on two cores): opt-in tier.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _resume_when_paused(flow_name: str, answer, errors: list) -> threading.Thread:
    """Wait (in a thread) for the run of `flow_name` to pause, then call answer(run_id)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    def run():
        try:
            deadline = time.monotonic() + 60
            with get_client(sync_client=True) as client:
                while time.monotonic() < deadline:
                    runs = client.read_flow_runs(
                        flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name]))
                    )
                    paused = [r for r in runs if r.state and r.state.is_paused()]
                    if paused:
                        answer(paused[0].id)
                        return
                    time.sleep(0.2)
            errors.append("flow never paused")
        except Exception as e:  # surfaced by the test, not lost in the thread
            errors.append(repr(e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _approval_flow(name: str, cfg, timeout_s: int = 60):
    from prefect import flow

    @flow(name=name)
    def promote(version: str) -> str:
        return approval.wait_for_approval_in_prefect(
            version, timeout_s=timeout_s, config=cfg, poll_interval_s=1
        )

    return promote


def test_prefect_form_approves_then_cli_resume_rejects(cfg, checkpoint, prefect_harness):
    from prefect.flow_runs import resume_flow_run

    assert approval.ApprovalInput.model_fields.keys() >= {"approve", "approver", "reason"}
    v1, _ = candidate(cfg, checkpoint)
    errors: list = []
    answer = {"approve": True, "approver": "alice", "reason": "reviewed in the UI"}
    thread = _resume_when_paused(
        "promote-approve", lambda run_id: resume_flow_run(run_id, run_input=answer), errors
    )
    assert _approval_flow("promote-approve", cfg)(v1) == "approved", errors
    thread.join(5)
    assert get_alias("champion", cfg) == v1
    assert read_history(cfg, action="approved")[0]["actor"] == "alice"

    # The same pause answered from the command line: `agentrl promote reject --flow-run-id`.
    v2, _ = candidate(cfg, checkpoint, n=2)
    store = ["--tracking-uri", cfg.tracking_uri, "--model", cfg.model_name,
             "--audit-path", cfg.audit_path]  # fmt: skip
    thread = _resume_when_paused(
        "promote-reject",
        lambda run_id: main_reject(
            [v2, "--reason", "no", "--approver", "bob", "--flow-run-id", str(run_id), *store]
        ),  # fmt: skip
        errors,
    )
    assert _approval_flow("promote-reject", cfg)(v2) == "rejected", errors
    thread.join(5)
    assert get_alias("champion", cfg) == v1 and get_alias("challenger", cfg) is None
    assert read_history(cfg, action="rejected")[0]["actor"] == "bob"


def test_prefect_pause_times_out_without_promoting(cfg, checkpoint, prefect_harness):
    v1, _ = candidate(cfg, checkpoint)
    assert _approval_flow("promote-timeout", cfg, timeout_s=2)(v1) == "timed_out"
    assert get_alias("champion", cfg) is None and get_alias("challenger", cfg) == v1
    assert [r["action"] for r in read_history(cfg)][-1] == "approval_timed_out"
