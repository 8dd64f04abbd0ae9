"""Episodes as MLflow traces: a sample by outcome, every span at the time the episode
recorded it.

An evaluation's episodes are many; the traces are a few of each outcome (`sample_by_outcome`:
solved, failed, flagged by the safety monitor), not the first few, which on a sorted task
list are often one family and one outcome. A span keeps the text it carries whole: a tool's
observation is what the model read next, and the environment already caps it
(SandboxConfig's output cap); cutting it again, from either end, loses the part that
explains the turn ("...ert 3 == 1 FAILED"). A tool call that failed (the environment's
error, a command's non-zero exit code, a fix whose tests fail) is an ERROR span.
"""

from __future__ import annotations

import json
import re

OUTCOMES = ("solved", "failed", "flagged")

# The last line of a run_command observation ("exit code 1") and the first line of a
# try_fix one ("cmp-1 applied (...); tests FAILED"): a call that ran and did not succeed.
_EXIT_CODE = re.compile(r"(?:^|\n)exit code (-?\d+)\s*$")
_TESTS_FAILED = re.compile(r"\A[^\n]*\btests FAILED\b")


def outcome_of(record: dict, row: dict) -> str:
    """`flagged` (the safety monitor flagged an action, or the verdict), else `solved` or
    `failed` (an infra failure included)."""
    meta = record.get("metadata", {})
    if row.get("safety_flags"):
        return "flagged"
    return "solved" if row.get("success", meta.get("success")) else "failed"


def sample_by_outcome(records: list[dict], results: list[dict], limit: int) -> list[dict]:
    """Up to `limit` timed episodes, drawn in turn from each outcome (solved, failed,
    flagged), in file order within an outcome: every outcome present is shown."""
    by_id = {r.get("episode_id"): r for r in results}
    groups: dict[str, list[dict]] = {o: [] for o in OUTCOMES}
    for record in records:
        row = by_id.get(record.get("id"), {})
        if row.get("timing"):  # a run from before episodes kept their clock: nothing to draw
            groups[outcome_of(record, row)].append(record)
    picked: list[dict] = []
    while len(picked) < limit and any(groups.values()):
        for outcome in OUTCOMES:
            if groups[outcome] and len(picked) < limit:
                picked.append(groups[outcome].pop(0))
    return picked


def tool_failed(observation: dict) -> bool:
    """Did the tool call this environment event answers fail?"""
    text = str(observation.get("observation", ""))
    code = _EXIT_CODE.search(text)
    return (
        bool(observation.get("error"))
        or text.startswith("error:")
        or bool(_TESTS_FAILED.search(text))
        or (code is not None and int(code[1]) != 0)
    )


def messages(events: list[dict], upto: int) -> list[dict]:
    """The chat the model saw before event `upto`, as OpenAI-style messages (what the UI
    renders as a conversation), each whole."""
    out = []
    for e in events[:upto]:
        role = e.get("role")
        if role == "assistant":
            text = e.get("completion") or json.dumps(
                {"tool": e.get("action"), "arguments": e.get("arguments")}
            )
            out.append({"role": "assistant", "content": text})
        elif role == "environment":
            out.append({"role": "tool", "content": str(e.get("observation", ""))})
        else:
            out.append({"role": "user", "content": str(e.get("content", ""))})
    return out


def _status(record: dict, row: dict) -> tuple[str, str]:
    """(trace status, why): OK only for a solved task; a failed or unverified episode is
    an ERROR trace, so the UI's status column tells them apart."""
    meta = record.get("metadata", {})
    if row.get("status", meta.get("status")) == "infra_failure":
        return "ERROR", f"infra failure: {row.get('infra_detail', '')}"[:300]
    if row.get("success", meta.get("success")):
        return "OK", ""
    return "ERROR", f"task not solved (reward {record.get('reward')})"


def _turn_spans(mlflow, root, events: list[dict], timing: dict, at) -> None:
    """An LLM span per model turn and a TOOL span per tool call, under `root`."""
    from mlflow.entities import SpanStatus, SpanStatusCode
    from mlflow.tracing.constant import SpanAttributeKey

    turns = [i for i, e in enumerate(events) if e.get("role") == "assistant"]
    for n, (i, (m0, m1, c0, c1)) in enumerate(
        zip(turns, timing.get("steps", []), strict=False), start=1
    ):
        e = events[i]
        llm = mlflow.start_span_no_context(
            f"model turn {n}",
            span_type="LLM",
            parent_span=root,
            inputs={"messages": messages(events, i)},
            start_time_ns=at(m0),
        )
        if e.get("token_ids") is not None:
            sampled, prompt = len(e["token_ids"]), e.get("prompt_tokens") or 0
            llm.set_attribute(
                SpanAttributeKey.CHAT_USAGE,
                {
                    "input_tokens": prompt,
                    "output_tokens": sampled,
                    "total_tokens": prompt + sampled,
                },
            )
        llm.set_outputs(
            {
                "completion": e.get("completion") or "",
                "action": e.get("action"),
                "arguments": e.get("arguments"),
            }
        )
        llm.end(end_time_ns=at(m1))
        obs = events[i + 1] if i + 1 < len(events) else {}
        # A completion that parsed to no tool call: the env answered with the error.
        called = f"tool {e['action']}" if e.get("action") else "invalid tool call"
        tool = mlflow.start_span_no_context(
            called,
            span_type="TOOL",
            parent_span=root,
            inputs=e.get("arguments") or {},
            start_time_ns=at(c0),
        )
        failed = tool_failed(obs)
        tool.set_outputs({"observation": str(obs.get("observation", "")), "failed": failed})
        if failed:
            tool.set_status(SpanStatus(SpanStatusCode.ERROR, "the tool call failed"))
        tool.end(end_time_ns=at(c1))


def _verify_span(mlflow, root, record: dict, row: dict, at) -> None:
    """The verifier's span (when the episode's clock recorded it): its verdict and flags."""
    if not row["timing"].get("verify"):
        return
    v0, v1 = row["timing"]["verify"]
    check = mlflow.start_span_no_context(
        "verify", span_type="EVALUATOR", parent_span=root, start_time_ns=at(v0)
    )
    check.set_outputs(
        {
            "success": record.get("metadata", {}).get("success"),
            "reward": record.get("reward"),
            "reward_terms": record.get("reward_terms"),
            "safety_flags": row.get("safety_flags") or [],
        }
    )
    check.end(end_time_ns=at(v1))


def log_traces(
    mlflow,
    run_id: str,
    records: list[dict],
    results: list[dict],
    limit: int = 8,
    tags: dict | None = None,
) -> int:
    """A sample of episodes by outcome (`sample_by_outcome`) as MLflow traces attached to
    run `run_id` (the evaluate stage's run), through `mlflow` (the module, its tracking
    URI set): an AGENT span per episode, an LLM span per model turn (the chat it saw and
    the completion it sampled, with token counts), a TOOL span per tool call, then the
    verifier's span, all at the times the episode recorded (EpisodeResult.timing, from
    `results`, its results.json rows). The trace's status is the episode's outcome, its
    `outcome` tag solved / failed / flagged; `tags` (e.g. the pipeline run) go on every
    trace. Returns how many were logged."""
    from mlflow.entities import SpanStatus, SpanStatusCode
    from mlflow.tracing.constant import TraceMetadataKey

    by_id = {r.get("episode_id"): r for r in results}
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    picked = sample_by_outcome(records, results, limit)
    for record in picked:
        meta = record.get("metadata", {})
        row = by_id[record.get("id")]
        timing = row["timing"]
        t0 = int(timing["start_unix"] * 1e9)
        at = lambda s, t0=t0: t0 + int(s * 1e9)  # noqa: E731 - offsets (s) -> span time (ns)
        status, why = _status(record, row)
        trace_tags = {
            "task_id": str(record.get("task_id")),
            "success": str(status == "OK"),
            "outcome": outcome_of(record, row),
            "reward": str(record.get("reward")),
            "split": str(meta.get("split")),
            **{k: str(v) for k, v in (tags or {}).items()},
        }
        root = mlflow.start_span_no_context(
            f"episode {record.get('task_id')}",
            span_type="AGENT",
            inputs={"task": record.get("task", "")},
            attributes={
                "task_id": record.get("task_id"),
                "policy": meta.get("policy"),
                "split": meta.get("split"),
                "episode_id": record.get("id"),
                "end_reason": meta.get("end_reason"),
                "wall_s": row.get("wall_s"),
            },
            tags=trace_tags,
            metadata={TraceMetadataKey.SOURCE_RUN: run_id},
            experiment_id=experiment,
            start_time_ns=t0,
        )
        _turn_spans(mlflow, root, record.get("trajectory", []), timing, at)
        _verify_span(mlflow, root, record, row, at)
        root.set_outputs(
            {
                "reward": record.get("reward"),
                "reward_terms": record.get("reward_terms"),
                "success": meta.get("success"),
                "end_reason": meta.get("end_reason"),
            }
        )
        root.set_status(SpanStatus(SpanStatusCode[status], why))
        root.end(end_time_ns=at(float(row.get("wall_s") or 0.0)))
    mlflow.flush_trace_async_logging()
    return len(picked)
