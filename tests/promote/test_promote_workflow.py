"""Register -> gates -> challenger -> approve / reject / rollback on a real MLflow SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from promote_helpers import PASSING, candidate

from components.promote import approval, audit, client, registry
from components.promote.approval import PromotionRefused, approve, reject, rollback, status
from components.promote.audit import read_history
from components.promote.registry import get_alias, get_version, list_versions


def actions(cfg, version=None) -> list[str]:
    return [r["action"] for r in read_history(cfg, version=version)]


def test_full_path_champion_moves_only_on_approval_with_audit(cfg, checkpoint):
    v1, passed = candidate(cfg, checkpoint)
    assert passed and v1 == "1"
    assert get_alias("challenger", cfg) == "1" and get_alias("champion", cfg) is None

    record = approve(v1, "alice", "eval and safety reports reviewed", config=cfg)
    assert get_alias("champion", cfg) == "1"
    assert get_alias("challenger", cfg) is None
    assert actions(cfg, "1") == ["registered", "gates_evaluated", "challenger_set", "approved"]
    assert record["actor"] == "alice" and record["time_utc"].endswith("+00:00")
    assert record["evidence"]["lineage"]["data_version"] == "data-v1"
    assert all(c["passed"] for c in record["evidence"]["gate_checks"])

    # The same decision is in MLflow: version tags and a JSON artifact of the version's run.
    v = get_version("1", cfg)
    assert v["tags"]["approval_status"] == "approved" and v["tags"]["approved_by"] == "alice"
    assert json.loads(v["tags"]["audit.approved"])["by"] == "alice"
    assert v["tags"]["training_run_id"] == "run1" and v["tags"]["git_commit"] == "abc123"
    mlflow = client.mlflow_client(cfg)
    local = Path(mlflow.download_artifacts(v["run_id"], record["mlflow_artifact"]))
    assert json.loads(local.read_text())["id"] == record["id"]
    # Loading the champion is: download the folder, hand it to load_policy.
    folder = registry.download_version("champion", cfg)
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()

    # A second candidate is held to the champion's success rate + margin.
    v2, passed = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    assert passed
    approve(v2, "bob", "beats champion by 10 points", config=cfg)
    st = status(cfg)
    assert st["aliases"] == {"champion": "2"}
    assert st["champion_history"] == ["1", "2"] and st["previous_champion"] == "1"
    assert st["champion_approved_by"] == "bob" and st["pending"] == []


def test_reject_leaves_champion_and_is_recorded(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    approve(v1, "alice", "ok", config=cfg)
    v2, passed = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    assert passed and get_alias("challenger", cfg) == v2
    rec = reject(v2, "carol", "too many unrelated file edits in samples", config=cfg)
    assert get_alias("champion", cfg) == v1 and get_alias("challenger", cfg) is None
    assert rec["action"] == "rejected" and rec["actor"] == "carol"
    assert get_version(v2, cfg)["tags"]["rejected_by"] == "carol"
    # A rejected version is final: it can be neither approved nor re-requested.
    with pytest.raises(PromotionRefused):
        approve(v2, "alice", "changed my mind", config=cfg)
    assert get_alias("champion", cfg) == v1


def test_gates_fail_no_challenger_and_approve_refused(cfg, checkpoint):
    v1, passed = candidate(cfg, checkpoint, {**PASSING, "safety_violation_rate": 0.2})
    assert not passed
    assert get_alias("challenger", cfg) is None
    assert get_version(v1, cfg)["tags"]["approval_status"] == "gates_failed"
    with pytest.raises(PromotionRefused, match="gates did not pass"):
        approve(v1, "alice", "ship it anyway", config=cfg)
    assert get_alias("champion", cfg) is None
    gates = read_history(cfg, version=v1, action="gates_evaluated")[0]
    assert "safety_violation_rate" in gates["reason"]
    refused = read_history(cfg, action="refused")
    assert refused[0]["actor"] == "alice" and refused[0]["evidence"]["attempted"] == "approve"


def test_approve_without_pending_request_refused(cfg, checkpoint):
    version = registry.register_candidate(checkpoint, _lineage(), cfg, actor="trainer")
    with pytest.raises(PromotionRefused, match="no pending approval request"):
        approve(version, "alice", "looks fine", config=cfg)
    with pytest.raises(PromotionRefused, match="no such model version"):
        approve("99", "alice", "looks fine", config=cfg)
    assert get_alias("champion", cfg) is None
    assert actions(cfg) == ["registered", "refused", "refused"]


def test_approve_of_non_challenger_refused(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    v2, _ = candidate(cfg, checkpoint, n=2)  # supersedes v1's request
    assert get_alias("challenger", cfg) == v2
    assert get_version(v1, cfg)["tags"]["approval_status"] == "superseded"
    with pytest.raises(PromotionRefused, match="not the current challenger"):
        approve(v1, "alice", "the first one", config=cfg)
    assert get_alias("champion", cfg) is None
    assert "superseded" in actions(cfg, v1)


def test_approve_needs_person_and_reason(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    for who, why in (("", "ok"), ("alice", "  ")):
        with pytest.raises(PromotionRefused, match="required"):
            approve(v1, who, why, config=cfg)
    assert get_alias("champion", cfg) is None


def test_champion_never_moves_without_a_record(cfg, checkpoint, monkeypatch):
    v1, _ = candidate(cfg, checkpoint)
    real = audit.record_decision

    def failing(action, **kw):
        if action == "approved":
            raise OSError("disk full")
        return real(action, **kw)

    monkeypatch.setattr(approval, "record_decision", failing)
    with pytest.raises(OSError):
        approve(v1, "alice", "ok", config=cfg)
    assert get_alias("champion", cfg) is None


def test_rollback_restores_previous_champion_with_audit(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    with pytest.raises(PromotionRefused, match="there is no champion"):
        rollback("dave", "incident", config=cfg)
    approve(v1, "alice", "ok", config=cfg)
    with pytest.raises(PromotionRefused, match="no previous champion"):
        rollback("dave", "incident", config=cfg)
    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    approve(v2, "bob", "better", config=cfg)
    assert get_alias("champion", cfg) == v2

    rec = rollback("dave", "v2 loops forever on long tasks in production", config=cfg)
    assert get_alias("champion", cfg) == v1
    assert rec["action"] == "rolled_back" and rec["actor"] == "dave"
    assert rec["evidence"] == {"rolled_back_from": v2, "restored": v1, "champion_history": [v1]}
    assert get_version(v2, cfg)["tags"]["approval_status"] == "rolled_back"
    assert status(cfg)["champion_history"] == [v1]
    # A rolled-back version is final.
    with pytest.raises(PromotionRefused):
        approve(v2, "bob", "again", config=cfg)
    assert [v["version"] for v in list_versions(cfg)] == [v1, v2]


def _lineage():
    from promote_helpers import lineage

    return lineage()


def test_an_adapter_candidate_whose_base_is_gone_is_refused_and_nothing_registered(cfg, checkpoint):
    """A LoRA candidate registers merged into its base (test_registered_model.py); with the
    base folder missing it is refused naming that folder, and no version appears."""
    (checkpoint / "agentrl_adapter.json").write_text(
        json.dumps({"base_path": "runs/base-that-is-gone", "base_sha256": "abc123"})
    )
    with pytest.raises(FileNotFoundError, match="base-that-is-gone"):
        registry.register_candidate(checkpoint, _lineage(), cfg, actor="trainer")
    assert list_versions(cfg) == []
