"""Adapters: one function per input format, each turning one parsed record into the
canonical record (schema.py). They only reshape; checking is schema.py's and validate.py's
job, so an adapter passes odd values through and lets the checks name them.

Formats
  rollout  the project's own rollouts: canonical records (docs/CONTRACTS.md), as is.
  mission  MISSION.md's {"task", "trajectory", "reward"}; id / task_id / source filled in
           deterministically when absent (content hashes), so re-ingesting gives the same ids.
  openai   OpenAI-style chat logs {"messages": [...]}: assistant `tool_calls` (arguments are
           a JSON string) answered by `role: tool` messages matched on `tool_call_id`.
  miniswe  mini-swe-agent `.traj.json` (trajectory_format mini-swe-agent-1 and -1.1): v1 puts
           one ```bash block in the assistant text and the output in the next user message;
           v1.1 uses `tool_calls` to a `bash` tool and `role: tool` outputs. `bash` maps to
           our `run_command`; the final `exit` message is the submit command's output.
  atif     Harbor's Agent Trajectory Interchange Format (ATIF-v1.x, one document per run):
           steps with tool calls and their observations, mapped in components/data/atif.py.
In every format a record's reward, terms and success are only a claim, kept as claimed_*
and never trained on, unless this installation's verifier signed them
(components/verifier/provenance.py; `claim_unless_signed`, applied by ingest.py after the
schema checked the values as given, so a bad reward is still named as the input's field).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from components.data.schema import META_FIELDS, SCHEMA_VERSION, canonical_json
from components.verifier.provenance import as_claimed, is_signed_by_us


class AdapterError(ValueError):
    """A record cannot be reshaped; `field` is the path inside the input record."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field}: {problem}")
        self.field = field
        self.problem = problem


def _short_hash(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:n]


def task_id_for_text(text: str) -> str:
    """Deterministic task id for a record that names none: a hash of the task text."""
    return "task-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def detect_format(obj: Any, file_name: str) -> str | None:
    """Which adapter fits this record; None when none does."""
    name = PurePath(file_name).name
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("schema_version"), str) and obj["schema_version"].startswith("ATIF-"):
        return "atif"
    if "trajectory_format" in obj or name.endswith((".traj.json", ".traj")):
        return "miniswe"
    if "messages" in obj:
        return "miniswe" if "info" in obj and "model_stats" in str(obj.get("info")) else "openai"
    if "trajectory" in obj:
        return "rollout" if "schema_version" in obj else "mission"
    return None


def _text(content: Any, field: str) -> str | None:
    """Chat `content`: a string, null, or a list of parts [{"type": "text", "text": ...}]."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise AdapterError(f"{field}[{i}]", "content part has no text")
        return "\n".join(parts)
    raise AdapterError(
        field, f"content must be a string or a list of parts, got {type(content).__name__}"
    )


def _iso(ts: Any, field: str) -> str | None:
    """A Unix time in seconds as ISO 8601; a string passes (the schema checks it)."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        try:
            return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")
        except (ValueError, OverflowError, OSError) as e:
            hint = "; milliseconds?" if abs(ts) >= 1e11 else ""
            raise AdapterError(
                field, f"timestamp {ts!r} is not a time in seconds since 1970 ({e}{hint})"
            ) from e
    if ts is None or isinstance(ts, str):
        return ts
    # true/false, a list...: not a time (a bool is an int to Python, never a timestamp here)
    raise AdapterError(
        field,
        f"timestamp must be seconds since 1970 or an ISO 8601 string, got {type(ts).__name__}",
    )


# ---------------------------------------------------------------- rollout / mission


def from_rollout(obj: dict, *, default_source: str = "") -> dict:
    """Canonical records pass through unchanged (checks happen in schema/validate)."""
    return obj


def from_mission(obj: dict, *, default_source: str = "") -> dict:
    """MISSION.md record -> canonical; given fields win, missing ones get stable values."""
    rec = dict(obj)
    task = rec.get("task")
    if isinstance(task, dict):
        # A task object: keep it whole in `task_spec`, use its text as the instruction.
        rec["task_spec"] = task
        text = task.get("instruction") or task.get("text") or task.get("description")
        rec["task"] = text if isinstance(text, str) else canonical_json(task)
        rec.setdefault("task_id", task.get("id"))
    rec.setdefault("schema_version", SCHEMA_VERSION)
    if rec.get("task_id") is None and isinstance(rec.get("task"), str):
        rec["task_id"] = task_id_for_text(rec["task"])
    rec.setdefault("source", default_source or "mission")
    if rec.get("id") is None:
        # Hash of the input as given, so the same line always gets the same id.
        rec["id"] = f"{rec['source']}-{_short_hash(obj)}"
    if isinstance(rec.get("trajectory"), list) and "metadata" not in rec:
        n = sum(1 for e in rec["trajectory"] if isinstance(e, dict) and e.get("action"))
        rec["metadata"] = {"num_tool_calls": n}
    return rec


# ---------------------------------------------------------------- OpenAI chat


def _tool_call(call: Any, field: str) -> tuple[str | None, str, Any]:
    """(call id, tool name, arguments object) from an OpenAI tool_calls entry."""
    if not isinstance(call, dict):
        raise AdapterError(field, "tool call must be an object")
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise AdapterError(f"{field}.function.name", "missing tool name")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise AdapterError(f"{field}.function.arguments", f"not valid JSON ({e.msg})") from e
    return call.get("id"), fn["name"], args


_MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name", "function_call"}


def _chat_events(
    messages: list, *, tool_alias: dict[str, tuple[str, dict[str, str]]], v1_bash: bool
) -> tuple[list[dict], list[str], dict]:
    """Chat messages -> (events, system prompts, exit message or {}).

    Assistant messages with several tool calls become one assistant event per call, each
    followed by the tool message that answers it (matched on tool_call_id).
    """
    events: list[dict] = []
    system: list[str] = []
    exit_msg: dict = {}
    pending: dict[str, int] = {}  # tool_call_id -> index in events of the calling event
    for i, msg in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise AdapterError(field, "message must be an object")
        role = msg.get("role")
        extra = {k: v for k, v in msg.items() if k not in _MESSAGE_KEYS and v is not None}
        if role == "system":
            system.append(_text(msg.get("content"), f"{field}.content") or "")
        elif role == "user":
            events.append(_user_event(msg, field, extra, events, v1_bash))
        elif role == "assistant":
            for ev, call_id in _assistant_events(msg, field, extra, tool_alias, v1_bash):
                if call_id is not None:
                    pending[call_id] = len(events)
                events.append(ev)
        elif role in ("tool", "function"):
            _add_observation(events, pending, msg, field, extra)
        elif role == "exit":
            exit_msg = {"content": msg.get("content"), **extra}
            last = events[-1] if events else None
            if last and last["role"] == "assistant" and last.get("action"):
                # The submit command's output is the submission itself.
                events.append(
                    {
                        "role": "environment",
                        "observation": _text(msg.get("content"), f"{field}.content") or "",
                        "truncated": False,
                    }
                )
        else:
            raise AdapterError(f"{field}.role", f"unknown chat role {role!r}")
    return events, system, exit_msg


def _user_event(msg: dict, field: str, extra: dict, events: list[dict], v1_bash: bool) -> dict:
    text = _text(msg.get("content"), f"{field}.content") or ""
    last = events[-1] if events else None
    if v1_bash and last and last["role"] == "assistant" and last.get("action"):
        # mini-swe-agent v1: the command's output comes back as a user message.
        return {"role": "environment", "observation": text, "truncated": _cut(text), **extra}
    return {"role": "user", "content": text, **extra}


def _assistant_events(
    msg: dict, field: str, extra: dict, tool_alias: dict, v1_bash: bool
) -> list[tuple[dict, str | None]]:
    """(event, tool_call_id or None) per tool call of an assistant message; one event
    without an action when it calls nothing."""
    text = _text(msg.get("content"), f"{field}.content")
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list):
        raise AdapterError(f"{field}.tool_calls", "must be a list")
    if not calls and v1_bash and text is not None:
        blocks = re.findall(r"```bash\s*\n(.*?)\n```", text, re.DOTALL)
        if len(blocks) == 1:
            calls = [{"function": {"name": "bash", "arguments": {"command": blocks[0]}}}]
    if not calls:
        return [({"role": "assistant", "action": None, "content": text, **extra}, None)]
    out = []
    for j, call in enumerate(calls):
        call_id, name, args = _tool_call(call, f"{field}.tool_calls[{j}]")
        if name in tool_alias and isinstance(args, dict):
            name, renames = tool_alias[name]
            args = {renames.get(k, k): v for k, v in args.items()}
        ev: dict = {"role": "assistant", "action": name, "arguments": args}
        if j == 0:
            ev["content"] = text or None
            ev.update(extra)
        if call_id is not None:
            ev["tool_call_id"] = call_id
        out.append((ev, call_id))
    return out


def _add_observation(
    events: list[dict], pending: dict[str, int], msg: dict, field: str, extra: dict
) -> None:
    """A tool message as an observation, placed right after the call it answers."""
    text = _text(msg.get("content"), f"{field}.content") or ""
    obs = {"role": "environment", "observation": text, "truncated": _cut(text), **extra}
    call_id = msg.get("tool_call_id")
    if call_id is not None:
        obs["tool_call_id"] = call_id
    at = pending.pop(call_id, None) if call_id is not None else None
    if at is None:
        events.append(obs)  # unmatched: validation reports the broken order
        return
    # Insert right after the calling event, so parallel calls come out as
    # (action, observation) pairs whatever order the tool messages arrive in.
    pos = at + 1
    events.insert(pos, obs)
    for k, v in pending.items():
        if v >= pos:
            pending[k] = v + 1


def _cut(text: str) -> bool:
    # mini-swe-agent's observation template elides long output with these markers.
    return "<elided_chars>" in text or "output of your last command was too long" in text


def _first_user_text(events: list[dict]) -> str:
    return next((e["content"] for e in events if e["role"] == "user"), "")


def from_openai(obj: dict, *, default_source: str = "") -> dict:
    messages = obj.get("messages")
    if not isinstance(messages, list):
        raise AdapterError("messages", "must be a list of chat messages")
    events, system, _ = _chat_events(messages, tool_alias={}, v1_bash=False)
    meta_in = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    task = obj.get("task") if isinstance(obj.get("task"), str) else _first_user_text(events)
    task_id = obj.get("task_id") or meta_in.get("task_id") or task_id_for_text(task)
    source = obj.get("source") or default_source or "openai"
    known = {
        "messages",
        "id",
        "task_id",
        "task",
        "source",
        "reward",
        "reward_terms",
        "metadata",
        "model",
        "created",
    }
    extra = {k: v for k, v in obj.items() if k not in known}
    if system:
        extra["system"] = system
    metadata = {
        "policy": meta_in.get("policy"),
        "model_version": meta_in.get("model_version") or obj.get("model"),
        "created_at": meta_in.get("created_at") or _iso(obj.get("created"), "created"),
        "num_tool_calls": sum(1 for e in events if e["role"] == "assistant" and e.get("action")),
        "num_tokens": meta_in.get("num_tokens"),
        "split": meta_in.get("split"),
        **{k: v for k, v in meta_in.items() if k not in (*META_FIELDS, "task_id")},
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "id": obj.get("id") or f"{source}-{_short_hash(obj)}",
        "task_id": task_id,
        "source": source,
        "task": task,
        "trajectory": events,
        "reward": obj.get("reward"),
        "reward_terms": obj.get("reward_terms", {}),
        "metadata": metadata,
        **extra,
    }


# ---------------------------------------------------------------- mini-swe-agent

_MINISWE_BASH = {"bash": ("run_command", {"command": "cmd"})}


def from_miniswe(obj: dict, *, default_source: str = "", file_name: str = "") -> dict:
    messages = obj.get("messages")
    if not isinstance(messages, list):
        raise AdapterError("messages", "must be a list of chat messages")
    fmt = obj.get("trajectory_format", "mini-swe-agent-1")
    has_tool_calls = any(isinstance(m, dict) and m.get("tool_calls") for m in messages)
    events, system, exit_msg = _chat_events(
        messages, tool_alias=_MINISWE_BASH, v1_bash=not has_tool_calls
    )
    info = obj.get("info") if isinstance(obj.get("info"), dict) else {}
    stem = PurePath(file_name).name.removesuffix(".json").removesuffix(".traj")
    instance = obj.get("instance_id") or stem or task_id_for_text(_first_user_text(events))
    source = default_source or "mini-swe-agent"
    stamps = [
        (m["extra"]["timestamp"], f"messages[{i}].extra.timestamp")
        for i, m in enumerate(messages)
        if isinstance(m, dict) and isinstance(m.get("extra"), dict) and "timestamp" in m["extra"]
    ]
    model_cfg = (info.get("config") or {}).get("model") or {}
    extra = {k: v for k, v in obj.items() if k not in {"messages", "info", "instance_id"}}
    extra.update({"trajectory_format": fmt, "info": info, "system": system})
    if exit_msg:
        extra["exit"] = exit_msg
    return {
        "schema_version": SCHEMA_VERSION,
        "id": f"miniswe-{instance}-{_short_hash(obj, 8)}",
        "task_id": instance,
        "source": source,
        "task": _first_user_text(events),
        "trajectory": events,
        "reward": None,  # "Submitted" is not "solved": scoring happens in verification
        "reward_terms": {},
        "metadata": {
            "policy": "mini-swe-agent",
            "model_version": model_cfg.get("model_name"),
            "created_at": _iso(*stamps[0]) if stamps else None,
            "num_tool_calls": sum(
                1 for e in events if e["role"] == "assistant" and e.get("action")
            ),
            "num_tokens": None,
            "split": None,
            "exit_status": info.get("exit_status"),
        },
        **extra,
    }


# ---------------------------------------------------------------- ATIF (components/data/atif.py)

ATIF_SOURCES = ("system", "user", "agent")


def _dict(value: Any, field: str, optional: bool = False) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise AdapterError(field, f"must be an object, got {type(value).__name__}")
    return value


def _str(value: Any, field: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise AdapterError(field, f"must be a string, got {type(value).__name__}")
    return value


def from_atif(obj: dict, *, default_source: str = "") -> dict:
    """One ATIF document -> a canonical record dict (AdapterError names a bad field)."""
    version = _str(obj.get("schema_version"), "schema_version")
    if not version.startswith("ATIF-v1."):
        raise AdapterError("schema_version", f"unsupported ATIF version {version!r}")
    agent = _dict(obj.get("agent"), "agent")
    _str(agent.get("name"), "agent.name")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise AdapterError("steps", "must be a non-empty list of steps")
    ours = _dict(_dict(obj.get("extra"), "extra", optional=True).get("agentrl"),
                 "extra.agentrl", optional=True)  # fmt: skip
    events, system = _events(steps)

    task = ours.get("task")
    if not isinstance(task, str):
        task = next((e["content"] for e in events if e["role"] == "user"), "")
    final = _dict(obj.get("final_metrics"), "final_metrics", optional=True)
    tokens = [final.get(k) for k in ("total_prompt_tokens", "total_completion_tokens")]
    stamps = [s.get("timestamp") for s in steps if isinstance(s, dict) and s.get("timestamp")]
    metadata = {
        "policy": agent["name"],
        "model_version": agent.get("model_name"),
        "created_at": stamps[0] if stamps else None,
        "num_tool_calls": sum(1 for e in events if e["role"] == "assistant" and e.get("action")),
        "num_tokens": sum(tokens) if all(isinstance(t, int) for t in tokens) else None,
        "split": None,
    }
    metadata.update(_dict(ours.get("metadata"), "extra.agentrl.metadata", optional=True))
    source = ours.get("source") or default_source or "atif"
    record = {
        "schema_version": SCHEMA_VERSION,
        "id": ours.get("id") or obj.get("session_id") or f"atif-{_short_hash(obj)}",
        "task_id": ours.get("task_id") or task_id_for_text(task),
        "source": source,
        "task": task,
        "trajectory": events,
        "reward": ours.get("reward"),
        "reward_terms": ours.get("reward_terms", {}),
        "metadata": metadata,
    }
    if system is not None:
        record["system"] = system
    if ours:
        record.update(_dict(ours.get("extra"), "extra.agentrl.extra", optional=True))
    else:
        # Another producer's run: keep what we do not map, so nothing of it is lost.
        record["atif"] = {k: v for k, v in obj.items() if k != "steps"}
    return claim_unless_signed(record)


def claim_unless_signed(record: dict) -> dict:
    """A verdict a record carries is only a claim (kept as claimed_*, never trained on)
    unless this installation's verifier signed it: our own episodes read back with their
    verdict, anyone's forgery without. `record` is changed in place and returned."""
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    carries = record.get("reward") is not None or record.get("reward_terms") or "success" in meta
    if carries and not is_signed_by_us(record):
        as_claimed(record)
    return record


def _events(steps: list) -> tuple[list[dict], str | None]:
    events: list[dict] = []
    system: str | None = None
    for i, step in enumerate(steps):
        field = f"steps[{i}]"
        step = _dict(step, field)
        if step.get("step_id") != i + 1 or isinstance(step.get("step_id"), bool):
            raise AdapterError(f"{field}.step_id", f"expected {i + 1} (sequential from 1), "
                               f"got {step.get('step_id')!r}")  # fmt: skip
        source = step.get("source")
        if source not in ATIF_SOURCES:
            raise AdapterError(f"{field}.source", f"must be one of {ATIF_SOURCES}, got {source!r}")
        text = _text(step.get("message"), f"{field}.message")
        if text is None:
            raise AdapterError(f"{field}.message", "is required (a string or content parts)")
        extra = _dict(step.get("extra"), f"{field}.extra", optional=True)
        ours = _dict(extra.get("agentrl"), f"{field}.extra.agentrl", optional=True)
        meta = {k: step[k] for k in ("timestamp",) if step.get(k) is not None}
        meta.update({f"atif_{k}": v for k, v in extra.items() if k != "agentrl"})
        if source != "agent":
            for key in ("tool_calls", "metrics", "reasoning_content", "model_name"):
                if step.get(key) is not None:
                    raise AdapterError(f"{field}.{key}", f"only an agent step has it, not {source}")
        if source == "system" and not events and "observation" not in step:
            system = text if system is None else f"{system}\n{text}"
        elif source == "agent":
            events += _agent_events(step, field, text, meta, ours)
        elif source == "system" and step.get("observation") is not None:
            for j, result in _results(step, field, set()):
                events.append(_observation(result, f"{field}.observation.results[{j}]",
                                           {**meta, **ours.get("environment", {})}))  # fmt: skip
        else:
            events.append({"role": "user", "content": text, **meta,
                           **({"atif_source": "system"} if source == "system" else {}),
                           **ours.get("user", {})})  # fmt: skip
    return events, system


def _results(step: dict, field: str, call_ids: set[str]) -> list[tuple[int, dict]]:
    obs = _dict(step.get("observation"), f"{field}.observation")
    results = obs.get("results")
    if not isinstance(results, list):
        raise AdapterError(f"{field}.observation.results", "must be a list")
    out = []
    for j, result in enumerate(results):
        rfield = f"{field}.observation.results[{j}]"
        result = _dict(result, rfield)
        cid = _str(result.get("source_call_id"), f"{rfield}.source_call_id", optional=True)
        if cid is not None and cid not in call_ids:
            raise AdapterError(f"{rfield}.source_call_id",
                               f"{cid!r} names no tool call of this step")  # fmt: skip
        out.append((j, result))
    return out


def _observation(result: dict, field: str, extra: dict) -> dict:
    content = _text(result.get("content"), f"{field}.content") or ""
    event = {"role": "environment", "observation": content, "truncated": False}
    if result.get("source_call_id") is not None:
        event["tool_call_id"] = result["source_call_id"]
    event.update(extra)
    return event


def _agent_events(step: dict, field: str, text: str, meta: dict, ours: dict) -> list[dict]:
    calls = step.get("tool_calls") or []
    if not isinstance(calls, list):
        raise AdapterError(f"{field}.tool_calls", "must be a list")
    metrics = _dict(step.get("metrics"), f"{field}.metrics", optional=True)
    first = dict(meta)
    for key in ("model_name", "reasoning_content", "reasoning_effort", "llm_call_count"):
        if step.get(key) is not None:
            first[f"atif_{key}"] = step[key]
    ids, logprobs = metrics.get("completion_token_ids"), metrics.get("logprobs")
    if ids is not None:
        first["token_ids"] = ids
        first["logprobs"] = logprobs if logprobs is not None else []
    rest = {k: v for k, v in metrics.items() if k not in ("completion_token_ids", "logprobs")}
    if ids is not None and rest.get("completion_tokens") == len(ids):
        del rest["completion_tokens"]  # what the token ids say already
    if rest:
        first["atif_metrics"] = rest
    first.update(ours.get("assistant", {}))
    assistant: list[dict] = []
    call_ids: list[str] = []
    for j, call in enumerate(calls):
        cfield = f"{field}.tool_calls[{j}]"
        call = _dict(call, cfield)
        cid = _str(call.get("tool_call_id"), f"{cfield}.tool_call_id")
        name = _str(call.get("function_name"), f"{cfield}.function_name")
        args = _dict(call.get("arguments"), f"{cfield}.arguments")
        ev = {"role": "assistant", "action": name, "arguments": args, "tool_call_id": cid}
        if j == 0:
            ev = {"role": "assistant", "action": name, "arguments": args, "content": text or None,
                  **first, "tool_call_id": cid}  # fmt: skip
        assistant.append(ev)
        call_ids.append(cid)
    if not assistant:
        assistant = [{"role": "assistant", "action": None, "content": text, **first}]
    results = _results(step, field, set(call_ids)) if step.get("observation") is not None else []
    env_extra = ours.get("environment", {})
    by_call = {r["source_call_id"]: (j, r) for j, r in results if r.get("source_call_id")}
    events: list[dict] = []
    for ev in assistant:
        events.append(ev)
        if ev.get("tool_call_id") in by_call:
            j, r = by_call[ev["tool_call_id"]]
            events.append(_observation(r, f"{field}.observation.results[{j}]", env_extra))
    for j, r in results:  # results of no particular call come after the calls
        if r.get("source_call_id") is None:
            events.append(_observation(r, f"{field}.observation.results[{j}]", env_extra))
    if "tool_call_id" in ours.get("assistant", {}):  # the id was made up by to_atif
        for ev in events:
            ev.pop("tool_call_id", None)
    return events


def to_canonical(obj: Any, fmt: str, *, file_name: str, default_source: str = "") -> dict:
    """Reshape one parsed record of format `fmt` into a canonical record dict."""
    if not isinstance(obj, dict):
        raise AdapterError("<record>", f"must be a JSON object, got {type(obj).__name__}")
    if fmt == "rollout":
        return from_rollout(obj, default_source=default_source)
    if fmt == "mission":
        return from_mission(obj, default_source=default_source)
    if fmt == "openai":
        return from_openai(obj, default_source=default_source)
    if fmt == "miniswe":
        return from_miniswe(obj, default_source=default_source, file_name=file_name)
    if fmt == "atif":
        return from_atif(obj, default_source=default_source)
    raise AdapterError("<record>", f"unknown format {fmt!r}")
