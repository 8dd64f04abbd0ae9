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
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from components.data.schema import META_FIELDS, SCHEMA_VERSION, canonical_json


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
    raise AdapterError("<record>", f"unknown format {fmt!r}")
