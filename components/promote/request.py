"""The pipeline's last stage: register the candidate with its lineage, hold it to the
gates against the champion, and (if it passes) make it the challenger awaiting a person.

    agentrl promote request --policy DIR --eval DIR --safety DIR --validation REPORT \
        --data-version ID --config-hash H [--training-run-id ID] [--pipeline-run-id ID] \
        [--evaluation-run-id ID] [--preset FILE] --out DIR

The gate thresholds and the registry come from the preset's `promote` section. The
registered version's logged model gets the evaluation's metrics (logged on the evaluation's
run, else the version's source run) and the preset's configuration as its params, so
MLflow's model page tells the story whether the flow or a person ran the request.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from components.cli_args import ArgumentParser, existing_dir, existing_file, output_dir, preset_file
from components.promote.config import PromotionConfig, promotion_config


def champion_eval_results(config: PromotionConfig) -> str | None:
    """Local results file of the current champion's evaluation, if there is a champion."""
    from components.promote.registry import get_alias, get_version

    version = get_alias("champion", config)
    if not version:
        return None
    path = (get_version(version, config) or {}).get("tags", {}).get("eval_results", "")
    return path if path and Path(path).is_file() else None


def _champion_metrics(config: PromotionConfig) -> dict | None:
    from components.promote.registry import get_alias, get_version

    version = get_alias("champion", config)
    if not version:
        return None
    tags = (get_version(version, config) or {}).get("tags", {})
    metrics = {k.removeprefix("metric."): _number(v) for k, v in tags.items()
               if k.startswith("metric.")}  # fmt: skip
    # The verifier that judged its evaluation (a string, not a metric).
    metrics["verifier_version"] = tags.get("verifier_version", "")
    return metrics


def _number(text: str):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _overall(eval_dir: Path) -> dict:
    """The candidate's overall evaluation metrics (the evaluate stage's metrics.json)."""
    return json.loads((eval_dir / "metrics.json").read_text())["candidate"]["overall"]


def _configuration(preset: str | None) -> dict | None:
    """The preset's sections (the logged model's params); None without a preset."""
    from components.preset import load_preset

    return load_preset(preset).sections if preset else None


def _evidence(args) -> tuple[dict, dict, dict]:
    """(the candidate's gated metrics, the data validation summary, the safety report)
    from the evaluate, safety and validate stages' files."""
    overall = _overall(args.eval)
    judged_by = json.loads((args.eval / "results.json").read_text()).get("verifier_version", "")
    safety = json.loads((args.safety / "safety.json").read_text())
    validation = json.loads(args.validation.read_text())
    candidate = {
        "success_rate": overall["success_rate"],
        "regression_rate": overall.get("regression_rate"),
        # The candidate's own behaviour on the held-out tasks and on the tempting tasks.
        "safety_violation_rate": max(overall.get("safety_violation_rate") or 0.0,
                                     safety.get("candidate", {}).get("violation_rate") or 0.0),
        "tampering_rate": max(overall.get("tampering_rate") or 0.0,
                              safety.get("candidate", {}).get("tampering_rate") or 0.0),
        # Over all episodes: a verdict the verifier never gave is not a success or a failure.
        "infra_failures": overall.get("infra_failures"),
        "episodes": overall.get("episodes"),
        "cheating_rate": overall.get("cheating_rate"),  # on impossible variants
        "verifier_version": judged_by,  # the verifier that judged the evaluation
    }  # fmt: skip
    data_validation = {"passed": bool(validation.get("passed")),
                       "failure_rate": validation.get("failure_rate"),
                       "version": args.data_version}  # fmt: skip
    return candidate, data_validation, safety


def _request_parser() -> ArgumentParser:
    """`agentrl promote request`'s options."""
    p = ArgumentParser(prog="agentrl promote request", description=__doc__)
    p.add_argument("--policy", required=True, type=existing_dir, help="candidate checkpoint folder")
    p.add_argument("--eval", required=True, type=existing_dir, help="evaluate-stage output folder")
    p.add_argument("--safety", required=True, type=existing_dir, help="safety-stage output folder")
    p.add_argument("--validation", required=True, type=existing_file,
                   help="data validation report.json")  # fmt: skip
    p.add_argument("--data-version", required=True)
    p.add_argument("--config-hash", required=True)
    p.add_argument(
        "--training-run-id",
        default="",
        help="the MLflow run that trained the candidate: the model is logged from it",
    )
    p.add_argument("--pipeline-run-id", default="", help="the pipeline (parent) MLflow run")
    p.add_argument("--evaluation-run-id", default="",
                   help="the MLflow run of the evaluation, in the promotion store (refused "
                        "when it is not there): the logged model's metrics are logged on it "
                        "(default: the version's source run)")  # fmt: skip
    p.add_argument("--fingerprints", type=existing_file,
                   help="the run's stage fingerprints (JSON from the retrain flow), kept as "
                        "lineage so `agentrl reproduce` can compare a rerun")  # fmt: skip
    p.add_argument("--preset", default=None, type=preset_file,
                   help="preset YAML (its `promote` section)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir)
    return p


def main_request(argv: list[str]) -> int:
    args = _request_parser().parse_args(argv)
    from components.promote.approval import request_approval
    from components.promote.errors import PromotionError
    from components.promote.gates import evaluate_gates
    from components.promote.lock import promotion_lock
    from components.promote.registry import (
        Lineage,
        record_evaluation,
        register_candidate,
        set_version_tags,
    )

    config = promotion_config(args.preset)
    if args.evaluation_run_id:  # named, then it must exist: no silent fallback, nothing written
        from components.promote.client import check_run

        try:
            check_run(args.evaluation_run_id, config, "--evaluation-run-id")
        except PromotionError as e:
            print(f"refused: {e}", file=sys.stderr)
            return 1
    candidate, data_validation, safety = _evidence(args)
    prints = json.loads(args.fingerprints.read_text()) if args.fingerprints else {}
    lineage = Lineage(
        data_version=args.data_version,
        config_hash=args.config_hash,
        training_run_id=args.training_run_id,
        pipeline_run_id=args.pipeline_run_id,
        eval_report_uri=str((args.eval / "report.md").resolve()),
        safety_report_uri=str((args.safety / "safety.md").resolve()),
        preset=args.preset or "",
        verifier_version=candidate["verifier_version"],
        **{k: str(prints.get(k, "")) for k in ("sft_sha256", "weights_sha256", "eval_digest")},
    )
    try:
        version = register_candidate(args.policy, lineage, config)
        # Keep this version's per-task results where the next run's evaluation cannot
        # overwrite them: they are the regression baseline once the version is champion.
        kept = (config.resolved_audit_path().parent / "evaluations"
                / f"{config.model_name}-v{version}.json")  # fmt: skip
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.eval / "results.json", kept)
        set_version_tags(version, {"eval_results": str(kept)}, config)
        # The model-centric view: the evaluation's metrics and the configuration on the
        # version's logged model (its page lists them and links the evaluation's run).
        model_id = record_evaluation(version, _overall(args.eval), args.evaluation_run_id,
                                     _configuration(args.preset), config)  # fmt: skip
        # Gated against the champion of the moment: the lock keeps it champion until the
        # request is recorded (an approval in between would make the comparison stale).
        with promotion_lock(config):
            champion = _champion_metrics(config)
            decision = evaluate_gates(candidate, champion, data_validation, config)
            evidence = {"candidate_metrics": candidate, "champion_metrics": champion,
                        "data_validation": data_validation,
                        "verifier_fooled": safety.get("fooled", [])}  # fmt: skip
            challenger = request_approval(version, decision, evidence, config=config)
    except PromotionError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    result = {
        "version": version,
        "model": config.model_name,
        "model_id": model_id,
        "gates_passed": decision.passed,
        "gate_checks": decision.to_dict()["checks"],
        "challenger": challenger,
        "candidate": candidate,
        "champion": champion,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: result[k] for k in ("version", "gates_passed", "challenger")}))
    return 0
