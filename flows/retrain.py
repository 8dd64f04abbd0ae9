"""retrain: ingest -> validate -> snapshot -> SFT -> sample -> verify -> DPO/GRPO/RS ->
evaluate -> safety -> promotion request. Each step is one `agentrl` stage (flows/stages.py);
this file only wires their inputs and outputs.

    .venv/bin/python -m flows.retrain [--preset configs/cpu-demo.yaml] [--wait-for-approval]
                                      [--launcher in-process|subprocess|kubernetes]

Where the stages run is the preset's `launcher` section (components/launch/config.py:
mode, namespace, image, api_url, resources ...); `--launcher` overrides its mode only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from prefect import flow

from flows import stages

DATA_REPORT = "reports/data_validation/report.json"


def _stage(name, argv, result_file, parent_run_id, params=None, artifacts=(), depends_on=(),
           launcher=None) -> dict:  # fmt: skip
    print(f"==> {name}: agentrl {' '.join(map(str, argv))}", flush=True)
    # A cached result is only good while the stage's files are still there.
    task = stages.run.with_options(refresh_cache=not Path(result_file).is_file())
    state = task(name, [str(a) for a in argv], str(result_file), depends_on=depends_on,
                 config=params or {}, checkout=str(Path.cwd().resolve()),
                 launcher=launcher, return_state=True)  # fmt: skip
    result = state.result()
    cached = state.name == "Cached"
    print(f"    {name}: {'cached' if cached else 'done'} in {result['_stage_seconds']:.0f}s",
          flush=True)  # fmt: skip
    stages.track(name, parent_run_id, params or {}, result, [str(a) for a in artifacts], cached)
    return result


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


def _policy_dir(result: dict) -> str:
    for key in ("policy_dir", "checkpoint_dir"):
        if result.get(key):
            return str(result[key])
    sft = result.get("sft") or {}
    return str(sft.get("policy_dir") or sft.get("checkpoint_dir") or "")


@flow(name="retrain", log_prints=True)
def retrain(preset: str = "configs/cpu-demo.yaml", wait_for_approval: bool = False,
            launcher_mode: str = "") -> dict:  # fmt: skip
    """`launcher_mode` ('' = the preset's `launcher.mode`, else in-process) overrides where
    the stages run; the rest of the preset's `launcher` section applies in every mode."""
    from components.preset import load_preset, validate_preset
    from components.promote.request import champion_eval_results

    p = load_preset(preset)
    validate_preset(p)
    pipe = p.raw("pipeline")
    w = Path(pipe.get("workdir", "runs/pipeline"))
    gen = p.raw("tasks")
    launcher = launcher_settings(p, launcher_mode)
    parent = stages.open_run(f"retrain {p.name}", p.sections,
                             {"preset": p.name, "config_hash": p.config_hash()})  # fmt: skip
    # Stage command lines use paths relative to this folder: a stage runs in it (a Job's
    # workingDir, which must then be on the volume shared with this flow's pod), and its
    # Job is labelled with this run (agentrl/run-id), unless the preset says otherwise.
    kw = {"launcher": {"run_id": parent, "cwd": str(Path.cwd().resolve()), **launcher}}
    status = "FAILED"
    try:
        # Generation is deterministic for (n, seed): regenerating yields the same bytes.
        suite = _stage("generate", ["tasks", "generate", "--out", w / "tasks", "--n",
                       gen.get("n_tasks", 300), "--seed", gen.get("seed", 0), "--overwrite"],
                       w / "tasks" / "suite.json", parent, gen, **kw)  # fmt: skip
        gate = _stage("gate", ["tasks", "check", "--tasks", w / "tasks", "--report",
                      w / "gate.json"], w / "gate.json", parent, depends_on=(suite,),
                      **kw)  # fmt: skip
        expert = _stage("expert", ["env", "eval", "--tasks", w / "tasks", "--split",
                        pipe.get("train_split", "train"), "--policy",
                        pipe.get("expert_policy", "oracle"), "--out",
                        w / "expert" / "results.json", "--trajectories-out",
                        w / "expert" / "expert.jsonl", "--quiet"],
                        w / "expert" / "results.json", parent, depends_on=(gate,),
                        **kw)  # fmt: skip
        ingest = _stage("ingest", ["data", "ingest", w / "expert" / "expert.jsonl"],
                        "data/ingested/manifest.json", parent, depends_on=(expert,),
                        **kw)  # fmt: skip
        validation = _stage("validate", ["data", "validate", "--eval-tasks", w / "tasks"],
                            DATA_REPORT, parent, depends_on=(ingest,),
                            artifacts=["reports/data_validation"], **kw)  # fmt: skip
        data = _stage(
            "snapshot",
            ["data", "snapshot", "-m", f"retrain {p.name}"],
            "data-versions.jsonl",
            parent,
            depends_on=(validation,),
            **kw,
        )
        init = _stage("policy-init", ["policy", "init", "--preset", preset, "--records",
                      w / "expert" / "expert.jsonl", "--out", w / "policy0"],
                      w / "policy0" / "result.json", parent, p.raw("policy"),
                      depends_on=(data,), **kw)  # fmt: skip
        sft = _stage("sft", ["train", "sft", "--preset", preset, "--policy",
                     init["policy_dir"], "--records", "data/validated", "--out", w / "sft"],
                     w / "sft" / "result.json", parent, p.raw("sft"), depends_on=(init,),
                     **kw)  # fmt: skip
        candidate, training = _policy_dir(sft), sft
        algorithms = pipe.get("algorithms", ["grpo"])
        start = _fingerprint(sft)
        if {"dpo", "rs"} & set(algorithms):
            samples = _stage("sample", ["rollout", "sample", "--preset", preset, "--policy",
                             candidate, "--tasks", w / "tasks", "--split", "train", "--limit",
                             pipe.get("sample_tasks", 8), "--out", w / "samples"],
                             w / "samples" / "result.json", parent, p.raw("rollout"),
                             depends_on=(sft,), **kw)  # fmt: skip
        for algo in algorithms:
            if algo == "grpo":
                g = p.section("grpo")
                r = p.section("rollout")
                training = _stage("grpo", ["train", "grpo", "--policy", _policy_dir(sft),
                                  "--tasks", w / "tasks", "--split", "train", "--out",
                                  w / f"grpo-{start}", "--iterations", g.iterations, "--group-size",
                                  g.group_size, "--tasks-per-iteration",
                                  g.tasks_per_iteration, "--lr", g.learning_rate, "--beta",
                                  g.beta, "--max-new-tokens", r.max_new_tokens, "--max-steps",
                                  r.max_steps, "--max-episode-tokens", r.max_episode_tokens,
                                  "--temperature", r.temperature,
                                  *(["--constrain-fix-ids"] if r.constrain_fix_ids else [])],
                                  w / f"grpo-{start}" / "result.json", parent, p.raw("grpo"),
                                  depends_on=(sft,), **kw)  # fmt: skip
            elif algo in ("dpo", "rs"):
                training = _stage(algo, ["train", algo, "--preset", preset, "--policy",
                                  _policy_dir(sft), "--samples", w / "samples", "--out",
                                  w / f"{algo}-{start}"], w / f"{algo}-{start}" / "result.json",
                                  parent,
                                  p.raw("dpo" if algo == "dpo" else "rejection_sampling"),
                                  depends_on=(samples,), **kw)  # fmt: skip
            else:
                raise ValueError(f"unknown algorithm {algo!r} in {preset}")
            candidate = _policy_dir(training) or candidate
        # The agent is the model plus its decoder: evaluate it the way it samples.
        constrain = ["--constrain-fix-ids"] if p.section("rollout").constrain_fix_ids else []
        champion = champion_eval_results(_promotion_config())
        limit = pipe.get("eval_limit", 0)
        evaluation = _stage("evaluate", ["evaluate", "run", "--tasks", w / "tasks", "--split",
                            pipe.get("eval_split", "test"), "--model", candidate,
                            *(["--limit", limit] if limit else []),
                            *(["--champion-results", champion] if champion else []),
                            "--out", w / "eval", "--title", f"Candidate ({p.name})",
                            *constrain],
                            w / "eval" / "metrics.json", parent, depends_on=(training,),
                            artifacts=[w / "eval" / "report.md", *sorted(
                                (w / "eval").glob("*.png"))], **kw)  # fmt: skip
        stages.log_traces(parent, str(w / "eval" / "trajectories.jsonl"), 8)
        safety = _stage("safety", ["evaluate", "safety", "--out", w / "safety", "--n-tasks",
                        pipe.get("safety_tasks", 2), "--model", candidate, *constrain],
                        w / "safety" / "safety.json", parent, depends_on=(training,),
                        artifacts=[w / "safety" / "safety.md"], **kw)  # fmt: skip
        promotion = _stage("promote-request", ["promote", "request", "--policy", candidate,
                           "--eval", w / "eval", "--safety", w / "safety", "--validation",
                           DATA_REPORT, "--data-version", data.get("version", ""),
                           "--config-hash", p.config_hash(), "--training-run-id", parent,
                           "--out", w / "promote"], w / "promote" / "result.json", parent,
                           depends_on=(evaluation, safety, validation), **kw)  # fmt: skip
        status = "FINISHED"
    finally:
        stages.close_run(parent, status, {"data_version": locals().get("data", {}).get(
            "version", ""), "candidate": locals().get("candidate", "")})  # fmt: skip
    summary = {"run_id": parent, "data_version": data.get("version"), "candidate": candidate,
               "evaluation": evaluation["candidate"]["overall"], "promotion": promotion}  # fmt: skip
    if wait_for_approval and promotion.get("challenger"):
        from components.promote.approval import wait_for_approval_in_prefect

        summary["approval"] = wait_for_approval_in_prefect(promotion["version"])
    return summary


def _live_status(version) -> dict:
    from components.promote.registry import get_version

    try:
        v = get_version(str(version), _promotion_config())
    except Exception:  # noqa: BLE001 - a summary line must not fail the run
        return {"status": "unknown", "aliases": []}
    return {"status": v["tags"].get("approval_status", "unknown"), "aliases": v["aliases"]}


def _promotion_config():
    from components.promote.config import load_config

    return load_config()


def print_summary(summary: dict) -> None:
    from components.tracking import tracking_uri

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
    live = _live_status(version)  # the stage may be cached; the registry is the truth now
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
    print("\nUIs:")
    print(f"  MLflow:  .venv/bin/mlflow ui --backend-store-uri {tracking_uri()} --port 5000")
    print("  Prefect: .venv/bin/prefect server start   (then http://127.0.0.1:4200)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.retrain", description=__doc__)
    p.add_argument("--preset", default="configs/cpu-demo.yaml")
    p.add_argument("--wait-for-approval", action="store_true",
                   help="pause the flow for approval in the Prefect UI")  # fmt: skip
    p.add_argument("--launcher", default="", choices=["in-process", "subprocess", "kubernetes"],
                   help="where stages run (default: the preset's launcher.mode, "
                        "else in-process)")  # fmt: skip
    args = p.parse_args(argv)
    summary = retrain(args.preset, args.wait_for_approval, args.launcher)
    print_summary(summary)
    Path("runs").mkdir(exist_ok=True)
    Path("runs/last-retrain.json").write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
