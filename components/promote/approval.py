"""Approval workflow: gates make a `challenger`; only a person's approval moves `champion`.

    request_approval(version, decision, evidence)  gates passed -> challenger + pending request
    approve(version, approver, reason)             the ONLY function that moves `champion`
    reject(version, approver, reason)              challenger cleared, champion unchanged
    rollback(approver, reason)                     champion back to the previous approved one
    wait_for_approval_in_prefect(version, ...)     the same decision from the Prefect UI form

State lives in the MLflow registry, so every client (CLI, flow, UI) sees the same thing:
- aliases `challenger` / `champion` on the registered model;
- model-version tags: approval_status (gates_failed | pending | superseded | approved |
  rejected | rolled_back), gates_passed, gate_checks (JSON), metric.*, approved_by/_at/
  _reason, rejected_by/..., rolled_back_by/...;
- registered-model tags: champion_history (JSON list of versions, oldest first; rollback
  pops it) and previous_champion (its second-to-last entry, for people reading the UI).
A version that was decided (approved, rejected, rolled back) is final: a retrained model
is a new version. Every decision, and every refused attempt, goes to the audit log.

Every decision is linearizable and on record: it runs under the store's lock (lock.py),
first completes a decision a killed process left half done and checks that the registry's
aliases are the ones the audit log records (refused, with the drift named, when they are
not), then writes its audit record, which applies the tag and alias changes
(audit.record_decision: write-ahead, compare-and-set on every alias). So nothing is ever
"cleaned up" after a failure: a recorded decision is completed by the next command, an
unrecorded one never moved anything. `status` waits out a writer (shared lock) and
warns where a decision would be refused.

The identity of an approver is what they type (--approver, defaulting to $USER, or the
Prefect form field); the local Prefect server and MLflow store have no authentication.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import NoReturn

from components.promote.audit import (
    reconcile,
    record_decision,
    registry_drift,
    utc_now,
    verify_log,
)
from components.promote.client import CHALLENGER, CHAMPION, find_model, mlflow_client, read_client
from components.promote.config import PromotionConfig
from components.promote.errors import PromotionRefused, UnknownModel
from components.promote.gates import GateDecision
from components.promote.lock import promotion_lock, shared_lock
from components.promote.registry import LINEAGE_KEYS

DECIDED = ("approved", "rejected", "rolled_back")
HISTORY_KEEP = 50  # champion_history entries kept in the registered-model tag


def _aliases(client, config: PromotionConfig) -> dict[str, str]:
    model = client.get_registered_model(config.model_name)
    return {alias: str(v) for alias, v in model.aliases.items()}


def _model_tags(client, config: PromotionConfig) -> dict[str, str]:
    return dict(client.get_registered_model(config.model_name).tags)


def _champion_history(client, config: PromotionConfig) -> list[str]:
    return [str(v) for v in json.loads(_model_tags(client, config).get("champion_history", "[]"))]


def _version_tags(client, config: PromotionConfig, version: str) -> dict[str, str] | None:
    from mlflow.exceptions import MlflowException

    try:
        return dict(client.get_model_version(config.model_name, version).tags)
    except MlflowException:
        return None


def _refuse(
    action: str,
    version: str,
    actor: str,
    reason: str,
    problems: list[str],
    before: dict,
    config: PromotionConfig,
    client,
) -> NoReturn:
    record_decision(
        "refused",
        version=version,
        actor=actor or "<missing>",
        reason=reason,
        evidence={"attempted": action, "problems": problems},
        aliases_before=before,
        aliases_after=before,
        config=config,
        client=client,
    )
    raise PromotionRefused(f"{action} of version {version} refused: " + "; ".join(problems))


def _checked_state(client, config, action: str, version, actor: str, reason: str) -> dict:
    """The registry's aliases, once a decision a killed process left half done is complete;
    refused (recorded) when they are not the ones the audit log records. Under the lock.
    `version` None: the attempt is recorded against the current champion (rollback)."""
    log = reconcile(config, client)
    before = _aliases(client, config)
    drift = registry_drift(log, before)
    if drift:
        target = before.get(CHAMPION, "") if version is None else version
        _refuse(action, target, actor, reason, drift, before, config, client)
    return before


def _person_problems(approver: str, reason: str) -> list[str]:
    problems = []
    if not (approver or "").strip():
        problems.append("an approver identity is required")
    if not (reason or "").strip():
        problems.append("a reason is required")
    return problems


def request_approval(
    version: str,
    decision: GateDecision | dict,
    evidence: dict,
    *,
    config: PromotionConfig | None = None,
    actor: str = "agentrl-pipeline",
) -> bool:
    """Record the gate decision; if it passed, make `version` the challenger awaiting approval.

    Returns True when the version is now challenger with a pending request. `evidence` is
    whatever a reviewer needs (candidate/champion metrics, data validation, run ids, report
    URIs); it is stored with the audit records. Never touches `champion`. A caller that
    gated against the champion holds promotion_lock around both, so the champion it
    compared with is still the champion when the request is recorded.
    """
    config = config or PromotionConfig()
    version = str(version)
    dec = decision if isinstance(decision, GateDecision) else GateDecision.from_dict(decision)
    with promotion_lock(config):
        client = mlflow_client(config)
        before = _checked_state(client, config, "request_approval", version, actor, "gates")
        tags = _version_tags(client, config, version)
        if tags is None:
            problems = ["no such model version"]
        elif tags.get("approval_status") in DECIDED:
            problems = [f"version is already {tags['approval_status']}; register a new version"]
        else:
            problems = []
        if problems:
            _refuse("request_approval", version, actor, "gates", problems, before, config, client)
        full_evidence = _record_gates(client, config, version, dec, evidence, actor, before)
        if not dec.passed:
            return False
        _make_challenger(client, config, version, full_evidence, actor, before)
        return True


def _record_gates(client, config, version, dec: GateDecision, evidence, actor, before) -> dict:
    """Audit the gate decision, tagging the version with its gate results and metrics (a
    failed version stops being challenger); returns the evidence with the gates added."""
    metrics = {f"metric.{k}": v for k, v in (evidence.get("candidate_metrics") or {}).items()}
    tags = {
        "gates_passed": str(dec.passed).lower(),
        "gate_checks": json.dumps(dec.to_dict()["checks"], default=str),
        **{k: ("None" if v is None else v) for k, v in metrics.items()},
    }
    after = dict(before)
    if not dec.passed:
        tags["approval_status"] = "gates_failed"
        if before.get(CHALLENGER) == version:  # re-evaluated and failed: no longer a candidate
            del after[CHALLENGER]
    full_evidence = {**evidence, "gates": dec.to_dict()}
    gate_reason = "all gates passed" if dec.passed else "failed: " + ", ".join(dec.failed())
    record_decision(
        "gates_evaluated",
        version=version,
        actor=actor,
        reason=gate_reason,
        evidence=full_evidence,
        aliases_before=before,
        aliases_after=after,
        effects={"version_tags": {version: tags}},
        config=config,
        client=client,
    )
    return full_evidence


def _make_challenger(client, config, version: str, evidence: dict, actor: str, before) -> None:
    """`version` becomes the challenger with a pending request; a pending one it replaces
    is marked superseded."""
    old = before.get(CHALLENGER)
    if (
        old
        and old != version
        and (_version_tags(client, config, old) or {}).get("approval_status") == "pending"
    ):
        record_decision(
            "superseded",
            version=old,
            actor=actor,
            reason=f"version {version} passed the gates and became challenger",
            evidence={"superseded_by": version},
            aliases_before=before,
            aliases_after=before,  # challenger_set moves the alias
            effects={"version_tags": {old: {"approval_status": "superseded"}}},
            config=config,
            client=client,
        )
    pending = {"approval_status": "pending", "approval_requested_at": utc_now()}
    record_decision(
        "challenger_set",
        version=version,
        actor=actor,
        reason="gates passed; awaiting a person's approval",
        evidence=evidence,
        aliases_before=before,
        aliases_after={**before, CHALLENGER: version},
        effects={"version_tags": {version: pending}},
        config=config,
        client=client,
    )


def _approval_problems(client, config: PromotionConfig, version: str, before: dict) -> list[str]:
    tags = _version_tags(client, config, version)
    if tags is None:
        return ["no such model version"]
    problems = []
    if before.get(CHALLENGER) != version:
        problems.append(f"not the current challenger (challenger is {before.get(CHALLENGER)})")
    if tags.get("approval_status") != "pending":
        problems.append(f"no pending approval request (status {tags.get('approval_status')})")
    checks = json.loads(tags.get("gate_checks", "[]"))
    if tags.get("gates_passed") != "true" or not checks or not all(c["passed"] for c in checks):
        problems.append("gates did not pass")
    return problems


def approve(
    version: str, approver: str, reason: str, *, config: PromotionConfig | None = None
) -> dict:
    """Move `champion` to `version`: the only function that does.

    Refused (PromotionRefused, recorded) unless the version is the current challenger with a
    pending request and passed gates, an approver and a reason are given, and the registry's
    aliases are the ones the audit log records. Returns the audit record, whose writing
    moves the aliases (so champion never stands on an unrecorded decision).
    """
    config = config or PromotionConfig()
    version = str(version)
    with promotion_lock(config):
        client = mlflow_client(config)
        before = _checked_state(client, config, "approve", version, approver, reason)
        problems = _person_problems(approver, reason) + _approval_problems(
            client, config, version, before
        )
        if problems:
            _refuse("approve", version, approver, reason, problems, before, config, client)
        tags = _version_tags(client, config, version)
        old_champion = before.get(CHAMPION)
        history = (_champion_history(client, config) + [version])[-HISTORY_KEEP:]
        evidence = {
            **_gate_evidence(tags),
            "request": json.loads(tags.get("audit.challenger_set", "{}")),
            "lineage": {k: tags.get(k) for k in LINEAGE_KEYS},
            "previous_champion": old_champion,
        }
        approved = {"approval_status": "approved", "approved_by": approver,
                    "approved_at": utc_now(), "approved_reason": reason}  # fmt: skip
        after = {**{k: v for k, v in before.items() if k != CHALLENGER}, CHAMPION: version}
        return record_decision(
            "approved",
            version=version,
            actor=approver,
            reason=reason,
            evidence=evidence,
            aliases_before=before,
            aliases_after=after,
            effects={
                "version_tags": {version: approved},
                "model_tags": {
                    "champion_history": json.dumps(history),
                    "previous_champion": old_champion or "",
                },  # fmt: skip
            },
            config=config,
            client=client,
        )


def reject(
    version: str, approver: str, reason: str, *, config: PromotionConfig | None = None
) -> dict:
    """Reject a pending challenger: the challenger alias goes, `champion` stays. Recorded."""
    config = config or PromotionConfig()
    version = str(version)
    with promotion_lock(config):
        client = mlflow_client(config)
        before = _checked_state(client, config, "reject", version, approver, reason)
        tags = _version_tags(client, config, version)
        problems = _person_problems(approver, reason)
        if tags is None:
            problems.append("no such model version")
        elif tags.get("approval_status") != "pending":
            problems.append(f"no pending approval request (status {tags.get('approval_status')})")
        if problems:
            _refuse("reject", version, approver, reason, problems, before, config, client)
        rejected = {"approval_status": "rejected", "rejected_by": approver,
                    "rejected_at": utc_now(), "rejected_reason": reason}  # fmt: skip
        after = {k: v for k, v in before.items() if k != CHALLENGER or v != version}
        return record_decision(
            "rejected",
            version=version,
            actor=approver,
            reason=reason,
            evidence=_gate_evidence(tags),
            aliases_before=before,
            aliases_after=after,
            effects={"version_tags": {version: rejected}},
            config=config,
            client=client,
        )


def _gate_evidence(tags: dict[str, str]) -> dict:
    """What a decision on a version rests on: its gate checks and the metrics they saw."""
    return {
        "gate_checks": json.loads(tags.get("gate_checks", "[]")),
        "metrics": {k: v for k, v in tags.items() if k.startswith("metric.")},
    }


def _rollback_problems(client, config, current: str | None, history: list[str]) -> list[str]:
    if current is None:
        return ["there is no champion"]
    if not history or history[-1] != current:
        return [
            f"champion {current} was not set by the approval workflow; inspect the registry by hand"
        ]
    if len(history) < 2:
        return ["no previous champion to restore"]
    if not (_version_tags(client, config, history[-2]) or {}).get("approved_by"):
        return [f"previous champion {history[-2]} has no recorded approval"]
    return []


def rollback(approver: str, reason: str, *, config: PromotionConfig | None = None) -> dict:
    """Point `champion` back at the champion it replaced (an earlier approved version).

    The rolled-back version is marked rolled_back (final). Repeated rollbacks walk further
    back through champion_history. Refused when there is no earlier approved champion, or
    when the registry's champion is not the one the audit log records.
    """
    config = config or PromotionConfig()
    with promotion_lock(config):
        client = mlflow_client(config)
        before = _checked_state(client, config, "rollback", None, approver, reason)
        current = before.get(CHAMPION)
        history = _champion_history(client, config)
        problems = _person_problems(approver, reason) + _rollback_problems(
            client, config, current, history
        )
        if problems:
            _refuse("rollback", current or "", approver, reason, problems, before, config, client)
        target, history = history[-2], history[:-1]
        rolled_back = {"approval_status": "rolled_back", "rolled_back_by": approver,
                       "rolled_back_at": utc_now(), "rolled_back_reason": reason}  # fmt: skip
        return record_decision(
            "rolled_back",
            version=target,
            actor=approver,
            reason=reason,
            evidence={"rolled_back_from": current, "restored": target, "champion_history": history},
            aliases_before=before,
            aliases_after={**before, CHAMPION: target},
            effects={
                "version_tags": {current: rolled_back},
                "model_tags": {
                    "champion_history": json.dumps(history),
                    "previous_champion": history[-2] if len(history) > 1 else "",
                },
            },  # fmt: skip
            config=config,
            client=client,
        )


def pending_approvals(config: PromotionConfig | None = None) -> list[dict]:
    """Versions awaiting a person's decision (normally just the challenger)."""
    from components.promote.registry import list_versions

    return [v for v in list_versions(config) if v["tags"].get("approval_status") == "pending"]


def status(config: PromotionConfig | None = None) -> dict:
    """Aliases, champion history, pending requests, whether the champion was approved, and
    warnings: an audit log that does not verify, registry aliases it does not record, a
    decision in flight. Read-only: waits out a writer (shared_lock), creates nothing
    (UnknownModel instead)."""
    from components.verifier.version import verifier_version

    config = config or PromotionConfig()
    with shared_lock(config):
        client = read_client(config)
        model = find_model(client, config)
        if model is None:
            raise UnknownModel(
                f"no registered model {config.model_name!r} in {config.resolved_tracking_uri()}"
            )
        aliases = {alias: str(v) for alias, v in model.aliases.items()}
        tags = dict(model.tags)
        champion = aliases.get(CHAMPION)
        champ_tags = (_version_tags(client, config, champion) or {}) if champion else {}
        problems, notes = verify_log(config, client, aliases=aliases)
        pending = pending_approvals(config)
    return {
        "model": config.model_name,
        "tracking_uri": config.resolved_tracking_uri(),
        "aliases": aliases,
        "champion_approved_by": champ_tags.get("approved_by"),
        # Which verifier judged the champion's evaluation, and the current one: they differ
        # after a verifier fix until the champion's evaluation is rescored.
        "champion_verifier_version": champ_tags.get("verifier_version") or None,
        "current_verifier_version": verifier_version(),
        "champion_history": [str(v) for v in json.loads(tags.get("champion_history", "[]"))],
        "previous_champion": tags.get("previous_champion") or None,
        "pending": [
            {
                "version": v["version"],
                "requested_at": v["tags"].get("approval_requested_at"),
                "aliases": v["aliases"],
            }
            for v in pending
        ],
        "warnings": problems + notes,
    }


@lru_cache(maxsize=1)
def _approval_input_class():
    # Built on first use so importing this module (the CLI) does not import Prefect.
    from prefect.input import RunInput
    from pydantic import Field

    class ApprovalInput(RunInput):
        """The form a person fills in the Prefect UI to resume a paused promotion run."""

        approve: bool = Field(description="true: promote to champion; false: reject")
        approver: str = Field(min_length=1, description="your name or login (recorded)")
        reason: str = Field(min_length=1, description="why (recorded in the audit log)")

    ApprovalInput.__module__ = __name__
    return ApprovalInput


def __getattr__(name: str):
    if name == "ApprovalInput":
        return _approval_input_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def wait_for_approval_in_prefect(
    version: str,
    timeout_s: int = 24 * 3600,
    *,
    config: PromotionConfig | None = None,
    poll_interval_s: int = 10,
) -> str:
    """Pause the current flow run until a person fills the approval form, then decide.

    Must run inside a Prefect flow run. The run shows as Paused in the UI with a typed form
    (ApprovalInput); resuming it with approve=true calls approve(), false calls reject(),
    so the same rules and audit apply as on the command line. Returns "approved",
    "rejected", or "timed_out" (nothing changed, the request stays pending and can still be
    decided with `agentrl promote approve|reject`). A refused approval raises PromotionRefused.
    """
    from prefect.exceptions import FlowPauseTimeout
    from prefect.flow_runs import pause_flow_run

    config = config or PromotionConfig()
    version = str(version)
    client = mlflow_client(config)
    before = _aliases(client, config)
    problems = _approval_problems(client, config, version, before)
    if problems:  # nothing to wait for; say so before anyone is asked
        raise PromotionRefused(f"version {version} cannot be approved: " + "; ".join(problems))
    tags = _version_tags(client, config, version) or {}
    checks = "\n".join(f"- {c['name']}: {c['reason']}" for c in json.loads(tags["gate_checks"]))
    description = (
        f"### Promote {config.model_name} version {version} to champion?\n\n"
        f"Current champion: {before.get(CHAMPION) or 'none'}. Data "
        f"{tags.get('data_version')}, commit {tags.get('git_commit')}, eval report "
        f"{tags.get('eval_report_uri') or '-'}, safety report "
        f"{tags.get('safety_report_uri') or '-'}.\n\nGates:\n{checks}\n"
    )
    form = _approval_input_class().with_initial_data(description=description, approve=False)
    try:
        answer = pause_flow_run(
            wait_for_input=form,
            timeout=timeout_s,
            poll_interval=poll_interval_s,
            key=f"approve-{config.model_name}-{version}",
        )
    except FlowPauseTimeout:
        record_decision(
            "approval_timed_out",
            version=version,
            actor="agentrl-pipeline",
            reason=f"no decision within {timeout_s} s; request stays pending",
            aliases_before=before,
            aliases_after=before,
            config=config,
            client=client,
        )
        return "timed_out"
    if answer.approve:
        approve(version, answer.approver, answer.reason, config=config)
        return "approved"
    reject(version, answer.approver, answer.reason, config=config)
    return "rejected"
