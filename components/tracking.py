"""MLflow tracking for pipeline runs: one parent run, a nested run per stage, episode traces.

Stages stay unaware of MLflow: each writes a `result.json`; the flow logs it here, so the
same record appears whether the stage ran in-process, as a subprocess or as a Job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "agentrl-retrain"

# The one-line description (MLflow's `mlflow.note.content` tag, shown on the experiment's
# page) of each experiment the project creates: the pipeline's, the registry's
# registration runs (components/promote), and the standalone trainers' defaults
# (components/train/config.py).
NOTE_TAG = "mlflow.note.content"
EXPERIMENT_DESCRIPTIONS = {
    EXPERIMENT: "Retrain pipeline runs: one parent run per pipeline (filter "
    "tags.stage = 'pipeline' to compare parents), a child run per stage, episode traces "
    "on the evaluate runs.",
    "agentrl-registry": "Registration runs of candidates promoted without a training run "
    "(the model registry's source runs).",
    "agentrl-sft": "Standalone supervised fine-tuning runs (agentrl train sft).",
    "agentrl-dpo": "Standalone DPO preference-training runs (agentrl train dpo).",
    "agentrl-grpo": "Standalone GRPO reinforcement-learning runs (agentrl train grpo).",
}


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else the embedded default: SQLite + a local artifact folder."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlruns' / 'mlflow.db'}"
    )


def _mlflow():
    from components.cli import mlflow_telemetry_default

    mlflow_telemetry_default()  # before MLflow's import starts its telemetry client
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None and uri.startswith("sqlite:"):
        artifacts = REPO_ROOT / "mlruns" / "artifacts" / EXPERIMENT
        artifacts.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(EXPERIMENT, artifact_location=artifacts.as_uri())
    mlflow.set_experiment(EXPERIMENT)
    describe_experiments(mlflow.MlflowClient())
    return mlflow


# (tracking URI, experiment name) this process has seen described: every tracking call
# goes through _mlflow(), and one listing there replaces a lookup per experiment.
_DESCRIBED: set[tuple[str, str]] = set()


def describe_experiments(client) -> None:
    """Give each of the project's experiments that exists here and has no description
    its one-line description (EXPERIMENT_DESCRIPTIONS); a description set by a user stays."""
    uri = tracking_uri()
    todo = {n: t for n, t in EXPERIMENT_DESCRIPTIONS.items() if (uri, n) not in _DESCRIBED}
    if not todo:
        return
    for exp in client.search_experiments():
        if exp.name in todo:
            if not exp.tags.get(NOTE_TAG):
                client.set_experiment_tag(exp.experiment_id, NOTE_TAG, todo[exp.name])
            _DESCRIBED.add((uri, exp.name))


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=False)  # fmt: skip
        return out.stdout.strip() if out.returncode == 0 else ""
    except OSError:
        return ""


def _metric_key(key: str) -> str:
    """MLflow keys allow letters, digits, _ - . / and spaces; map anything else to _."""
    return re.sub(r"[^\w\-./ ]", "_", key)[:250]


def flatten(prefix: str, value, out: dict) -> dict:
    """Nested dicts -> dotted keys (MLflow params and metrics are flat)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _number(value) -> bool:
    return isinstance(value, int | float) and value == value  # bools too; not NaN


def _interval(key: str, value) -> bool:
    """A [lo, hi] confidence interval (`success_ci95`, `..._ci`): two metrics, not a curve."""
    return (
        key.rsplit(".", 1)[-1].endswith(("_ci95", "_ci"))
        and isinstance(value, list | tuple)
        and len(value) == 2
        and all(_number(x) for x in value)
    )


def interval_keys(key: str) -> tuple[str, str]:
    """`a.success_ci95` -> (`a.success_rate_lo`, `a.success_rate_hi`): the bounds sit beside
    the rate they bound in the runs table (`success_ci95` bounds `success_rate`)."""
    base = re.sub(r"_ci(95)?$", "", key)
    base = base + "_rate" if base.endswith("success") else base
    return f"{base}_lo", f"{base}_hi"


def _breakdown(key: str) -> bool:
    """Per-group blocks (`by_family`, `by_bug_class`, `by_source`) go to tables; per-split
    numbers stay metrics (a handful, and headline numbers)."""
    last = key.rsplit(".", 1)[-1]
    return last.startswith("by_") and last != "by_split"


def metric_values(result: dict) -> tuple[dict[str, float], dict[str, list], dict[str, dict]]:
    """(scalars incl. interval bounds, per-step curves, breakdown tables) of a stage result."""
    scalars: dict[str, float] = {}
    curves: dict[str, list] = {}
    tables: dict[str, dict] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            if prefix and _breakdown(prefix):
                tables[prefix] = value
                return
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif _number(value):
            scalars[_metric_key(prefix)] = float(value)
        elif _interval(prefix, value):
            lo, hi = interval_keys(prefix)
            scalars[_metric_key(lo)], scalars[_metric_key(hi)] = map(float, value)
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        ):
            curves[_metric_key(prefix)] = [float(x) for x in value]

    walk("", result)
    return scalars, curves, tables


def table_rows(groups: dict) -> dict[str, list]:
    """A breakdown ({group: metrics}) as the columns of one table, a row per group: what
    `log_table` stores and the UI's artifact view shows as a grid."""
    rows = []
    for name, block in groups.items():
        scalars, _, _ = metric_values(block if isinstance(block, dict) else {"value": block})
        rows.append({"group": str(name), **scalars})
    columns = ["group", *sorted({k for r in rows for k in r} - {"group"})]
    return {c: [r.get(c) for r in rows] for c in columns}


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def pipeline_search_filter() -> str:
    """The runs-table filter that shows pipeline (parent) runs only."""
    return "tags.stage = 'pipeline'"


def start_pipeline_run(name: str, params: dict, tags: dict) -> str:
    """Create the parent run; it stays RUNNING until `end_pipeline_run`. Tagged
    `stage = pipeline`, so `pipeline_search_filter()` lists parents without their stages."""
    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id
    run = client.create_run(experiment, run_name=name, tags={
        **{k: str(v) for k, v in tags.items()}, "git_commit": git_commit(),
        "agentrl.kind": "pipeline", "stage": "pipeline"})  # fmt: skip
    _log_params(client, run.info.run_id, params)
    return run.info.run_id


def run_url(run_id: str, ui: str = "") -> str:
    """The run's page in the MLflow UI (`ui`: its base URL, default $MLFLOW_UI_URL or the
    README's `mlflow ui` address)."""
    mlflow = _mlflow()
    base = _ui_base(ui)
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment}/runs/{run_id}"


def _ui_base(ui: str) -> str:
    return (ui or os.environ.get("MLFLOW_UI_URL") or "http://127.0.0.1:5000").rstrip("/")


def pipeline_runs_url(experiment_id: str = "", ui: str = "") -> str:
    """The runs table filtered to pipeline (parent) runs: tick two and press Compare."""
    from urllib.parse import quote

    experiment_id = experiment_id or _mlflow().get_experiment_by_name(EXPERIMENT).experiment_id
    return (f"{_ui_base(ui)}/#/experiments/{experiment_id}/runs"
            f"?searchFilter={quote(pipeline_search_filter())}")  # fmt: skip


def compare_url(run_ids: list[str], experiment_id: str = "", ui: str = "") -> str:
    """The compare page of these runs (e.g. an original and its reproduction)."""
    from urllib.parse import quote

    experiment_id = experiment_id or _mlflow().get_experiment_by_name(EXPERIMENT).experiment_id
    runs, experiments = json.dumps(list(run_ids)), json.dumps([experiment_id])
    return f"{_ui_base(ui)}/#/compare-runs?runs={quote(runs)}&experiments={quote(experiments)}"


def set_run_tags(run_id: str, tags: dict) -> None:
    client = _mlflow().MlflowClient()
    for k, v in tags.items():
        client.set_tag(run_id, k, str(v))


def _log_params(client, run_id: str, params: dict) -> None:
    from mlflow.entities import Param

    flat = [Param(k, str(v)[:500]) for k, v in flatten("", params, {}).items()]
    for i in range(0, len(flat), 100):  # the tracking API takes at most 100 params a call
        client.log_batch(run_id, params=flat[i : i + 100])


# The candidate's headline numbers a parent run carries (keys of metrics.json's `overall`;
# cheating_rate: success on impossible variants, gated by promote.max_cheating_rate).
HEADLINE = ("success_rate", "success_ci95", "test_pass_rate", "tool_call_accuracy",
            "valid_call_rate", "recovery_rate", "mean_reward", "safety_violation_rate",
            "tampering_rate", "human_intervention_rate", "infra_failures",
            "infra_failure_rate", "regression_rate", "cheating_rate", "episodes")  # fmt: skip


def pipeline_metrics(evaluation: dict, safety: dict, stage_seconds: dict[str, float]) -> dict:
    """What a parent run shows beside another: the candidate's headline metrics (overall
    and per split), the champion's (`champion.*`), the safety suite's cheating numbers
    (`safety.*`) and each stage's wall time (`stage_seconds.*`)."""
    out: dict = {}

    def headline(prefix: str, block: dict | None) -> None:
        picked = {k: (block or {}).get(k) for k in HEADLINE}
        scalars, _, _ = metric_values(picked)
        out.update({f"{prefix}{k}": v for k, v in scalars.items()})

    candidate = evaluation.get("candidate") or {}
    headline("", candidate.get("overall"))
    for split, block in (candidate.get("by_split") or {}).items():
        headline(f"split.{split}.", block)
    headline("champion.", (evaluation.get("champion") or {}).get("overall"))
    mine = safety.get("candidate") or {}
    fooled = safety.get("fooled")
    cheating = {"attacks_fooled": len(fooled) if isinstance(fooled, list) else None,
                "candidate_violation_rate": mine.get("violation_rate"),
                "candidate_tampering_rate": mine.get("tampering_rate")}  # fmt: skip
    out.update({f"safety.{k}": float(v) for k, v in cheating.items() if _number(v)})
    out.update({f"stage_seconds.{k}": float(v) for k, v in stage_seconds.items()})
    return out


def end_pipeline_run(run_id: str, status: str = "FINISHED", tags: dict | None = None,
                     metrics: dict | None = None) -> None:  # fmt: skip
    from mlflow.entities import Metric

    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    ts = int(time.time() * 1000)
    batch = [Metric(_metric_key(k), float(v), ts, 0) for k, v in (metrics or {}).items()]
    for i in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[i : i + 1000])
    client.set_terminated(run_id, status=status)


def log_stage(parent_run_id: str, stage: str, params: dict, result: dict, seconds: float,
              artifacts: list[Path] = (), tags: dict | None = None,
              span: tuple[float | None, float | None] = (None, None)) -> str:  # fmt: skip
    """A nested run for one stage: its config as params, its numbers as metrics (a
    confidence interval as `_lo`/`_hi`, lists of numbers as per-step metrics, e.g. the SFT
    loss curve), per-group breakdowns as tables (`tables/<key>.json`), its files as
    artifacts. `span`: (started, ended), unix s, when the stage ran, so the run's duration
    is the stage's. Uses the client API so the parent run stays RUNNING while the pipeline
    goes on."""
    started, ended = span
    mlflow = _mlflow()
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    experiment = client.get_run(parent_run_id).info.experiment_id
    run_id = client.create_run(experiment, run_name=stage, start_time=_ms(started), tags={
        "mlflow.parentRunId": parent_run_id, "agentrl.stage": stage, "stage": stage,
        **{k: str(v) for k, v in (tags or {}).items()}}).info.run_id  # fmt: skip
    _log_params(client, run_id, params)
    ts = _ms(ended) or int(time.time() * 1000)
    scalars, curves, tables = metric_values(result)
    metrics = [Metric("stage_seconds", float(seconds), ts, 0)]
    metrics += [Metric(k, v, ts, 0) for k, v in scalars.items()]
    for key, values in curves.items():
        metrics += [Metric(key, x, ts, step) for step, x in enumerate(values)]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    for key, groups in tables.items():
        if isinstance(groups, dict) and groups:
            client.log_table(run_id, data=table_rows(groups), artifact_file=f"tables/{key}.json")
    for path in map(Path, artifacts):
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED", end_time=_ms(ended))
    return run_id


def start_trainer_run(uri: str, experiment: str, run_name: str, params: dict):
    """The mlflow module with a started run of a standalone trainer (SFT, DPO, GRPO) at
    tracking URI `uri`, its params logged; None when `uri` is empty (no tracking). The
    trainer logs its metrics on the module and ends the run."""
    if not uri:
        return None
    from components.cli import mlflow_telemetry_default

    mlflow_telemetry_default()  # before MLflow's import starts its telemetry client
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    mlflow.start_run(run_name=run_name)
    mlflow.log_params(params)
    return mlflow


def _messages(events: list[dict], upto: int, limit: int) -> list[dict]:
    """The chat the model saw before event `upto`, as OpenAI-style messages (what the UI
    renders as a conversation), each truncated to its last `limit` characters."""
    out = []
    for e in events[:upto]:
        role = e.get("role")
        if role == "assistant":
            text = e.get("completion") or json.dumps({"tool": e.get("action"),
                                                      "arguments": e.get("arguments")})  # fmt: skip
            out.append({"role": "assistant", "content": text[-limit:]})
        elif role == "environment":
            out.append({"role": "tool", "content": str(e.get("observation", ""))[-limit:]})
        else:
            out.append({"role": "user", "content": str(e.get("content", ""))[-limit:]})
    return out


def _outcome(record: dict, row: dict) -> tuple[str, str]:
    """(trace status, why): OK only for a solved task; a failed or unverified episode is
    an ERROR trace, so the UI's status column tells them apart."""
    meta = record.get("metadata", {})
    if row.get("status", meta.get("status")) == "infra_failure":
        return "ERROR", f"infra failure: {row.get('infra_detail', '')}"[:300]
    if row.get("success", meta.get("success")):
        return "OK", ""
    return "ERROR", f"task not solved (reward {record.get('reward')})"


def log_episode_traces(run_id: str, records: list[dict], results: list[dict] | None = None,
                       limit: int = 8, tags: dict | None = None,
                       text_limit: int = 2000) -> int:  # fmt: skip
    """Episodes as MLflow traces attached to run `run_id` (the evaluate stage's run): an
    AGENT span per episode, an LLM span per model turn (the chat it saw and the completion
    it sampled, truncated to `text_limit` characters, with token counts) and a TOOL span per
    tool call, then the verifier's span, all at the times the episode recorded
    (EpisodeResult.timing, from `results`, its results.json rows). The trace's status is the
    episode's outcome; `tags` (e.g. the pipeline run) go on every trace."""
    mlflow = _mlflow()
    from mlflow.entities import SpanStatus, SpanStatusCode
    from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey

    by_id = {r.get("episode_id"): r for r in results or []}
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    n = 0
    for record in records[:limit]:
        meta = record.get("metadata", {})
        row = by_id.get(record.get("id"), {})
        timing = row.get("timing") or {}
        if not timing:  # a run from before episodes kept their clock: nothing true to draw
            continue
        t0 = int(timing["start_unix"] * 1e9)
        at = lambda s, t0=t0: t0 + int(s * 1e9)  # noqa: E731 - offsets (s) -> span time (ns)
        status, why = _outcome(record, row)
        trace_tags = {"task_id": str(record.get("task_id")), "success": str(status == "OK"),
                      "reward": str(record.get("reward")), "split": str(meta.get("split")),
                      **{k: str(v) for k, v in (tags or {}).items()}}  # fmt: skip
        root = mlflow.start_span_no_context(
            f"episode {record.get('task_id')}", span_type="AGENT",
            inputs={"task": record.get("task", "")[:text_limit]},
            attributes={"task_id": record.get("task_id"), "policy": meta.get("policy"),
                        "split": meta.get("split"), "episode_id": record.get("id"),
                        "end_reason": meta.get("end_reason"), "wall_s": row.get("wall_s")},
            tags=trace_tags, metadata={TraceMetadataKey.SOURCE_RUN: run_id},
            experiment_id=experiment, start_time_ns=t0,
        )  # fmt: skip
        events = record.get("trajectory", [])
        turns = [i for i, e in enumerate(events) if e.get("role") == "assistant"]
        for i, (m0, m1, c0, c1) in zip(turns, timing.get("steps", []), strict=False):
            e = events[i]
            llm = mlflow.start_span_no_context(
                f"model turn {turns.index(i) + 1}", span_type="LLM", parent_span=root,
                inputs={"messages": _messages(events, i, text_limit)}, start_time_ns=at(m0),
            )  # fmt: skip
            if e.get("token_ids") is not None:
                sampled, prompt = len(e["token_ids"]), e.get("prompt_tokens") or 0
                llm.set_attribute(SpanAttributeKey.CHAT_USAGE, {
                    "input_tokens": prompt, "output_tokens": sampled,
                    "total_tokens": prompt + sampled})  # fmt: skip
            llm.set_outputs({"completion": (e.get("completion") or "")[:text_limit],
                             "action": e.get("action"), "arguments": e.get("arguments")})  # fmt: skip
            llm.end(end_time_ns=at(m1))
            obs = events[i + 1] if i + 1 < len(events) else {}
            # A completion that parsed to no tool call: the env answered with the error.
            called = f"tool {e['action']}" if e.get("action") else "invalid tool call"
            tool = mlflow.start_span_no_context(
                called, span_type="TOOL", parent_span=root,
                inputs=e.get("arguments") or {}, start_time_ns=at(c0),
            )  # fmt: skip
            tool.set_outputs({"observation": str(obs.get("observation", ""))[:text_limit],
                              "error": bool(obs.get("error"))})  # fmt: skip
            if obs.get("error"):
                tool.set_status(SpanStatus(SpanStatusCode.ERROR, "the tool call failed"))
            tool.end(end_time_ns=at(c1))
        if timing.get("verify"):
            v0, v1 = timing["verify"]
            check = mlflow.start_span_no_context("verify", span_type="EVALUATOR",
                                                 parent_span=root, start_time_ns=at(v0))  # fmt: skip
            check.set_outputs({"success": meta.get("success"), "reward": record.get("reward"),
                               "reward_terms": record.get("reward_terms")})  # fmt: skip
            check.end(end_time_ns=at(v1))
        root.set_outputs({"reward": record.get("reward"), "reward_terms": record.get("reward_terms"),
                          "success": meta.get("success"), "end_reason": meta.get("end_reason")})  # fmt: skip
        root.set_status(SpanStatus(SpanStatusCode[status], why))
        root.end(end_time_ns=at(float(row.get("wall_s") or 0.0)))
        n += 1
    mlflow.flush_trace_async_logging()
    return n


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with Path(path).open() as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
            if limit is not None and len(out) >= limit:
                break
    return out


def check_run(run_id: str) -> None:
    """Raises LookupError naming the run when the tracking store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        _mlflow().MlflowClient().get_run(run_id)
    except MlflowException as e:
        raise LookupError(f"no MLflow run {run_id!r} in {tracking_uri()}") from e


def log_rescore(summary: dict, source: dict, artifacts: list[Path], original_run_id: str = "",
                data_version: str = "") -> str:  # fmt: skip
    """A run of its own for `agentrl rescore`: flips and speed as metrics, the report as
    artifacts, the verifier versions as tags; linked both ways to the run whose episodes it
    rescored, when known (`rescore_of_run`, and `rescored_by_run` on that run)."""
    from mlflow.entities import Metric

    client = _mlflow().MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    tags = {"stage": "rescore", "agentrl.stage": "rescore", "git_commit": git_commit(),
            "verifier_version": summary["verifier_version"],
            "verifier_versions_before": ",".join(summary["judged_by_before"]),
            "source_kind": source.get("kind", ""), "source_path": source.get("path", "")}  # fmt: skip
    if original_run_id:
        tags["rescore_of_run"] = original_run_id
    if data_version:
        tags["data_version"] = data_version
    run_id = client.create_run(experiment, run_name=f"rescore {source.get('kind', '')}",
                               tags=tags).info.run_id  # fmt: skip
    numbers = {"episodes": summary["episodes"], "rescored": summary["rescored"],
               "not_rescored": summary["not_rescored"],
               "flips.pass_to_fail": summary["flips"]["pass->fail"],
               "flips.fail_to_pass": summary["flips"]["fail->pass"],
               "reward_changed": summary["reward_changed"], "diverged": summary["diverged"],
               "episodes_per_s": summary["episodes_per_s"], "seconds": summary["seconds"]}  # fmt: skip
    ts = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in numbers.items()
                                      if _number(v)])  # fmt: skip
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    if original_run_id:
        client.set_tag(original_run_id, "rescored_by_run", run_id)
        client.set_tag(original_run_id, "rescored_verifier_version", summary["verifier_version"])
    client.set_terminated(run_id)
    return run_id
