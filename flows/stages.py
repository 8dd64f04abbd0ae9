"""The Prefect tasks the flows are made of. Each runs one `agentrl` command as a stage
(in-process, subprocess or Kubernetes Job, per the launcher config), caches its result
on its inputs, retries infrastructure faults, and leaves MLflow logging to `track`."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import INPUTS

# A stage's cache key is its command line + the results it depends on; not the MLflow run,
# nor where it ran (the launcher settings).
STAGE_CACHE = INPUTS - "launcher"


def _infra_fault(task, task_run, state) -> bool:
    """Retry only what a rerun can fix: the launcher's own faults, not a failing stage."""
    try:
        state.result()
    except Exception as e:  # noqa: BLE001 - classify whatever the stage raised
        reason = str(getattr(getattr(e, "result", None), "reason", "") or e)
        return any(w in reason for w in ("OOMKilled", "Evicted", "ImagePull", "timed out",
                                         "Connection", "unschedulable"))  # fmt: skip
    return False


@task(cache_policy=STAGE_CACHE, persist_result=True, retries=2, retry_delay_seconds=5,
      retry_condition_fn=_infra_fault, task_run_name="{name}")  # fmt: skip
def run(name: str, argv: list[str], result_file: str, depends_on: tuple = (),
        config: dict | None = None, checkout: str = "",
        launcher: dict | str | None = None) -> dict:  # fmt: skip
    """Run `agentrl ARGV`; return the JSON it left in `result_file` (+ timing).

    `launcher`: LauncherConfig fields (the preset's `launcher` section) or just a mode;
    None runs in-process. `config` (the stage's preset section) and `checkout` (the absolute
    working folder) are unused here but part of the cache key: the command line names the
    preset file, not its content, and its relative paths mean different files in another
    checkout."""
    import time

    from components.launch.config import launcher_config_from_dict
    from components.launch.launcher import run_stage

    t0 = time.monotonic()
    run_stage(name, argv, launcher_config_from_dict(launcher), log=_stage_log())
    path = Path(result_file)
    result = _read_result(path)
    # To the millisecond, as MLflow times runs: a stage of a few ms is not recorded as 0.
    result["_stage_seconds"] = round(time.monotonic() - t0, 3)
    result["_result_file"] = str(path)
    return result


def _stage_log():
    """Where the launcher sends a stage's output: the task run's logger. The Kubernetes
    launcher streams a pod's log from a thread of its own, where Prefect's `log_prints`
    does not reach (it needs the run context), so `print` would miss the run's log."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger().info
    except MissingContextError:  # the task's body called outside a run (tests)
        return print


def _read_result(path: Path) -> dict:
    if path.suffix == ".jsonl":  # a log: its last line is the newest entry
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        return json.loads(lines[-1]) if lines else {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {"value": data}


@task(task_run_name="track-{name}")
def track(name: str, parent_run_id: str, params: dict, result: dict, artifacts: list[str],
          cached: bool = False, started: float | None = None,
          ended: float | None = None) -> str:  # fmt: skip
    """The stage's MLflow run, spanning `started`..`ended` (unix s: when it ran in this
    pipeline run; a cached stage's is its cache lookup, its `stage_seconds` the original's)."""
    from components.tracking import log_stage

    shown = {k: v for k, v in result.items() if not k.startswith("_")}
    return log_stage(parent_run_id, name, params, shown, result.get("_stage_seconds", 0.0),
                     [Path(a) for a in artifacts], tags={"cached": str(cached)},
                     span=(started, ended))  # fmt: skip


# What this process has open per parent run: Ctrl-C/SIGTERM (components/shutdown.py) marks
# the MLflow run (and its RUNNING stage runs) KILLED and the Prefect flow run Crashed,
# instead of leaving both RUNNING for ever.
_OPEN_RUNS: dict[str, list[int]] = {}


@task
def open_run(name: str, params: dict, tags: dict) -> str:
    from components.shutdown import kill_run_on_stop
    from components.tracking import start_pipeline_run

    run_id = start_pipeline_run(name, params, tags)
    _OPEN_RUNS[run_id] = [kill_run_on_stop(run_id)]
    return run_id


@task
def close_run(run_id: str, status: str, tags: dict, metrics: dict | None = None) -> None:
    from components.shutdown import forget
    from components.tracking import end_pipeline_run

    end_pipeline_run(run_id, status, tags, metrics)
    for key in _OPEN_RUNS.pop(run_id, []):
        forget(key)


def crash_flow_run(flow_run_id: str) -> None:
    """Mark the flow run Crashed in Prefect's history (the command was stopped)."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Crashed(message="stopped by a signal"), force=True)


@task
def link_runs(run_id: str) -> dict:
    """Cross-links between the two UIs: the Prefect flow run's id and URL as MLflow tags,
    the MLflow run's id and URL as the flow run's tags; returns the MLflow URL."""
    from prefect import get_client
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    from components.shutdown import on_stop
    from components.tracking import run_url, set_run_tags

    url = run_url(run_id)
    links = {"prefect.flow_run_id": flow_run.id or "", "prefect.flow_run_name": flow_run.name or ""}
    if flow_run.id:
        ui = PREFECT_UI_URL.value() or "http://127.0.0.1:4200"
        links["prefect.flow_run_url"] = f"{ui.rstrip('/')}/runs/flow-run/{flow_run.id}"
        with get_client(sync_client=True) as client:
            tags = [*(flow_run.tags or []), f"mlflow_run_id:{run_id}"]
            client.update_flow_run(flow_run.id, tags=tags)
        flow_run_id = flow_run.id  # (prefect.runtime reads it from the calling thread)
        crash = on_stop(f"Prefect flow run {flow_run_id}", lambda: crash_flow_run(flow_run_id))
        _OPEN_RUNS.setdefault(run_id, []).append(crash)
    set_run_tags(run_id, {k: v for k, v in links.items() if v})
    return {"mlflow_run_url": url, **links}


@task
def fingerprints(data_version: str, sft_dir: str, candidate_dir: str, eval_results: str,
                 out: str) -> dict:  # fmt: skip
    """What a reproduction compares, stage by stage (components/lineage.py), also written
    to `out` for the promotion request to record as lineage."""
    from components.lineage import results_digest, weights_sha256

    values = {"data_version": data_version, "sft_sha256": weights_sha256(sft_dir),
              "weights_sha256": weights_sha256(candidate_dir),
              "eval_digest": results_digest(eval_results)}  # fmt: skip
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(values, indent=2) + "\n")
    return values


def runtime_tags(launcher: dict) -> dict:
    """What the run's numbers may depend on besides its inputs: torch's intra-op threads
    (fixed here to the launcher's `torch_threads`, as every stage has them), the
    deterministic-algorithms switch, the CPU count, and the vector ISA torch's CPU kernels
    dispatch to (AVX512 / AVX2 / ...: another ISA's kernels may round differently,
    docs/reproducibility.md)."""
    import os

    import torch

    from components.launch.config import launcher_config_from_dict
    from components.launch.launcher import fix_torch_threads

    fix_torch_threads(launcher_config_from_dict(launcher).torch_threads)
    return {"torch_threads": str(torch.get_num_threads()),
            "torch_deterministic": str(torch.are_deterministic_algorithms_enabled()),
            "cpu_count": str(os.cpu_count()), "torch_version": torch.__version__,
            "cpu_isa": torch.backends.cpu.get_cpu_capability()}  # fmt: skip


@task
def log_traces(run_id: str, trajectories: str, results: str, limit: int,
               tags: dict | None = None) -> int:  # fmt: skip
    """`limit` episodes of an evaluation, sampled by outcome (solved, failed, flagged), as
    traces of run `run_id` at the times their results.json rows recorded."""
    from components.tracking import log_evaluation_traces

    return log_evaluation_traces(run_id, trajectories, results, limit, tags)
