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
from dataclasses import dataclass, field
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
    "agentrl-ppo": "Standalone PPO runs with a learned value function (agentrl train ppo).",
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
    if mlflow.get_experiment_by_name(EXPERIMENT) is None and uri.startswith("sqlite:///"):
        # Beside the database, wherever it is (a test's store must not write the checkout's
        # mlruns/); MLflow's own default would be ./mlruns of the working directory.
        artifacts = Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / EXPERIMENT
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
    """Per-group blocks (`by_family`, `by_bug_class`, `by_source`, `by_split`, and a count's
    groups such as `counts.family`) go to tables: a column each in the runs table made it
    hundreds of columns wide."""
    parts = key.split(".")
    return parts[-1].startswith("by_") or (len(parts) > 1 and parts[-2] == "counts")


# Blocks of a stage result that say how it ran, not what it measured: params and the
# run's settings.json, never metrics (as metrics they were most of the runs table's columns).
SETTINGS_BLOCKS = ("config", "settings")
# The list that numbers a curve's points (GRPO's per-iteration curves carry `iteration`,
# SFT's held-out losses `eval_steps`); a curve without one is numbered from step 1, as an
# optimizer counts its steps.
STEP_LISTS = {"eval_losses": "eval_steps"}
ITERATION = "iteration"


@dataclass
class StageNumbers:
    """A stage result sorted for MLflow: `scalars` (metrics; an interval as `_lo`/`_hi`),
    `curves` (metric key -> [(step, value)]), `tables` (breakdowns, one table each) and
    `settings` (flattened configuration: params)."""

    scalars: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    tables: dict[str, dict] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)


def _numbers(value) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    )


def _steps(block: dict, key: str, n: int) -> list[int]:
    """The steps of list `key` of `block`: its own step list when the block has one of the
    same length, else 1..n."""
    for name in (STEP_LISTS.get(key), ITERATION):
        steps = block.get(name) if name else None
        if name != key and _numbers(steps) and len(steps) == n:
            return [int(s) for s in steps]
    return list(range(1, n + 1))


def metric_values(result: dict) -> StageNumbers:
    """A stage result's numbers as `StageNumbers`. GRPO's `curves` block is its per-iteration
    metrics: each curve is logged under its own name at step = iteration, and `last` (the
    curves' last points again) is left out; step lists themselves are not curves."""
    out = StageNumbers()

    def walk(prefix: str, value) -> None:
        last = prefix.rsplit(".", 1)[-1]
        if isinstance(value, dict):
            if last in SETTINGS_BLOCKS:
                out.settings.update(flatten(prefix, value, {}))
            elif last == "overall":
                # An evaluation's `overall` (43 numbers): its headline numbers are metrics,
                # all of them a one-row table named after the policy (`candidate`, ...).
                out.tables[prefix] = {(prefix.split(".")[-2:])[0]: value}
                for k in HEADLINE:
                    walk(f"{prefix}.{k}", value.get(k))
            elif prefix and _breakdown(prefix):
                out.tables[prefix] = value
            else:
                lists = value.get("curves") if isinstance(value.get("curves"), dict) else {}
                for k, v in value.items():
                    if k == "last" and lists:
                        continue
                    if k == "curves" and lists:  # its curves under their own names
                        curves(prefix, v)
                    elif _numbers(v):
                        curves(prefix, {k: v}, value)
                    else:
                        walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif _number(value):
            out.scalars[_metric_key(prefix)] = float(value)
        elif _interval(prefix, value):
            lo, hi = interval_keys(prefix)
            out.scalars[_metric_key(lo)], out.scalars[_metric_key(hi)] = map(float, value)

    def curves(prefix: str, lists: dict, block: dict | None = None) -> None:
        block = lists if block is None else block
        for k, values in lists.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if _interval(key, values):
                walk(key, values)
            elif _numbers(values) and k not in (ITERATION, *STEP_LISTS.values()):
                steps = _steps(block, k, len(values))
                out.curves[_metric_key(key)] = [
                    (s, float(x)) for s, x in zip(steps, values, strict=True)
                ]

    walk("", result)
    return out


def column_name(key: str) -> str:
    """A table column's name: no dots (MLflow's table view reads a dotted name as a path
    into the row and shows the column blank)."""
    return key.replace(".", "_")


def table_rows(groups: dict) -> dict[str, list]:
    """A breakdown ({group: metrics}) as the columns of one table, a row per group, `group`
    first: what `log_table` stores and the UI's artifact view shows as a grid."""
    rows = []
    for name, block in groups.items():
        numbers = metric_values(block if isinstance(block, dict) else {"value": block})
        rows.append({"group": str(name), **{column_name(k): v for k, v in numbers.scalars.items()}})
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

    flat = [Param(_metric_key(k), str(v)[:500]) for k, v in flatten("", params, {}).items()]
    for i in range(0, len(flat), 100):  # the tracking API takes at most 100 params a call
        client.log_batch(run_id, params=flat[i : i + 100])


# The candidate's headline numbers a parent run carries (keys of metrics.json's `overall`;
# cheating_rate: success on impossible variants, gated by promote.max_cheating_rate).
HEADLINE = ("success_rate", "success_ci95", "test_pass_rate", "tool_call_accuracy",
            "valid_call_rate", "recovery_rate", "mean_reward", "safety_violation_rate",
            "tampering_rate", "human_intervention_rate", "infra_failures",
            "infra_failure_rate", "regression_rate", "cheating_rate", "episodes")  # fmt: skip


def pipeline_metrics(evaluation: dict, safety: dict, stage_seconds: dict[str, float]) -> dict:
    """What a parent run shows beside another: the candidate's headline metrics (per split:
    the evaluate run's `by_split` table and the report), the champion's (`champion.*`), the safety suite's cheating numbers
    (`safety.*`) and each stage's wall time (`stage_seconds.*`)."""
    out: dict = {}

    def headline(prefix: str, block: dict | None) -> None:
        picked = {k: (block or {}).get(k) for k in HEADLINE}
        out.update({f"{prefix}{k}": v for k, v in metric_values(picked).scalars.items()})

    candidate = evaluation.get("candidate") or {}
    headline("", candidate.get("overall"))
    headline("champion.", (evaluation.get("champion") or {}).get("overall"))
    mine = safety.get("candidate") or {}
    fooled = safety.get("fooled")
    cheating = {"attacks_fooled": len(fooled) if isinstance(fooled, list) else None,
                "candidate_violation_rate": mine.get("violation_rate"),
                "candidate_tampering_rate": mine.get("tampering_rate")}  # fmt: skip
    out.update({f"safety.{k}": float(v) for k, v in cheating.items() if _number(v)})
    out.update({f"stage_seconds.{k}": float(v) for k, v in stage_seconds.items()})
    return out


def promotion_tags(promotion: dict, model_id: str = "") -> dict[str, str]:
    """What the parent run says about its candidate's promotion (the promote-request
    stage's result): the registered version, its logged model (`models:/<id>`), the gate
    decision (the failed checks named) and where approval stands."""
    if not promotion.get("version"):
        return {"gate_decision": "not requested", "approval": "not requested"}
    failed = [c["name"] for c in promotion.get("gate_checks", []) if not c.get("passed")]
    decision = "passed" if promotion.get("gates_passed") else f"failed: {', '.join(failed)}"
    approval = (
        "pending: challenger awaiting a person (agentrl promote approve)"
        if promotion.get("challenger")
        else "not requested: the gates failed"
    )
    tags = {
        "registered_model": str(promotion.get("model", "")),
        "registered_version": str(promotion["version"]),
        "gate_decision": decision,
        "approval": approval,
    }
    if model_id:
        tags["registered_model_uri"] = f"models:/{model_id}"
    return tags


def pipeline_note(
    name: str, status: str, data_version: str, evaluation: dict, tags: dict[str, str]
) -> str:
    """The parent run's description (markdown, MLflow's `mlflow.note.content`): what ran,
    on which data, what the candidate scored and what became of it."""
    overall = (evaluation.get("candidate") or {}).get("overall") or {}
    rate, ci = overall.get("success_rate"), overall.get("success_ci95") or []
    shown = "n/a" if rate is None else f"{rate:.1%}"
    if rate is not None and len(ci) == 2:
        shown += f" (95% CI {ci[0]:.1%} - {ci[1]:.1%})"
    lines = [
        f"**{name}**: {status.lower()}",
        "",
        f"- data version: {data_version or 'n/a'}",
        f"- candidate success on held-out tasks: {shown}",
        f"- registered: {tags.get('registered_model', '-')} v{tags.get('registered_version', '-')}",
        f"- gates: {tags.get('gate_decision', 'not requested')}",
        f"- approval: {tags.get('approval', 'not requested')}",
        "- reports: artifacts `reports/` of this run; stage runs below it",
    ]
    return "\n".join(lines)


def describe_pipeline_run(
    run_id: str, note: str, reports: list[Path] = (), tags: dict | None = None
) -> dict[str, str]:
    """The parent run's description (`mlflow.note.content`), its reports under
    `reports/` and `tags`; returns each report's `runs:/` URI by file name (a run's
    artifacts outlive the pipeline folder the next run overwrites)."""
    client = _mlflow().MlflowClient()
    client.set_tag(run_id, NOTE_TAG, note)
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    uris = {}
    for path in map(Path, reports):
        if path.is_file():
            client.log_artifact(run_id, str(path), artifact_path="reports")
            uris[path.name] = f"runs:/{run_id}/reports/{path.name}"
    return uris


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
    """A nested run for one stage: its preset sections and the configuration its result
    reports (`config`, `settings` blocks) as params, its numbers as metrics (a confidence
    interval as `_lo`/`_hi`; lists of numbers as curves at their own steps, e.g. the SFT
    loss per optimizer step, GRPO's curves per iteration), per-group breakdowns as tables
    (`tables/<key>.json`), the whole result as `result.json`, its files as artifacts.
    `span`: (started, ended), unix s, when the stage ran, so the run's duration is the
    stage's. Uses the client API so the parent run stays RUNNING while the pipeline goes on."""
    started, ended = span
    mlflow = _mlflow()
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    experiment = client.get_run(parent_run_id).info.experiment_id
    run_id = client.create_run(experiment, run_name=stage, start_time=_ms(started), tags={
        "mlflow.parentRunId": parent_run_id, "agentrl.stage": stage, "stage": stage,
        **{k: str(v) for k, v in (tags or {}).items()}}).info.run_id  # fmt: skip
    numbers = metric_values(result)
    flat = flatten("", params, {})
    _log_params(
        client, run_id, {**{k: v for k, v in numbers.settings.items() if k not in flat}, **flat}
    )
    ts = _ms(ended) or int(time.time() * 1000)
    metrics = [Metric("stage_seconds", float(seconds), ts, 0)]
    metrics += [Metric(k, v, ts, 0) for k, v in numbers.scalars.items()]
    for key, points in numbers.curves.items():
        metrics += [Metric(key, x, ts, step) for step, x in points]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    for key, groups in numbers.tables.items():
        if isinstance(groups, dict) and groups:
            client.log_table(run_id, data=table_rows(groups), artifact_file=f"tables/{key}.json")
    client.log_dict(run_id, result, "result.json")
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


def log_episode_traces(
    run_id: str,
    records: list[dict],
    results: list[dict] | None = None,
    limit: int = 8,
    tags: dict | None = None,
) -> int:
    """A sample of `records` by outcome (solved, failed, flagged) as traces of run
    `run_id`, every span at the episode's recorded time: components/traces.py."""
    from components.traces import log_traces

    return log_traces(_mlflow(), run_id, records, results or [], limit, tags)


def log_evaluation_traces(
    run_id: str,
    trajectories: str | Path,
    results: str | Path,
    limit: int = 8,
    tags: dict | None = None,
) -> int:
    """`log_episode_traces` for an evaluation's files (trajectories.jsonl, results.json),
    sampled over all its episodes; 0 when it wrote no trajectories."""
    path, rows = Path(trajectories), Path(results)
    if not path.exists():
        return 0
    timed = json.loads(rows.read_text())["results"] if rows.exists() else []
    return log_episode_traces(run_id, read_jsonl(path), timed, limit, tags)


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
