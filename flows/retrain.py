"""retrain: ingest -> validate -> snapshot -> SFT -> sample -> verify -> DPO/GRPO/RS ->
evaluate -> safety -> promotion request. Each step is one `agentrl` stage (flows/stages.py);
this file only wires their inputs and outputs.

    .venv/bin/python -m flows.retrain [--preset configs/cpu-demo.yaml] [--wait-for-approval]
                                      [--launcher in-process|subprocess|kubernetes]

That command line is flows/retrain_main.py: it validates the preset and starts Prefect's
server (the preset's `runtime` budget) before this module, and Prefect, are imported.

Where the stages run is the preset's `launcher` section (components/launch/config.py:
mode, namespace, image, api_url, resources ...); `--launcher` overrides its mode only.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # checks before Prefect's import (seconds): flows/retrain_main.py
    import runpy  # (run as that module's script: it imports this one, as `flows.retrain`)

    runpy.run_module("flows.retrain_main", run_name="__main__", alter_sys=True)

from prefect import flow  # noqa: E402

from components.preset import DEFAULT_PRESET, Preset
from components.verifier.version import verifier_version
from flows import stages

DATA_REPORT = "reports/data_validation/report.json"


@dataclass(frozen=True)
class StageOutput:
    """A stage's result file as written (`values`: what depends on it is cached on them and
    MLflow records them) and read into its contract's result (`result`, None for a report)."""

    values: dict
    result: object = None


@dataclass(frozen=True)
class Run:
    """What every stage of one retrain run shares: the preset, its folder, the MLflow parent
    run and where stages run."""

    preset: Preset
    workdir: Path
    parent_run_id: str
    launcher: dict
    refresh: bool = False  # rerun every stage, cached or not (a reproduction)
    # Filled as stages run: each stage's MLflow run id and its wall time in this run.
    mlflow_runs: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)

    def stage(self, name: str, argv: list, result_file, depends_on=(),
              artifacts=()) -> StageOutput:  # fmt: skip
        """Run `agentrl ARGV --preset FILE` as stage `name` (cached on its command line, the
        preset sections its contract declares and its upstream results); log it to MLflow."""
        from components.cli import command

        argv = [str(a) for a in [*argv, "--preset", self.preset.path]]
        contract = command(argv).contract
        sections = {k: self.preset.raw(k) for k in contract.reads}
        print(f"==> {name}: agentrl {' '.join(argv)}", flush=True)
        # A cached result is only good while the stage's files are still there.
        task = stages.run.with_options(
            refresh_cache=self.refresh or not Path(result_file).is_file()
        )
        started = time.time()
        # The verifier version is part of the key: a verifier fix must not reuse verdicts.
        key_config = {**sections, "verifier_version": verifier_version()}
        upstream = tuple(d.values for d in depends_on)
        state = task(name, argv, str(result_file), depends_on=upstream, config=key_config,
                     checkout=str(Path.cwd().resolve()), launcher=self.launcher,
                     return_state=True)  # fmt: skip
        result = state.result()
        ended = time.time()
        cached = state.name == "Cached"
        print(f"    {name}: {'cached' if cached else 'done'} in {result['_stage_seconds']:.0f}s",
              flush=True)  # fmt: skip
        self.mlflow_runs[name] = stages.track(name, self.parent_run_id, sections, result,
                                              [str(a) for a in artifacts], cached, started,
                                              ended)  # fmt: skip
        self.stage_seconds[name] = round(ended - started, 3)
        return StageOutput(result, contract.read(result))


def launcher_settings(preset, mode: str = "") -> dict:
    """The preset's `launcher` section (LauncherConfig fields), `mode` overriding its mode
    when given; checked here, so a misspelt setting fails before the first stage runs."""
    from components.launch.config import launcher_config_from_dict

    settings = {**preset.raw("launcher"), **({"mode": mode} if mode else {})}
    launcher_config_from_dict(settings)
    return settings


def _fingerprint(result: dict) -> str:
    """Short id of an upstream result: a training stage writes to `<algo>-<id>`, so it
    resumes its own checkpoints after a kill but never one trained from another policy."""
    # Keys starting with "_" are bookkeeping (stage timings): two identical runs differ there.
    content = {k: v for k, v in result.items() if not k.startswith("_")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:8]


def data_stages(run: Run, pipe) -> tuple[StageOutput, StageOutput, StageOutput]:
    """tasks (+ mined tasks) -> gate -> expert trajectories -> ingest -> validate -> snapshot:
    (the task suite's result, the validation report, the data version)."""
    w = run.workdir
    suite = run.stage("generate", ["tasks", "generate", "--out", w / "tasks", "--overwrite"],
                      w / "tasks" / "suite.json")  # fmt: skip
    before_gate = (suite,)
    if pipe.mined_tasks:  # built environments first: the import gates the tasks with them
        prepared = run.stage("prepare", ["tasks", "prepare", "--tasks", pipe.mined_tasks,
                             "--report", w / "prepare.json"], w / "prepare.json",
                             depends_on=(suite,))  # fmt: skip
        before_gate = (run.stage("mined", ["tasks", "import", pipe.mined_tasks, "--out",
                                 w / "tasks" / "mined", "--overwrite", "--report",
                                 w / "mined.json"], w / "mined.json",
                                 depends_on=(prepared,)),)  # fmt: skip
    gate = run.stage("gate", ["tasks", "check", "--tasks", w / "tasks", "--report",
                     w / "gate.json"], w / "gate.json", depends_on=before_gate)  # fmt: skip
    expert = run.stage("expert", ["env", "eval", "--tasks", w / "tasks", "--split",
                       pipe.train_split, "--policy", pipe.expert_policy, "--out",
                       w / "expert" / "results.json", "--trajectories-out",
                       w / "expert" / "expert.jsonl", "--quiet"],
                       w / "expert" / "results.json", depends_on=(gate,))  # fmt: skip
    ingest = run.stage("ingest", ["data", "ingest", w / "expert" / "expert.jsonl", "--overwrite"],
                       "data/ingested/manifest.json", depends_on=(expert,))  # fmt: skip
    validation = run.stage("validate", ["data", "validate", "--eval-tasks", w / "tasks"],
                           DATA_REPORT, depends_on=(ingest,),
                           artifacts=["reports/data_validation"])  # fmt: skip
    data = run.stage("snapshot", ["data", "snapshot", "-m", f"retrain {run.preset.name}"],
                     "data-versions.jsonl", depends_on=(validation,))  # fmt: skip
    return suite, validation, data


def training_stages(run: Run, pipe, data: StageOutput) -> tuple[str, StageOutput, str]:
    """policy init -> SFT -> each RL algorithm from the SFT policy: (the candidate's policy
    folder, the last training stage's result, the SFT policy folder)."""
    w = run.workdir
    init = run.stage("policy-init", ["policy", "init", "--records", w / "expert" / "expert.jsonl",
                     "--out", w / "policy0"], w / "policy0" / "result.json",
                     depends_on=(data,))  # fmt: skip
    sft = run.stage("sft", ["train", "sft", "--policy", init.result.policy_dir, "--records",
                    "data/validated", "--out", w / "sft"], w / "sft" / "result.json",
                    depends_on=(init,))  # fmt: skip
    sft_dir = sft.result.policy_dir
    candidate, training, start = sft_dir, sft, _fingerprint(sft.values)
    if {"dpo", "rs"} & set(pipe.algorithms):
        samples = run.stage("sample", ["rollout", "sample", "--policy", candidate, "--tasks",
                            w / "tasks", "--split", pipe.train_split, "--limit",
                            pipe.sample_tasks, "--out", w / "samples"],
                            w / "samples" / "result.json", depends_on=(sft,))  # fmt: skip
    for algo in pipe.algorithms:
        out = w / f"{algo}-{start}"
        if algo in ("grpo", "ppo"):  # sample their own episodes, from the tasks
            argv = ["train", algo, "--policy", sft_dir, "--tasks", w / "tasks",
                    "--split", pipe.train_split, "--out", out]  # fmt: skip
            upstream = sft
        else:
            argv = ["train", algo, "--policy", sft_dir, "--samples", w / "samples",
                    "--out", out]  # fmt: skip
            upstream = samples
        training = run.stage(algo, argv, out / "result.json", depends_on=(upstream,))
        candidate = training.result.policy_dir or candidate
    return candidate, training, sft_dir


def evaluation_stages(run: Run, candidate: str,
                      training: StageOutput) -> tuple[StageOutput, StageOutput]:  # fmt: skip
    """Held-out evaluation (beside the champion's results, if any) and the safety suite."""
    from components.promote.request import champion_eval_results
    from components.tracking import log_evaluation_traces

    w = run.workdir
    champion = champion_eval_results(_promotion_config(run.preset))
    evaluation = run.stage("evaluate", ["evaluate", "run", "--tasks", w / "tasks", "--model",
                           candidate, *(["--champion-results", champion] if champion else []),
                           "--out", w / "eval", "--title", f"Candidate ({run.preset.name})"],
                           w / "eval" / "metrics.json", depends_on=(training,),
                           artifacts=[w / "eval" / "report.md",
                                      *sorted((w / "eval").glob("*.png"))])  # fmt: skip
    # On the evaluate run, tagged with this pipeline run (an original's traces and its
    # reproduction's look alike otherwise).
    # A sample by outcome (solved, failed, flagged) of all its episodes, not the first few.
    log_evaluation_traces(
        run.mlflow_runs["evaluate"],
        w / "eval" / "trajectories.jsonl",
        w / "eval" / "results.json",
        8,
        {"pipeline_run_id": run.parent_run_id},
    )
    safety = run.stage("safety", ["evaluate", "safety", "--out", w / "safety", "--model",
                       candidate], w / "safety" / "safety.json", depends_on=(training,),
                       artifacts=[w / "safety" / "safety.md"])  # fmt: skip
    return evaluation, safety


def describe_parent(
    run: Run, status: str, data_version: str, evaluation: dict, promotion: dict
) -> None:
    """The parent run's model-centric record: its description, the reports and the
    version, gate and approval tags. (The registered version's logged model got the
    candidate's evaluation and the configuration from `promote request` itself.)"""
    from components.tracking import describe_pipeline_run, pipeline_note, promotion_tags

    tags = promotion_tags(promotion, str(promotion.get("model_id") or ""))
    name = f"{'reproduce' if run.refresh else 'retrain'} {run.preset.name}"
    w = run.workdir
    describe_pipeline_run(
        run.parent_run_id,
        pipeline_note(name, status, data_version, evaluation, tags),
        [w / "eval" / "report.md", w / "safety" / "safety.md", w / "promote" / "result.json"],
        tags,
    )


def flow_run_name() -> str:
    """`retrain <preset> <UTC time>` (`reproduce ...` for a reproduction): the Prefect run's
    name, matching the MLflow parent run's."""
    from prefect.runtime import flow_run

    from components.preset import load_preset

    params = flow_run.parameters
    kind = "reproduce" if params.get("reproduction_of") else "retrain"
    preset = params.get("preset") or DEFAULT_PRESET
    try:
        name = load_preset(preset).name
    except Exception:  # noqa: BLE001 - a bad preset fails in the flow, with its own error
        name = Path(preset).stem
    return f"{kind} {name} {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}"


@flow(name="retrain", log_prints=True, flow_run_name=flow_run_name)
def retrain(preset: str = DEFAULT_PRESET, wait_for_approval: bool = False,
            launcher_mode: str = "", request_promotion: bool = True,
            reproduction_of: dict | None = None) -> dict:  # fmt: skip
    """`launcher_mode` ('' = the preset's `launcher.mode`, else in-process) overrides where
    the stages run; the rest of the preset's `launcher` section applies in every mode.
    `request_promotion=False` with `reproduction_of` {version, run_id} is how flows/reproduce.py
    reruns a version: every stage reruns (no cache), nothing is registered. The run holds
    its workdir's and data repository's locks (components/workdir_lock.py; free when its
    command line already holds them)."""
    from components.preset import load_preset, validate_preset
    from components.workdir_lock import pipeline_locks

    p = load_preset(preset)
    validate_preset(p)
    with pipeline_locks(p, f"retrain flow {p.path}"):
        return run_pipeline(p, wait_for_approval, launcher_mode, request_promotion,
                            reproduction_of)  # fmt: skip


def promotion_request(run: Run, pipe, candidate: str, data_version: str,
                      depends_on: tuple) -> StageOutput:  # fmt: skip
    """The promote-request stage: the candidate logged as an MLflow model from the run of
    the stage that trained it, the evaluation's metrics on the evaluate stage's run."""
    w = run.workdir
    trained_by = pipe.algorithms[-1] if pipe.algorithms else "sft"
    return run.stage("promote-request", ["promote", "request", "--policy", candidate,
                     "--eval", w / "eval", "--safety", w / "safety", "--validation",
                     DATA_REPORT, "--data-version", data_version, "--config-hash",
                     run.preset.config_hash(), "--training-run-id",
                     run.mlflow_runs[trained_by], "--evaluation-run-id",
                     run.mlflow_runs["evaluate"], "--pipeline-run-id", run.parent_run_id,
                     "--fingerprints", w / "fingerprints.json", "--out", w / "promote"],
                     w / "promote" / "result.json", depends_on=depends_on)  # fmt: skip


def run_pipeline(p: Preset, wait_for_approval: bool, launcher_mode: str,
                 request_promotion: bool, reproduction_of: dict | None) -> dict:  # fmt: skip
    """The retrain flow's body (its arguments, the preset loaded and checked)."""
    from components.workdir_lock import TOKEN_ENV, run_token

    pipe = p.section("pipeline")
    launcher = launcher_settings(p, launcher_mode)
    tags = {"preset": p.name, "config_hash": p.config_hash(),
            "verifier_version": verifier_version(), **stages.runtime_tags(launcher)}  # fmt: skip
    if reproduction_of:
        tags.update({"reproduction_of_version": reproduction_of["version"],
                     "reproduction_of_run": reproduction_of.get("run_id", "")})  # fmt: skip
    parent = stages.open_run(f"{'reproduce' if reproduction_of else 'retrain'} {p.name}",
                             p.sections, tags)  # fmt: skip
    links = stages.link_runs(parent)
    print(f"MLflow run {parent}: {links['mlflow_run_url']}", flush=True)
    # Stage command lines use paths relative to this folder: a stage runs in it (a Job's
    # workingDir, which must then be on the volume shared with this flow's pod), and its
    # Job is labelled with this run (agentrl/run-id), unless the preset says otherwise.
    # Stages carry the run's token: a Job writes into the workdir and data/ this run holds
    # (components/workdir_lock.py; a subprocess inherits it, a Job's pod gets it here).
    env = {**launcher.get("env", {}), TOKEN_ENV: run_token()}
    run = Run(p, Path(pipe.workdir), parent,
              {"run_id": parent, "cwd": str(Path.cwd().resolve()), **launcher, "env": env},
              refresh=reproduction_of is not None)  # fmt: skip
    status, data_version, candidate, fingerprints = "FAILED", "", "", {}
    evaluation = safety = promotion = StageOutput({})
    try:
        _, validation, data = data_stages(run, pipe)
        data_version = data.result.version
        candidate, training, sft_dir = training_stages(run, pipe, data)
        evaluation, safety = evaluation_stages(run, candidate, training)
        w = run.workdir
        fingerprints = stages.fingerprints(data_version, sft_dir, candidate,
                                           str(w / "eval" / "results.json"),
                                           str(w / "fingerprints.json"))  # fmt: skip
        if request_promotion:
            promotion = promotion_request(run, pipe, candidate, data_version,
                                          (evaluation, safety, validation))  # fmt: skip
        status = "FINISHED"
    finally:
        from components.tracking import pipeline_metrics

        # The candidate by the run that trained it: its folder is the next run's to reuse.
        trained = run.mlflow_runs.get(pipe.algorithms[-1] if pipe.algorithms else "sft")
        try:
            describe_parent(run, status, data_version, evaluation.values, promotion.values)
        finally:  # the run is closed whatever describing it raised
            stages.close_run(
                parent,
                status,
                {
                    "data_version": data_version,
                    **fingerprints,
                    "candidate_run": f"runs:/{trained}" if trained else "",
                },
                pipeline_metrics(evaluation.values, safety.values, run.stage_seconds),
            )
    summary = {"run_id": parent, "mlflow_run_url": links["mlflow_run_url"],
               "data_version": data_version, "candidate": candidate,
               "evaluation": evaluation.result.candidate["overall"],
               "promotion": promotion.values, "preset": p.path, "fingerprints": fingerprints,
               "stage_seconds": run.stage_seconds}  # fmt: skip
    if wait_for_approval and promotion.result and promotion.result.challenger:
        from components.promote.approval import wait_for_approval_in_prefect

        summary["approval"] = wait_for_approval_in_prefect(promotion.result.version)
        from components.tracking import set_run_tags

        set_run_tags(parent, {"approval": summary["approval"]})  # approved, rejected, timed_out
    return summary


def _live_status(version, preset_path: str) -> dict:
    from components.preset import load_preset
    from components.promote.registry import get_version

    try:
        v = get_version(str(version), _promotion_config(load_preset(preset_path)))
    except Exception:  # noqa: BLE001 - a summary line must not fail the run
        return {"status": "unknown", "aliases": []}
    return {"status": v["tags"].get("approval_status", "unknown"), "aliases": v["aliases"]}


def _promotion_config(preset=None):
    """The preset's `promote` section (the dataclass defaults without a preset)."""
    from components.promote.config import PromotionConfig

    return preset.section("promote") if preset is not None else PromotionConfig()


def print_summary(summary: dict) -> None:
    from components.tracking import pipeline_runs_url, pipeline_search_filter, tracking_uri

    ev, pr = summary["evaluation"], summary["promotion"]
    lo, hi = ev.get("success_ci95") or ev.get("success_ci") or (None, None)
    print("\n=== Candidate evaluation (held-out split) ===")
    rows = [("task success", ev.get("success_rate")), ("test pass rate", ev.get("test_pass_rate")),
            ("tool-call accuracy", ev.get("tool_call_accuracy")),
            ("valid call rate", ev.get("valid_call_rate")),
            ("recovery rate", ev.get("recovery_rate")),
            ("safety violation rate", ev.get("safety_violation_rate")),
            ("tampering rate", ev.get("tampering_rate")),
            ("human intervention rate", ev.get("human_intervention_rate")),
            ("infra failure rate", ev.get("infra_failure_rate")),
            ("cheating rate", ev.get("cheating_rate")),
            ("regression rate", ev.get("regression_rate"))]  # fmt: skip
    for name, value in rows:
        shown = "n/a" if value is None else (f"{value:.1%}" if isinstance(value, float) else value)
        print(f"  {name:<26} {shown}")
    if lo is not None:
        print(f"  {'success 95% CI':<26} {lo:.1%} - {hi:.1%}")
    print("\n=== Promotion gates ===")
    for c in pr.get("gate_checks", []):
        print(f"  [{'pass' if c['passed'] else 'FAIL'}] {c['name']}: {c.get('reason', '')}")
    version, model = pr.get("version"), pr.get("model", "agentrl-coder")
    live = _live_status(
        version, summary["preset"]
    )  # the stage may be cached; the registry is the truth now
    print(f"\nmodel {model} version {version}: data version {summary['data_version']}; "
          f"status {live['status']}, aliases {live['aliases'] or '-'}")  # fmt: skip
    if live["status"] not in ("pending", "unknown"):
        print(f"Version {version} is already decided ({live['status']}); nothing awaits approval.")
    elif pr.get("challenger"):
        print(f"PENDING APPROVAL: version {version} is the challenger. A person decides:")
        print(f"  .venv/bin/agentrl promote approve {version} --reason '...'")
        print(f"  .venv/bin/agentrl promote reject {version} --reason '...'")
    else:
        print("Gates failed: the candidate is not a challenger; nothing awaits approval.")
    times = summary.get("stage_seconds") or {}
    print("\n=== Stage timings (s; 0 = cached) ===\n  " + "  ".join(f"{k} {v:.0f}"
          for k, v in times.items()) + f"  | total {sum(times.values()):.0f}")  # fmt: skip
    print("\nUIs:")
    print(f"  MLflow:  .venv/bin/mlflow ui --backend-store-uri {tracking_uri()} --port 5000")
    print(f"           this run: {summary['mlflow_run_url']}")
    print(f"           pipeline runs only ({pipeline_search_filter()}): {pipeline_runs_url()}")
    print("           tick two there and press Compare")
    print("  Prefect: .venv/bin/prefect server start   (then http://127.0.0.1:4200)")
