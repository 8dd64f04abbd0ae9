"""ATIF (Harbor's Agent Trajectory Interchange Format) in and out of canonical records.

ATIF (harbor/models/trajectories, RFC 0001) is one JSON document per agent run:
`{"schema_version": "ATIF-v1.x", "session_id", "agent": {name, version, model_name},
"steps": [{step_id, source: system|user|agent, message, tool_calls, observation,
metrics, ...}], "final_metrics", "extra"}`. An agent step may call several tools; its
observation holds one result per call (`source_call_id`).

Mapping (`from_atif` in adapters.py reads, `to_atif` here writes ATIF-v1.6, the version
whose models first carry everything we use):
  system step before any other  -> the record's `system` text
  user step                     -> user event (content = message)
  agent step                    -> per tool call: assistant event (action, arguments; the
                                   step's message on the first) + an environment event
                                   for the call's result; no calls: one text-only event
  metrics.completion_token_ids / logprobs <-> the assistant event's token_ids / logprobs
  a system step with an observation, later system steps -> environment / user events
What ATIF has no field for travels in `extra`: the record's task, reward and terms,
metadata and unknown keys in the root `extra.agentrl`; an event's fields beyond the
standard ones (truncated, a null content, ...) in the step's `extra.agentrl`. A file from
another producer has no `extra.agentrl`: its task is the first user message, its task id
a hash of it, its reward none (scoring happens in verification). Read back, a reward, terms
or success in `extra.agentrl` is only a claim (`claimed_reward`, `claimed_reward_terms`,
`claimed_success`, never trained on) unless this installation's verifier signed it
(`metadata.verdict_mac`, components/verifier/provenance.py): anyone can write that field.

from_atif only reshapes and checks the structure it reads (every problem an AdapterError
naming the field, e.g. `steps[3].tool_calls[0].function_name`); schema.py and validate.py
check the record it makes, as for every other format.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from components.data.writers import write_atomic

EXPORT_VERSION = "ATIF-v1.6"
# Canonical event fields ATIF has its own place for; the rest go to the step's extra.
_ASSISTANT_STANDARD = ("role", "action", "arguments", "content", "token_ids", "logprobs",
                       "tool_call_id")  # fmt: skip
_ENV_STANDARD = ("role", "observation", "tool_call_id")
_TOP_STANDARD = ("schema_version", "trajectory", "system")


# ---------------------------------------------------------------- writing


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentrl")
    except PackageNotFoundError:
        return "0+unknown"


def to_atif(record: dict) -> dict:
    """A canonical record (an episode) -> an ATIF-v1.6 document."""
    meta = dict(record.get("metadata") or {})
    steps = _steps(record)
    completion_tokens = sum(len(s["metrics"]["completion_token_ids"]) for s in steps
                            if "metrics" in s)  # fmt: skip
    named = ("id", "task_id", "task", "source", "reward", "reward_terms", "metadata")
    ours = {
        **{k: record.get(k) for k in named if k != "metadata"},
        "reward_terms": record.get("reward_terms", {}),
        # policy and model_version travel in `agent` (when set)
        "metadata": {
            k: v for k, v in meta.items() if k not in ("policy", "model_version") or v is None
        },
        # A system prompt that is not one string (the OpenAI adapter keeps a list) is kept
        # exactly here; the system steps carry its text for other readers.
        "extra": {
            k: v
            for k, v in record.items()
            if (k not in (*_TOP_STANDARD, *named))
            or (k == "system" and not isinstance(v, str | None))
        },
    }
    doc: dict = {
        "schema_version": EXPORT_VERSION,
        "session_id": record["id"],
        "agent": {"name": meta.get("policy") or record["source"], "version": _version()},
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
        "extra": {"agentrl": ours},
    }
    if meta.get("model_version"):
        doc["agent"]["model_name"] = meta["model_version"]
    if completion_tokens:
        doc["final_metrics"]["total_completion_tokens"] = completion_tokens
    return doc


def _steps(record: dict) -> list[dict]:
    """The record's system prompt and events as ATIF steps (see the module doc)."""
    steps: list[dict] = []

    def add(step: dict) -> None:
        steps.append({"step_id": len(steps) + 1, **step})

    system = record.get("system")
    for text in [system] if isinstance(system, str) else system or []:
        add({"source": "system", "message": text if isinstance(text, str) else json.dumps(text)})
    events = record["trajectory"]
    i = 0
    while i < len(events):
        ev = events[i]
        nxt = events[i + 1] if i + 1 < len(events) else None
        if ev["role"] == "user":
            extra = {k: v for k, v in ev.items() if k not in ("role", "content")}
            add(_with_extra({"source": "user", "message": ev["content"]}, {"user": extra}))
        elif ev["role"] == "assistant":
            step, own, env_own = _agent_step(ev, nxt, f"call_{len(steps) + 1}")
            i += "observation" in step  # its observation is in this step
            add(_with_extra(step, {"assistant": own, "environment": env_own}))
        else:  # an observation no call asked for: a system event
            env_own = {k: v for k, v in ev.items() if k not in _ENV_STANDARD}
            add(_with_extra({"source": "system", "message": "",
                             "observation": {"results": [{"content": ev["observation"]}]}},
                            {"environment": env_own}))  # fmt: skip
        i += 1
    return steps


def _agent_step(ev: dict, nxt: dict | None, call_id: str) -> tuple[dict, dict, dict]:
    """(agent step, the assistant event's fields ATIF has no place for, the same of the
    observation event it absorbed)."""
    step: dict = {"source": "agent", "message": ev.get("content") or ""}
    own = {k: v for k, v in ev.items() if k not in _ASSISTANT_STANDARD}
    # ATIF's message is a string: say when ours was null (or "" beside a call).
    if ev.get("content") is None or (ev.get("content") == "" and ev.get("action")):
        own["content"] = ev.get("content")
    if ev.get("token_ids") is not None:
        step["metrics"] = {"completion_tokens": len(ev["token_ids"]),
                           "completion_token_ids": ev["token_ids"],
                           "logprobs": ev.get("logprobs") or []}  # fmt: skip
    env_own: dict = {}
    if ev.get("action"):
        if ev.get("arguments") is None:
            own["arguments"] = None
        cid = ev.get("tool_call_id") or call_id
        if ev.get("tool_call_id") is None:
            own["tool_call_id"] = None  # named here only because ATIF needs one
        step["tool_calls"] = [{"tool_call_id": cid, "function_name": ev["action"],
                               "arguments": ev.get("arguments") or {}}]  # fmt: skip
        if nxt is not None and nxt["role"] == "environment":
            step["observation"] = {"results": [{"source_call_id": cid,
                                                "content": nxt["observation"]}]}  # fmt: skip
            env_own = {k: v for k, v in nxt.items() if k not in _ENV_STANDARD}
    return step, own, env_own


def _with_extra(step: dict, parts: dict[str, dict]) -> dict:
    kept = {k: v for k, v in parts.items() if v}
    if kept:
        step["extra"] = {"agentrl": kept}
    return step


def export_atif(sources: list[str], out_dir: Path) -> list[Path]:
    """Write every episode of `sources` (JSONL files of canonical records, e.g. a rollout's
    samples.jsonl, or ingested/validated dataset folders) as `<out_dir>/<id>.json`; returns
    the files. A record that is not a valid canonical record is an error naming it."""
    from components.data.ingest import DatasetError, load_records
    from components.data.schema import parse_record

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for src in map(Path, sources):
        if src.is_dir():
            records = ((f"{src}#{i}", r) for i, r in enumerate(load_records(src), start=1))
        else:
            lines = src.read_text(encoding="utf-8").splitlines()
            records = ((f"{src}:{n}", _json_line(line, f"{src}:{n}"))
                       for n, line in enumerate(lines, start=1) if line.strip())  # fmt: skip
        for where, record in records:
            model, reasons = parse_record(record, where)
            if reasons:
                raise DatasetError(f"{where}: not an episode record: {reasons[0]}")
            path = out_dir / f"{_file_name(model.id)}.json"
            if path in written:
                raise DatasetError(f"{where}: a second episode with id {model.id!r}")
            write_atomic(path, json.dumps(to_atif(record), indent=2, ensure_ascii=False) + "\n")
            written.append(path)
    return written


def _json_line(line: str, where: str) -> dict:
    from components.data.ingest import DatasetError

    try:
        return json.loads(line)
    except ValueError as e:
        raise DatasetError(f"{where}: not JSON ({e})") from e


def _file_name(record_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", record_id)[:100].lstrip(".")
    return (
        safe
        if safe == record_id
        else f"{safe}-{hashlib.sha256(record_id.encode()).hexdigest()[:8]}"
    )
