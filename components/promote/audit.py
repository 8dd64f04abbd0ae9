"""Append-only, hash-chained audit log of promotion decisions: who, when (UTC), why, on
what evidence, and what moved.

Each decision is written twice, because each copy answers a different question:
- a local JSONL file (`mlruns/audit.jsonl` by default), one record per line, only ever
  appended to and fsynced, each model's records a hash chain (chain.py): `agentrl promote
  history` reads and verifies it;
- MLflow, next to the model: the full record as a JSON artifact of the version's
  registration run (`audit/<time>-<action>-<id>.json`), a compact `audit.<action>` tag on
  the model version ({by, at, why, id}), and the chain head (`seq:hash`) as the
  registered-model tag `audit_chain_head` and the version tag `audit.chain_head`, so a
  deleted, truncated or appended last line is caught too.

The JSONL line is the commit point (write-ahead). Under the store's lock (lock.py):
1. the registry's `audit_pending` tag names the record about to be written;
2. the line is appended;
3. the record's effects are applied: its version and model tags, then the moves of
   `champion` / `challenger` from `aliases_before` to `aliases_after`, each a
   compare-and-set (an alias someone else moved is never touched);
4. the record is mirrored to MLflow and `audit_chain_head` set to it.
A process killed after 2 leaves `audit_pending` ahead of the head with the record in the
file: the next writer (`reconcile`) completes 3-4. Killed before 2, nothing happened.

The aliases the audit log records (the last record that moved one) are the truth:
`registry_drift` names every reserved alias the registry holds otherwise, and approval.py
refuses to build on it.
"""

from __future__ import annotations

import getpass
import json
import os
import uuid
from datetime import UTC, datetime

from components.promote import chain
from components.promote.client import (
    CHALLENGER,
    CHAMPION,
    RESERVED_ALIASES,
    find_model,
    mlflow_client,
    read_client,
    reserved,
)
from components.promote.config import PromotionConfig
from components.promote.errors import AuditIntegrityError
from components.promote.lock import promotion_lock

ACTIONS = (
    "registered",  # register_candidate: a new version with its lineage
    "gates_evaluated",  # request_approval: the gate decision, passed or not
    "challenger_set",  # gates passed: the version is challenger, approval pending
    "superseded",  # a newer challenger replaced a pending one
    "approved",  # a person approved: champion moved
    "rejected",  # a person rejected: challenger cleared, champion unchanged
    "rolled_back",  # champion restored to the previous approved champion
    "refused",  # an approve/reject/rollback was refused (nothing changed)
    "approval_timed_out",  # the Prefect pause ended without input (nothing changed)
)
HEAD_TAG = "audit_chain_head"  # registered-model tag: seq:hash of the last completed record
PENDING_TAG = "audit_pending"  # registered-model tag: seq:hash of the record being written


def default_actor() -> str:
    """Who runs this process: $USER, else the login name; a person confirms it with --approver."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return "unknown"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _allowed_move(action: str, version: str, before: dict, after: dict) -> bool:
    """Whether a record of `action` on `version` may move the reserved aliases this way:
    each action moves only what it means (an `approved` makes `version` champion...)."""
    moved = {a for a in RESERVED_ALIASES if before.get(a) != after.get(a)}
    cleared = before.get(CHALLENGER) == version and after.get(CHALLENGER) is None
    if not moved:
        return True
    if action == "challenger_set":
        return moved == {CHALLENGER} and after.get(CHALLENGER) == version
    if action == "approved":
        return after.get(CHAMPION) == version and (CHALLENGER not in moved or cleared)
    if action == "rolled_back":
        return moved == {CHAMPION} and after.get(CHAMPION) == version
    if action in ("rejected", "gates_evaluated"):
        return moved == {CHALLENGER} and cleared
    return False


def _move_plan(record: dict, now: dict) -> list[tuple[str, str | None]]:
    """(alias, target) moves still to do for `record`, given the registry's aliases `now`;
    AuditIntegrityError when one was moved by someone else (compare-and-set)."""
    before, after = reserved(record.get("aliases_before")), reserved(record.get("aliases_after"))
    plan = []
    for alias in RESERVED_ALIASES:
        was, want, current = before.get(alias), after.get(alias), now.get(alias)
        if want == was or current == want:
            continue
        if current != was:
            raise AuditIntegrityError(
                f"{alias} is {current or 'unset'} in the registry, not {was or 'unset'} as "
                f"{chain.describe(record)} expected: it was moved outside the approval "
                f"workflow and is left as it is; set it to {was or 'unset'} or inspect the "
                "registry by hand"
            )
        plan.append((alias, want))
    return plan


def _apply(record: dict, config: PromotionConfig, client) -> None:
    """The record's effects on the registry; idempotent, so a completion may repeat them."""
    name = config.model_name
    plan = _move_plan(record, reserved(client.get_registered_model(name).aliases))
    effects = record.get("effects") or {}
    for version, tags in (effects.get("version_tags") or {}).items():
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, str(value))
    for key, value in (effects.get("model_tags") or {}).items():
        client.set_registered_model_tag(name, key, str(value))
    for alias, target in plan:
        if target is None:
            client.delete_registered_model_alias(name, alias)
        else:
            client.set_registered_model_alias(name, alias, target)


def _to_mlflow(record: dict, config: PromotionConfig, client) -> None:
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version(config.model_name, record["version"])
    except MlflowException:
        return  # e.g. a refused approve of a version that does not exist: JSONL only
    if mv.run_id:
        client.log_text(
            mv.run_id,
            json.dumps(record, indent=2, sort_keys=True, default=str),
            record["mlflow_artifact"],
        )
    summary = {
        "by": record["actor"],
        "at": record["time_utc"],
        "why": record["reason"],
        "id": record["id"],
    }
    tags = {
        f"audit.{record['action']}": json.dumps(summary),
        "audit.last": f"{record['action']} by {record['actor']} at {record['time_utc']}",
        "audit.chain_head": chain.link(record),
    }
    for key, value in tags.items():
        client.set_model_version_tag(config.model_name, record["version"], key, value)


def _complete(record: dict, config: PromotionConfig, client) -> None:
    """Steps 3-4 of a decision whose line is written: apply, mirror, move the head."""
    _apply(record, config, client)
    _to_mlflow(record, config, client)
    client.set_registered_model_tag(config.model_name, HEAD_TAG, chain.link(record))


def reconcile(config: PromotionConfig, client) -> chain.LogScan:
    """Verify the log against the registry's chain head and complete a decision a killed
    process left half done; returns the scan. The caller holds the lock. Raises
    AuditIntegrityError (nothing written) when the log does not verify."""
    path = config.resolved_audit_path()
    log = chain.scan(path, config.model_name)
    tags = dict(client.get_registered_model(config.model_name).tags)
    problems, interrupted = chain.head_problems(
        log, chain.parse_link(tags.get(HEAD_TAG)), chain.parse_link(tags.get(PENDING_TAG))
    )
    problems = log.problems + problems
    if problems:
        raise AuditIntegrityError(
            f"audit log {path} does not verify: {'; '.join(problems)}. Nothing was changed; "
            "restore the log from the registry's audit artifacts or inspect it by hand"
        )
    if interrupted is not None:
        _complete(interrupted.record, config, client)
    return log


def audit_aliases(log: chain.LogScan) -> dict[str, str]:
    """champion/challenger as the audit log records them: the aliases after the last
    record that moved one (none: no alias)."""
    state: dict[str, str] = {}
    for entry in log.entries:
        before = reserved(entry.record.get("aliases_before"))
        after = reserved(entry.record.get("aliases_after"))
        if before != after:
            state = after
    return state


def registry_drift(log: chain.LogScan, aliases: dict) -> list[str]:
    """The reserved aliases where the registry (`aliases`) disagrees with the audit log."""
    expected, actual = audit_aliases(log), reserved(aliases)
    return [
        f"registry drift: {alias} is {actual.get(alias) or 'unset'} in the registry but "
        f"{expected.get(alias) or 'unset'} in the audit log (moved outside the approval "
        "workflow): set it back or inspect the registry by hand"
        for alias in RESERVED_ALIASES
        if actual.get(alias) != expected.get(alias)
    ]


def verify_log(
    config: PromotionConfig, client=None, aliases: dict | None = None
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the model's audit log, read-only: the chain in the file, its
    end against the registry's chain head, damaged lines, a decision in flight, and, given
    the registry's `aliases`, where they disagree with the log. Needs MLflow only when the
    log has chained records or `aliases` are given."""
    log = chain.scan(config.resolved_audit_path(), config.model_name)
    notes = [f"line {n} is damaged (not a JSON record) and was skipped" for n in log.damaged]
    problems = list(log.problems)
    if not log.chained and aliases is None:
        return problems, notes
    model = find_model(client or read_client(config), config)
    if model is None:
        if log.chained:
            problems.append(
                f"no registered model {config.model_name!r} in "
                f"{config.resolved_tracking_uri()} holds the chain head: the end of the log "
                f"(line {log.last.line}) cannot be checked"
            )
        return problems, notes
    tags = dict(model.tags)
    more, interrupted = chain.head_problems(
        log, chain.parse_link(tags.get(HEAD_TAG)), chain.parse_link(tags.get(PENDING_TAG))
    )
    problems += more
    if interrupted is not None:
        notes.append(
            f"line {interrupted.line}: {chain.describe(interrupted.record)} is in progress or "
            "was interrupted; the next promotion command completes it"
        )
    elif aliases is not None and not problems:
        problems += registry_drift(log, aliases)
    return problems, notes


# long: an audit record's fields, each named by its caller (keyword-only)
def record_decision(
    action: str,
    *,
    version: str,
    actor: str,
    reason: str,
    evidence: dict | None = None,
    aliases_before: dict | None = None,
    aliases_after: dict | None = None,
    effects: dict | None = None,
    config: PromotionConfig | None = None,
    client=None,
) -> dict:
    """Append one decision to the log, apply its effects, mirror it to MLflow; returns the
    record. `effects`: {"version_tags": {version: {tag: value}}, "model_tags": {tag: value}};
    reserved aliases move from `aliases_before` to `aliases_after`, and only as `action`
    means (ValueError otherwise). AuditIntegrityError, nothing written, when the log does
    not verify."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}; known: {ACTIONS}")
    version = str(version)
    if not _allowed_move(action, version, reserved(aliases_before), reserved(aliases_after)):
        raise ValueError(f"a {action!r} record of v{version} cannot move the aliases that way")
    config = config or PromotionConfig()
    record_id = uuid.uuid4().hex
    now = utc_now()
    stamp = now.replace(":", "").replace("-", "").replace(".", "")
    record = {
        "id": record_id,
        "time_utc": now,
        "action": action,
        "model": config.model_name,
        "version": version,
        "actor": actor,
        "reason": reason,
        "evidence": evidence or {},
        "aliases_before": aliases_before or {},
        "aliases_after": aliases_after or {},
        "effects": effects or {},
        "tracking_uri": config.resolved_tracking_uri(),
        "mlflow_artifact": f"audit/{stamp}-{action}-{record_id[:8]}.json",
    }
    with promotion_lock(config):
        client = client or mlflow_client(config)
        record = chain.seal(record, *reconcile(config, client).next_link())
        client.set_registered_model_tag(config.model_name, PENDING_TAG, chain.link(record))
        chain.append_line(config.resolved_audit_path(), record)
        _complete(record, config, client)
    return record


def read_history(
    config: PromotionConfig | None = None, version: str | None = None, action: str | None = None
) -> list[dict]:
    """Records of this registered model, oldest first, optionally of one version / action.
    Damaged lines are skipped (verify_log names them)."""
    config = config or PromotionConfig()
    return [
        e.record
        for e in chain.scan(config.resolved_audit_path(), config.model_name).entries
        if (version is None or e.record.get("version") == str(version))
        and (action is None or e.record.get("action") == action)
    ]
