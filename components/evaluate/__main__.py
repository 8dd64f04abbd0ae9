"""CLI of the evaluation stage: held-out evaluation with a report, and the safety suite.

python -m components.evaluate run --tasks runs/demo/tasks --policy oracle --out runs/eval
python -m components.evaluate safety --out runs/safety [--policy oracle]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from components.env.config import EnvConfig
from components.env.episode import EpisodeResult
from components.env.evaluate import EvalConfig, evaluate_policy, write_results
from components.env.sandbox import SandboxConfig
from components.evaluate.config import EvalSuiteConfig
from components.evaluate.metrics import aggregate
from components.evaluate.report import write_report
from components.tasks.task import SPLITS, Task, load_tasks

_RESULT_FIELDS = {f.name for f in dataclasses.fields(EpisodeResult)}


def load_results(path: str | Path) -> list[EpisodeResult]:
    """Results written by `write_results` (`agentrl env eval --out` or this command).

    The rows carry no trajectory, so trajectory metrics of a loaded run are None; success
    per task (what regression needs) is always there."""
    rows = json.loads(Path(path).read_text())["results"]
    return [EpisodeResult(**{k: v for k, v in row.items() if k in _RESULT_FIELDS}) for row in rows]


def oracle_step_counts(tasks: list[Task]) -> dict[str, int]:
    """The oracle's planned steps per task (no recovery detours): step efficiency's yardstick."""
    from components.env.policies import OraclePolicy

    oracle = OraclePolicy(recovery_rate=0.0)
    return {t.id: len(oracle.plan(t)) for t in tasks if t.has_reference}


def _make_policy(args: argparse.Namespace):
    if args.model:
        from components.rollout.config import RolloutConfig
        from components.rollout.engine import load_model_policy

        config = RolloutConfig(temperature=0.0, constrain_fix_ids=args.constrain_fix_ids)
        policy = load_model_policy(args.model, config)
        return lambda: policy
    from components.env.policies import make_policy

    make_policy(args.policy)  # fail fast on an unknown name
    return lambda: make_policy(args.policy, seed=args.seed)


def main_evaluate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="agentrl evaluate run", description=main_evaluate.__doc__)
    p.add_argument("--tasks", required=True, type=Path, help="folder of task folders")
    p.add_argument(
        "--split", action="append", choices=SPLITS, help="held-out split(s); default test"
    )
    p.add_argument("--policy", default="oracle", help="scripted policy: oracle | noop")
    p.add_argument("--model", help="a saved checkpoint folder (overrides --policy)")
    p.add_argument("--constrain-fix-ids", action="store_true",
                   help="--model draws try_fix ids only among listed untried candidates")  # fmt: skip
    p.add_argument("--champion-results", type=Path, help="the champion's results JSON")
    p.add_argument("--out", type=Path, default=Path("runs/eval"))
    p.add_argument("--limit", type=int, help="only the first N tasks of each split")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--title", default="Evaluation")
    args = p.parse_args(argv)
    cfg = EvalSuiteConfig(
        tasks_dir=str(args.tasks), splits=tuple(args.split or ("test",)), limit=args.limit,
        workers=args.workers, seed=args.seed, out_dir=str(args.out), title=args.title,
        champion_results=str(args.champion_results) if args.champion_results else None,
    )  # fmt: skip
    tasks: list[Task] = []
    for split in cfg.splits:
        found, errors = load_tasks(cfg.tasks_dir, split=split)
        for e in errors:
            print(f"agentrl: skipped invalid task: {e}", file=sys.stderr)
        tasks += found[: cfg.limit] if cfg.limit else found
    if not tasks:
        print(f"agentrl: no {'/'.join(cfg.splits)} tasks in {cfg.tasks_dir}", file=sys.stderr)
        return 2
    results = evaluate_policy(tasks, _make_policy(args), EnvConfig(), SandboxConfig(),
                              EvalConfig(workers=cfg.workers, seed=cfg.seed))  # fmt: skip
    by_id = {t.id: t for t in tasks}
    steps = oracle_step_counts(tasks)
    champion_results = load_results(cfg.champion_results) if cfg.champion_results else None
    agg = aggregate(results, champion_results, tasks=by_id, oracle_steps=steps)
    champion = (
        aggregate(champion_results, tasks=by_id, oracle_steps=steps) if champion_results else None
    )
    out = Path(cfg.out_dir)
    write_results(out / "results.json", results, out / "trajectories.jsonl")
    paths = write_report(agg, results, out, cfg.title, champion=champion)
    o = agg["overall"]
    print(f"success {o['success_rate']:.1%} over {o['verified']} verified episodes "
          f"({o['infra_failures']} infra failures); report: {paths['report']}")  # fmt: skip
    return 0


def main_safety(argv: list[str]) -> int:
    """Run every scripted attack (and optionally a candidate policy) on tempting tasks.
    Exit status 1 when any attack fooled the verifier."""
    p = argparse.ArgumentParser(prog="agentrl evaluate safety", description=main_safety.__doc__)
    p.add_argument("--out", type=Path, default=Path("runs/safety"))
    p.add_argument("--n-tasks", type=int, default=3, help="generated base tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--every-task", action="store_true", help="each attack on every task")
    p.add_argument("--attacks", help="comma-separated attack names (default: all)")
    p.add_argument("--policy", help="also measure this scripted policy on the tasks")
    p.add_argument("--model", help="also measure this checkpoint (overrides --policy)")
    p.add_argument("--constrain-fix-ids", action="store_true",
                   help="--model draws try_fix ids only among listed untried candidates")  # fmt: skip
    args = p.parse_args(argv)
    from components.evaluate.safety_suite import (
        ATTACKS,
        build_safety_tasks,
        evaluate_policy_safety,
        run_safety_suite,
    )

    attacks = ATTACKS
    if args.attacks:
        wanted = set(args.attacks.split(","))
        unknown = wanted - {a.name for a in ATTACKS}
        if unknown:
            print(f"agentrl: unknown attacks {sorted(unknown)}", file=sys.stderr)
            return 2
        attacks = tuple(a for a in ATTACKS if a.name in wanted)
    tasks = build_safety_tasks(args.out / "suite", args.n_tasks, args.seed)
    env, sandbox = EnvConfig(), SandboxConfig()
    report = run_safety_suite(tasks, env, sandbox, attacks=attacks, workers=args.workers,
                              every_task=args.every_task)  # fmt: skip
    payload = report.to_dict()
    if args.policy or args.model:
        payload["candidate"] = evaluate_policy_safety(
            _make_policy(args), tasks, env, sandbox, workers=args.workers
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "safety.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "safety.md").write_text("# Safety suite\n\n" + report.to_markdown() + "\n")
    print(report.to_markdown())
    return 0 if report.passed else 1


if __name__ == "__main__":
    commands = {"run": main_evaluate, "safety": main_safety}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m components.evaluate {run,safety} [options]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main_evaluate(sys.argv[2:]) if sys.argv[1] == "run" else main_safety(sys.argv[2:]))
