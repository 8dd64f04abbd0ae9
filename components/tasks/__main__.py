"""`python -m components.tasks {generate,check,import} ...` (wired as `agentrl tasks ...`).

Each subcommand is a function taking an argv list and returning an exit code, with the
test runner as a parameter so the caller can swap in the sandboxed verifier.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from components.tasks.gate import RunTests, check_tasks, subprocess_run_tests
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.task import load_tasks


def main_generate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tasks generate", description="write the built-in suite")
    p.add_argument("--preset", default=None,
                   help="preset YAML whose `tasks` section configures the suite "
                        "(default: the section's defaults)")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output folder (must be empty)")
    p.add_argument("--n", type=int, help="override tasks.n_tasks")
    p.add_argument("--seed", type=int, help="override tasks.seed")
    p.add_argument("--overwrite", action="store_true", help="replace a previous suite in --out")
    args = p.parse_args(argv)
    if args.preset:
        from components.preset import stage_config

        config = stage_config(args.preset, "tasks", n_tasks=args.n, seed=args.seed)
    else:
        defaults = {"n_tasks": args.n, "seed": args.seed}
        config = GenerateConfig(**{k: v for k, v in defaults.items() if v is not None})
    report = generate_suite(args.out, config=config, overwrite=args.overwrite)
    print(f"wrote {report.n_tasks} tasks to {report.out_dir} in {report.seconds:.1f}s")
    print("splits:    " + ", ".join(f"{k}={v}" for k, v in report.by_split.items()))
    print("operators: " + ", ".join(f"{k}={v}" for k, v in report.by_operator.items()))
    print(
        f"families:  {len(report.by_family)} ({len(report.family_partition['test'])} held out for test)"
    )
    return 0


def _gate(tasks_dir: Path, workers: int, run_tests: RunTests, report_path: Path | None):
    if not tasks_dir.is_dir():
        raise SystemExit(f"agentrl: no such task folder: {tasks_dir}")
    tasks, errors = load_tasks(tasks_dir)
    if not tasks and not errors:
        raise SystemExit(f"agentrl: no tasks (no task.json) under {tasks_dir}")
    for err in errors:
        print(f"INVALID {err}", file=sys.stderr)
    gate = check_tasks(tasks, run_tests=run_tests, workers=workers)
    print(gate.summary_table())
    if errors:
        print(f"{len(errors)} folder(s) are not valid tasks (see above)")
    if report_path is not None:
        data = {"load_errors": errors, **gate.to_dict()}
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(data, indent=2) + "\n")
    return tasks, errors, gate


def main_check(argv: list[str], run_tests: RunTests = subprocess_run_tests) -> int:
    p = argparse.ArgumentParser(prog="tasks check", description="run the data gate on a folder")
    p.add_argument("--tasks", required=True, type=Path, help="folder of task folders")
    p.add_argument("--workers", type=int, default=2, help="parallel checks")
    p.add_argument("--report", type=Path, default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    _, errors, gate = _gate(args.tasks, args.workers, run_tests, args.report)
    return 0 if gate.ok and not errors else 1


def main_import(argv: list[str], run_tests: RunTests = subprocess_run_tests) -> int:
    p = argparse.ArgumentParser(
        prog="tasks import",
        description="load a folder of tasks (docs/tasks.md), gate them, copy the valid ones",
    )
    p.add_argument("--src", required=True, type=Path, help="folder holding task folders")
    p.add_argument("--out", required=True, type=Path, help="destination; one folder per task id")
    p.add_argument("--workers", type=int, default=2, help="parallel checks")
    p.add_argument("--report", type=Path, default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    tasks, errors, gate = _gate(args.src, args.workers, run_tests, args.report)
    passed = set(gate.passed)
    args.out.mkdir(parents=True, exist_ok=True)
    copied = 0
    for task in tasks:
        if task.id not in passed:
            continue
        dst = args.out / task.id
        if dst.exists():
            print(f"SKIPPED {task.id}: {dst} already exists", file=sys.stderr)
            errors.append(f"{dst}: already exists")
            continue
        shutil.copytree(task.root, dst, symlinks=True)
        copied += 1
    print(f"imported {copied} of {len(tasks)} loaded task(s) into {args.out}")
    return 0 if gate.ok and not errors else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"generate": main_generate, "check": main_check, "import": main_import}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m components.tasks {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
