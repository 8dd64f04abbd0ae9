"""The canonical trajectory record (docs/CONTRACTS.md) and its columnar form.

One record = one episode: a task, ordered events (user / assistant / environment), the
final reward with its separate terms, and metadata. Types are strict (a string is not a
number), and unknown fields are kept, never dropped: they travel in JSON `extra` columns so
later additions (token ids, logprobs per turn) survive ingestion unchanged.

Columnar form, written as Parquet by ingest.py:
  trajectories table, one row per record   (TRAJECTORY_COLUMNS)
  steps table, one row per event            (STEP_COLUMNS), joined on trajectory_id
`record_to_rows` and `rows_to_record` convert between the two and round-trip exactly.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA_VERSION = 1
ROLES = ("user", "assistant", "environment")


class _Strict(BaseModel):
    # strict: "1.0" is not a float and 1 is not a string; extra="allow": keep unknown fields;
    # allow_inf_nan=False: NaN and Infinity are not rewards (nor JSON).
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class UserEvent(_Strict):
    role: Literal["user"]
    content: str


class AssistantEvent(_Strict):
    role: Literal["assistant"]
    # None for a text-only turn (a final answer, or a reply the agent's harness could not
    # parse into an action); such a turn needs no observation after it.
    action: str | None = None
    arguments: dict[str, Any] | None = None
    content: str | None = None

    @field_validator("arguments")
    @classmethod
    def _args_need_action(cls, value, info):
        if value is not None and info.data.get("action") is None:
            raise ValueError("arguments given without an action")
        return value


class EnvironmentEvent(_Strict):
    role: Literal["environment"]
    observation: str
    truncated: bool = False


Event = Annotated[UserEvent | AssistantEvent | EnvironmentEvent, Field(discriminator="role")]


class Metadata(_Strict):
    policy: str | None = None
    model_version: str | None = None
    created_at: str | None = None
    num_tool_calls: int | None = Field(None, ge=0)
    num_tokens: int | None = Field(None, ge=0)
    split: str | None = None

    @field_validator("created_at")
    @classmethod
    def _iso_time(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as e:
                raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from e
        return value


class Trajectory(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    task: str
    trajectory: list[Event] = Field(min_length=1)
    # None: not scored (e.g. expert logs from another tool); a number is range-checked.
    reward: float | None = None
    reward_terms: dict[str, float] = Field(default_factory=dict)
    metadata: Metadata = Field(default_factory=Metadata)


TOP_FIELDS = tuple(Trajectory.model_fields)
META_FIELDS = tuple(Metadata.model_fields)
EVENT_FIELDS = {
    "user": ("role", "content"),
    "assistant": ("role", "action", "arguments", "content"),
    "environment": ("role", "observation", "truncated"),
}

# Column order of the two tables (see module docstring).
TRAJECTORY_COLUMNS = (
    "id",
    "task_id",
    "source",
    "schema_version",
    "task",
    "reward",
    "reward_terms",  # JSON object {term: value}
    "policy",
    "model_version",
    "created_at",
    "num_tool_calls",
    "num_tokens",
    "split",
    "num_steps",
    "metadata_extra",  # JSON object of metadata keys beyond the known ones
    "extra",  # JSON object of top-level keys beyond the known ones
    "content_hash",  # sha256 of the canonical JSON of the record
    "source_file",
    "source_index",  # 1-based line of a JSONL file, or index in a JSON array / file
)
STEP_COLUMNS = (
    "trajectory_id",
    "step",
    "role",
    "content",
    "action",
    "arguments",  # JSON object, or null when the event has no action
    "observation",
    "truncated",
    "extra",  # JSON object of per-event keys beyond the known ones (token ids, logprobs...)
)


def arrow_schemas():
    """(trajectory schema, step schema) as pyarrow schemas; imported lazily (CLI start-up)."""
    import pyarrow as pa

    s, i64, f64 = pa.string(), pa.int64(), pa.float64()
    traj = pa.schema(
        [
            ("id", s),
            ("task_id", s),
            ("source", s),
            ("schema_version", pa.int32()),
            ("task", s),
            ("reward", f64),
            ("reward_terms", s),
            ("policy", s),
            ("model_version", s),
            ("created_at", s),
            ("num_tool_calls", i64),
            ("num_tokens", i64),
            ("split", s),
            ("num_steps", i64),
            ("metadata_extra", s),
            ("extra", s),
            ("content_hash", s),
            ("source_file", s),
            ("source_index", i64),
        ]
    )
    steps = pa.schema(
        [
            ("trajectory_id", s),
            ("step", pa.int32()),
            ("role", s),
            ("content", s),
            ("action", s),
            ("arguments", s),
            ("observation", s),
            ("truncated", pa.bool_()),
            ("extra", s),
        ]
    )
    assert tuple(traj.names) == TRAJECTORY_COLUMNS and tuple(steps.names) == STEP_COLUMNS
    return traj, steps


# One encoder for every call: json.dumps builds a new one per call when given options,
# which is a third of the cost for the small objects ingest encodes ~10 times a record.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(obj: Any) -> str:
    """Key-sorted, compact JSON: the byte form used for content hashes."""
    return _CANONICAL.encode(obj)


def content_hash(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


def _json_or_none(d: dict) -> str | None:
    return canonical_json(d) if d else None


def error_path(loc: tuple) -> str:
    """('trajectory', 2, 'environment', 'observation') -> 'trajectory[2].observation'."""
    out = ""
    prev_int = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            prev_int = True
            continue
        if prev_int and part in ROLES:  # the discriminator tag pydantic adds to the path
            prev_int = False
            continue
        out += f".{part}" if out else str(part)
        prev_int = False
    return out or "<record>"


def parse_record(obj: Any, record_name: str) -> tuple[Trajectory | None, list[str]]:
    """Check one canonical record. Returns (model, []) or (None, reasons).

    Each reason reads "record <name> field <path>: <problem>".
    """
    if not isinstance(obj, dict):
        return None, [f"record {record_name} field <record>: must be a JSON object"]
    try:
        model = Trajectory.model_validate(obj)
    except ValidationError as e:
        name = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else record_name
        return None, [
            f"record {name} field {error_path(err['loc'])}: {err['msg']}"
            + (f" (got {type(err['input']).__name__})" if err["type"].endswith("_type") else "")
            for err in e.errors()
        ]
    return model, []


def record_to_rows(
    model: Trajectory, source_file: str, source_index: int
) -> tuple[dict, list[dict]]:
    """One trajectory row and its step rows, from a checked record."""
    # Work on the dumped dict: attribute access on pydantic models is several times slower.
    record = model.model_dump(mode="json")
    meta = record["metadata"]
    # An episode's verdict MAC (components/verifier/provenance.py) is keyed per installation:
    # kept in versioned data it would make the same expert data hash differently on every
    # machine, and no other installation could check it. Trainers read signed verdicts
    # from their own run's samples, never from data/.
    meta.pop("verdict_mac", None)
    traj_row = {
        "id": record["id"],
        "task_id": record["task_id"],
        "source": record["source"],
        "schema_version": record["schema_version"],
        "task": record["task"],
        "reward": record["reward"],
        "reward_terms": canonical_json(record["reward_terms"]),
        **{k: meta[k] for k in META_FIELDS},
        "num_steps": len(record["trajectory"]),
        "metadata_extra": _json_or_none({k: v for k, v in meta.items() if k not in META_FIELDS}),
        "extra": _json_or_none({k: v for k, v in record.items() if k not in TOP_FIELDS}),
        "content_hash": content_hash(record),
        "source_file": source_file,
        "source_index": source_index,
    }
    steps = []
    for i, ev in enumerate(record["trajectory"]):
        role = ev["role"]
        args = ev.get("arguments")
        steps.append(
            {
                "trajectory_id": record["id"],
                "step": i,
                "role": role,
                "content": ev.get("content"),
                "action": ev.get("action"),
                "arguments": None if args is None else canonical_json(args),
                "observation": ev.get("observation"),
                "truncated": ev.get("truncated"),
                "extra": _json_or_none(
                    {k: v for k, v in ev.items() if k not in EVENT_FIELDS[role]}
                ),
            }
        )
    return traj_row, steps


def rows_to_record(traj_row: dict, step_rows: list[dict]) -> dict:
    """Inverse of record_to_rows: the canonical record (unknown fields restored)."""
    events = []
    for s in sorted(step_rows, key=lambda r: r["step"]):
        ev: dict[str, Any] = {"role": s["role"]}
        if s["role"] == "user":
            ev["content"] = s["content"]
        elif s["role"] == "assistant":
            ev["action"] = s["action"]
            ev["arguments"] = None if s["arguments"] is None else json.loads(s["arguments"])
            ev["content"] = s["content"]
        else:
            ev["observation"] = s["observation"]
            ev["truncated"] = bool(s["truncated"])
        ev.update(json.loads(s["extra"]) if s["extra"] else {})
        events.append(ev)
    metadata = {k: traj_row[k] for k in META_FIELDS}
    metadata.update(json.loads(traj_row["metadata_extra"]) if traj_row["metadata_extra"] else {})
    record = {
        "schema_version": int(traj_row["schema_version"]),
        "id": traj_row["id"],
        "task_id": traj_row["task_id"],
        "source": traj_row["source"],
        "task": traj_row["task"],
        "trajectory": events,
        "reward": traj_row["reward"],
        "reward_terms": json.loads(traj_row["reward_terms"]),
        "metadata": metadata,
    }
    record.update(json.loads(traj_row["extra"]) if traj_row["extra"] else {})
    return record
