"""Command lines of the environment: `agentrl env eval` (a policy over tasks: per-task results
and trajectories) and `agentrl env isolation` (what the sandbox protects against, here).

    agentrl env eval --preset P --tasks DIR --policy oracle|model:DIR --out results.json
    agentrl env isolation
"""

from __future__ import annotations

import json

from components.cli_args import ArgumentParser
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import isolation_report
from components.stage_contract import stage


def main_isolation(argv: list[str]) -> int:
    ArgumentParser(prog="agentrl env isolation").parse_args(argv)
    print(json.dumps(isolation_report(SandboxConfig()), indent=2, default=str))
    return 0


@stage("env", "sandbox", "rollout", "evaluate")
def main_eval(argv: list[str]) -> int:
    """Run a policy over tasks: per-task results, and canonical trajectories if asked."""
    from components.cli_args import CommandError, existing_dir, output_file, positive_int
    from components.env.batch_eval import format_table, summarize, write_results
    from components.evaluate.__main__ import (
        common_options,
        load_settings,
        policy_or_model,
        progress_lines,
        run_episodes,
    )
    from components.output_files import disk_errors, line_log
    from components.tasks.task import SPLITS, load_tasks

    p = ArgumentParser(prog="agentrl env eval", description=main_eval.__doc__)
    common_options(p)
    p.add_argument("--tasks", required=True, type=existing_dir, help="folder of task folders")
    p.add_argument("--policy", required=True, type=policy_or_model,
                   help="a scripted policy (components/scripted/registry.py) or model:CHECKPOINT_DIR")  # fmt: skip
    p.add_argument("--out", required=True, type=output_file, help="per-task results JSON")
    p.add_argument("--split", choices=SPLITS, help="only tasks of this split")
    p.add_argument("--limit", type=positive_int, help="only the first N tasks (by id)")
    p.add_argument("--trajectories-out", type=output_file,
                   help="write canonical trajectories (JSONL)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no per-episode progress lines")
    args = p.parse_args(argv)
    settings = load_settings(args.preset, workers=args.workers)
    tasks, errors = load_tasks(args.tasks, split=args.split)
    if errors:  # the same folder fails `tasks check`: evaluating around it would hide that
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CommandError(f"invalid task: {errors[0]}{more}")
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise CommandError(f"no tasks found in {args.tasks}")
    progress = None if args.quiet else progress_lines(len(tasks), args.policy)
    # Each episode's result is written as it finishes (a full disk stops the run there).
    partial = args.out.with_name(f"{args.out.name}.episodes.jsonl")
    with line_log(partial, "episode results", {"tasks": len(tasks)}) as log:
        on_result = lambda r: (log(r.summary()), progress and progress(r))  # noqa: E731
        results = run_episodes(tasks, args.policy, settings, args.tasks, on_result)
    with disk_errors(args.out, "the results"):
        write_results(args.out, results, args.trajectories_out)
    partial.unlink()  # every result is in --out now
    print(format_table([summarize(results)]))
    print(f"\nper-task results: {args.out}")
    return 0
