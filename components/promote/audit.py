"""Append-only audit log of promotion decisions: who, when (UTC), why, on what evidence.

Each decision is written twice, because each copy answers a different question:
- a local JSONL file (`mlruns/audit.jsonl` by default), one record per line, only ever
  appended to and fsynced: `agentrl promote history` reads it, and it survives a registry
  that was edited by hand;
- MLflow, next to the model: the full record as a JSON artifact of the version's
  registration run (`audit/<time>-<action>-<id>.json`) and a compact `audit.<action>` tag
  on the model version ({by, at, why, id}), so the MLflow UI shows who approved what.

The JSONL line is written first: if MLflow then fails, the local log still holds the
decision and the error is raised to the caller.
"""

from __future__ import annotations

import getpass
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

from components.promote.client import mlflow_client
from components.promote.config import PromotionConfig

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


def default_actor() -> str:
    """Who runs this process: $USER, else the login name; a person confirms it with --approver."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return "unknown"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    # O_APPEND: concurrent writers each land whole lines at the end; never rewritten.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _to_mlflow(record: dict, config: PromotionConfig, client) -> None:
    from mlflow.exceptions import MlflowException

    if client is None:
        client = mlflow_client(config)
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
    client.set_model_version_tag(
        config.model_name, record["version"], f"audit.{record['action']}", json.dumps(summary)
    )
    client.set_model_version_tag(
        config.model_name,
        record["version"],
        "audit.last",
        f"{record['action']} by {record['actor']} at {record['time_utc']}",
    )


def record_decision(
    action: str,
    *,
    version: str,
    actor: str,
    reason: str,
    evidence: dict | None = None,
    aliases_before: dict | None = None,
    aliases_after: dict | None = None,
    config: PromotionConfig | None = None,
    client=None,
) -> dict:
    """Append one decision to the JSONL log and to MLflow; returns the record."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}; known: {ACTIONS}")
    config = config or PromotionConfig()
    record_id = uuid.uuid4().hex
    now = utc_now()
    stamp = now.replace(":", "").replace("-", "").replace(".", "")
    record = {
        "id": record_id,
        "time_utc": now,
        "action": action,
        "model": config.model_name,
        "version": str(version),
        "actor": actor,
        "reason": reason,
        "evidence": evidence or {},
        "aliases_before": aliases_before or {},
        "aliases_after": aliases_after or {},
        "tracking_uri": config.resolved_tracking_uri(),
        "mlflow_artifact": f"audit/{stamp}-{action}-{record_id[:8]}.json",
    }
    _append_jsonl(config.resolved_audit_path(), record)
    _to_mlflow(record, config, client)
    return record


def read_history(
    config: PromotionConfig | None = None, version: str | None = None, action: str | None = None
) -> list[dict]:
    """Records of this registered model, oldest first, optionally of one version / action."""
    config = config or PromotionConfig()
    path = config.resolved_audit_path()
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("model") != config.model_name:
            continue
        if version is not None and rec.get("version") != str(version):
            continue
        if action is not None and rec.get("action") != action:
            continue
        out.append(rec)
    return out
