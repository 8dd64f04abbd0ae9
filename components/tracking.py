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


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else the embedded default: SQLite + a local artifact folder."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlruns' / 'mlflow.db'}"
    )


def _mlflow():
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None and uri.startswith("sqlite:"):
        artifacts = REPO_ROOT / "mlruns" / "artifacts" / EXPERIMENT
        artifacts.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(EXPERIMENT, artifact_location=artifacts.as_uri())
    mlflow.set_experiment(EXPERIMENT)
    return mlflow


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


def start_pipeline_run(name: str, params: dict, tags: dict) -> str:
    """Create the parent run; it stays RUNNING until `end_pipeline_run`."""
    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id
    run = client.create_run(experiment, run_name=name, tags={
        **{k: str(v) for k, v in tags.items()}, "git_commit": git_commit(),
        "agentrl.kind": "pipeline"})  # fmt: skip
    _log_params(client, run.info.run_id, params)
    return run.info.run_id


def _log_params(client, run_id: str, params: dict) -> None:
    from mlflow.entities import Param

    flat = [Param(k, str(v)[:500]) for k, v in flatten("", params, {}).items()]
    for i in range(0, len(flat), 100):  # the tracking API takes at most 100 params a call
        client.log_batch(run_id, params=flat[i : i + 100])


def end_pipeline_run(run_id: str, status: str = "FINISHED", tags: dict | None = None) -> None:
    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    client.set_terminated(run_id, status=status)


def log_stage(parent_run_id: str, stage: str, params: dict, result: dict, seconds: float,
              artifacts: list[Path] = (), tags: dict | None = None) -> str:  # fmt: skip
    """A nested run for one stage: its config as params, its numbers as metrics (lists of
    numbers become per-step metrics, e.g. the SFT loss curve), its files as artifacts.
    Uses the client API so the parent run stays RUNNING while the pipeline goes on."""
    mlflow = _mlflow()
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    experiment = client.get_run(parent_run_id).info.experiment_id
    run_id = client.create_run(experiment, run_name=stage, tags={
        "mlflow.parentRunId": parent_run_id, "agentrl.stage": stage,
        **{k: str(v) for k, v in (tags or {}).items()}}).info.run_id  # fmt: skip
    _log_params(client, run_id, params)
    ts = int(time.time() * 1000)
    metrics = [Metric("stage_seconds", float(seconds), ts, 0)]
    for key, value in flatten("", result, {}).items():
        if isinstance(value, int | float) and value == value:  # bools too; not NaN
            metrics.append(Metric(_metric_key(key), float(value), ts, 0))
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        ):
            metrics += [
                Metric(_metric_key(key), float(x), ts, step) for step, x in enumerate(value)
            ]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    for path in map(Path, artifacts):
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED")
    return run_id


def log_episode_traces(run_id: str, records: list[dict], limit: int = 8) -> int:
    """Episodes as MLflow traces: an AGENT span per episode, an LLM span per model turn and
    a TOOL span per tool call, so a person can open an episode in the UI. Records carry no
    per-step clock, so spans divide the episode's wall time evenly (marked in attributes)."""
    mlflow = _mlflow()
    n = 0
    with mlflow.start_run(run_id=run_id):
        for record in records[:limit]:
            meta = record.get("metadata", {})
            events = record.get("trajectory", [])
            steps = max(1, sum(e.get("role") == "assistant" for e in events))
            wall_ns = int(float(meta.get("wall_s") or 1.0) * 1e9)
            step_ns = wall_ns // (2 * steps)
            t = time.time_ns() - wall_ns
            root = mlflow.start_span_no_context(
                f"episode {record.get('task_id')}", span_type="AGENT",
                inputs={"task": record.get("task", "")[:2000]},
                attributes={"task_id": record.get("task_id"), "policy": meta.get("policy"),
                            "split": meta.get("split"), "timing": "evenly divided"},
                start_time_ns=t,
            )  # fmt: skip
            for i, e in enumerate(events):
                if e.get("role") != "assistant":
                    continue
                llm = mlflow.start_span_no_context(
                    f"model turn {i // 2 + 1}", span_type="LLM", parent_span=root,
                    inputs={"context_events": i}, start_time_ns=t,
                )  # fmt: skip
                llm.set_outputs({"content": e.get("content"), "action": e.get("action"),
                                 "arguments": e.get("arguments")})  # fmt: skip
                t += step_ns
                llm.end(end_time_ns=t)
                obs = events[i + 1] if i + 1 < len(events) else {}
                tool = mlflow.start_span_no_context(
                    f"tool {e.get('action')}", span_type="TOOL", parent_span=root,
                    inputs=e.get("arguments") or {}, start_time_ns=t,
                )  # fmt: skip
                tool.set_outputs({"observation": str(obs.get("observation", ""))[:4000],
                                  "error": bool(obs.get("error"))})  # fmt: skip
                t += step_ns
                tool.end(end_time_ns=t)
            root.set_outputs({"reward": record.get("reward"),
                              "reward_terms": record.get("reward_terms"),
                              "success": meta.get("success")})  # fmt: skip
            root.end(end_time_ns=t)
            n += 1
    mlflow.flush_trace_async_logging()
    # start_run(run_id=...) above ended the parent run on exit; the pipeline is still going.
    mlflow.MlflowClient().update_run(run_id, status="RUNNING")
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
