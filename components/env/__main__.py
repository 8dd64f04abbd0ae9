"""CLI of the environment: `agentrl env eval`, `agentrl env isolation`, `agentrl demo`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from components.env.config import EnvConfig
from components.env.evaluate import (
    EvalConfig,
    evaluate_policy,
    format_table,
    summarize,
    write_results,
)
from components.env.sandbox import SandboxConfig, isolation_report
from components.tasks.task import SPLITS, load_tasks


def _progress(total: int, label: str, every: int = 1):
    """Print a progress line per `every` finished episodes (to stderr)."""
    state = {"done": 0, "ok": 0}

    def tick(result) -> None:
        state["done"] += 1
        state["ok"] += result.success
        if state["done"] % every == 0 or state["done"] == total:
            mark = "ok" if result.success else ("INFRA" if result.status != "ok" else "fail")
            print(f"      [{label} {state['done']:>3}/{total}] {state['ok']} successes so far"
                  f" (last: {result.task_id} {mark})", file=sys.stderr, flush=True)  # fmt: skip

    return tick


def evaluate_checkpoint(
    tasks,
    policy_dir: str,
    seed: int,
    workers: int,
    *,
    max_new_tokens: int = 192,
    max_steps: int = 8,
    constrain_fix_ids: bool = False,
):
    """Greedy pass@1 of a checkpoint, episodes batched through the rollout engine."""
    from components.policy.model import load_policy
    from components.rollout.config import RolloutConfig
    from components.rollout.engine import sample_episodes

    model, tokenizer = load_policy(policy_dir)
    config = RolloutConfig(temperature=0.0, samples_per_task=1, seed=seed, workers=workers,
                           max_new_tokens=max_new_tokens, max_steps=max_steps,
                           batch_size=min(16, max(1, len(tasks))),
                           constrain_fix_ids=constrain_fix_ids)  # fmt: skip
    rollouts = sample_episodes(tasks, model, tokenizer, config, EnvConfig(), SandboxConfig(),
                               policy_name=f"model:{Path(policy_dir).name}")  # fmt: skip
    return [r.result for r in rollouts]


def main_eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="agentrl env eval", description="Run a policy over tasks.")
    p.add_argument("--tasks", required=True, type=Path, help="folder of task folders")
    p.add_argument(
        "--policy", required=True, help="oracle | oracle-fixes | noop | model:CHECKPOINT_DIR"
    )
    p.add_argument("--out", required=True, type=Path, help="per-task results JSON")
    p.add_argument("--split", choices=SPLITS, help="only tasks of this split")
    p.add_argument("--limit", type=int, help="only the first N tasks (by id)")
    p.add_argument("--trajectories-out", type=Path, help="write canonical trajectories (JSONL)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no per-episode progress lines")
    args = p.parse_args(argv)
    from components.env.policies import make_policy

    tasks, errors = load_tasks(args.tasks, split=args.split)
    for e in errors:
        print(f"agentrl: skipped invalid task: {e}", file=sys.stderr)
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        print(f"agentrl: no tasks found in {args.tasks}", file=sys.stderr)
        return 2
    if args.policy.startswith("model:"):
        results = evaluate_checkpoint(tasks, args.policy.removeprefix("model:"), args.seed,
                                      args.workers)  # fmt: skip
    else:
        make_policy(args.policy)  # fail fast on an unknown name
        results = evaluate_policy(
            tasks,
            lambda: make_policy(args.policy, seed=args.seed),
            EnvConfig(),
            SandboxConfig(),
            EvalConfig(workers=args.workers, seed=args.seed),
            on_result=None if args.quiet else _progress(len(tasks), args.policy),
        )
    write_results(args.out, results, args.trajectories_out)
    print(format_table([summarize(results)]))
    print(f"\nper-task results: {args.out}")
    return 0


def main_isolation(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="agentrl env isolation").parse_args(argv)
    print(json.dumps(isolation_report(SandboxConfig()), indent=2, default=str))
    return 0


def main_demo(argv: list[str]) -> int:
    """Generate the built-in suite, gate the test split, compare oracle and noop on it."""
    p = argparse.ArgumentParser(prog="agentrl demo", description=main_demo.__doc__)
    p.add_argument("--out", type=Path, default=Path("runs/demo"))
    p.add_argument("--n", type=int, default=300, help="tasks to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    from components.env.policies import make_policy
    from components.env.verifier import sandboxed_test_runner
    from components.tasks.gate import check_tasks
    from components.tasks.generate import GenerateConfig, generate_suite

    t0 = time.monotonic()
    tasks_dir = args.out / "tasks"
    print(f"[1/4] generating {args.n} tasks (seed {args.seed}) into {tasks_dir}", flush=True)
    report = generate_suite(tasks_dir, GenerateConfig(n_tasks=args.n, seed=args.seed))
    print(f"      {report.summary_line()}", flush=True)
    tasks, errors = load_tasks(tasks_dir, split="test")
    for e in errors:
        print(f"      invalid task: {e}")
    print(f"[2/4] gating the {len(tasks)} test-split tasks in the sandbox", flush=True)
    gate = check_tasks(tasks, sandboxed_test_runner(), workers=args.workers)
    for task_id, reason in sorted(gate.failed.items()):
        print(f"      gate FAILED {task_id}: {reason}")
    gated = [t for t in tasks if t.id in set(gate.passed)]
    print(f"      {len(gated)} passed, {len(gate.failed)} reported", flush=True)
    summaries = []
    for i, name in enumerate(("oracle", "noop"), start=3):
        print(f"[{i}/4] {name} policy on the test split", flush=True)
        results = evaluate_policy(
            gated, lambda n=name: make_policy(n, seed=args.seed), EnvConfig(), SandboxConfig(),
            EvalConfig(workers=args.workers, seed=args.seed),
            on_result=_progress(len(gated), name, every=10),
        )  # fmt: skip
        write_results(args.out / f"results-{name}.json", results, args.out / f"traj-{name}.jsonl")
        summaries.append(summarize(results))
    print("\nEnvironment demo: oracle vs noop on the test split (unseen function families)\n")
    print(format_table(summaries))
    terms = summaries[0]["mean_reward_terms"]
    print("\nmean reward terms (oracle): " + ", ".join(f"{k}={v:+.2f}" for k, v in terms.items()))
    terms = summaries[1]["mean_reward_terms"]
    print("mean reward terms (noop):   " + ", ".join(f"{k}={v:+.2f}" for k, v in terms.items()))
    print(f"\nresults: {args.out}/results-*.json   trajectories: {args.out}/traj-*.jsonl")
    print(f"sandbox: {isolation_report(SandboxConfig()).get('summary', '')}")
    print(f"total {time.monotonic() - t0:.0f}s")
    return 0


def main_tasks_check(argv: list[str]) -> int:
    """`agentrl tasks check`: the data gate, with hidden tests run by the sandboxed verifier."""
    from components.env.verifier import sandboxed_test_runner
    from components.tasks.__main__ import main_check

    return main_check(argv, run_tests=sandboxed_test_runner())


def main_tasks_import(argv: list[str]) -> int:
    """`agentrl tasks import`: load any folder of tasks, gate them in the sandbox, copy."""
    from components.env.verifier import sandboxed_test_runner
    from components.tasks.__main__ import main_import

    return main_import(argv, run_tests=sandboxed_test_runner())
