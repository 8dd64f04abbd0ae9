"""`agentrl tasks {generate,check,import} ...`; `python -m components.tasks ...` is the same
command line (it calls components.cli), so both run task code only in the sandbox.

Each subcommand is a function taking an argv list and returning an exit code. `check`
and `import` run task and benchmark code, so they take their runners as parameters and
have no default: the command line passes the sandboxed ones (components/env/__main__.py),
and nothing reachable from a command line runs that code on the host.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from components.tasks.external import RunPython
from components.tasks.gate import FindHangs, RunTests, check_tasks
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.quixbugs import convert_quixbugs
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


def _gate(tasks_dir: Path, workers: int, run_tests: RunTests, report_path: Path | None,
          find_hangs: FindHangs | None = None):  # fmt: skip
    if not tasks_dir.is_dir():
        raise SystemExit(f"agentrl: no such task folder: {tasks_dir}")
    tasks, errors = load_tasks(tasks_dir)
    if not tasks and not errors:
        raise SystemExit(f"agentrl: no tasks (no task.json) under {tasks_dir}")
    for err in errors:
        print(f"INVALID {err}", file=sys.stderr)
    gate = check_tasks(tasks, run_tests=run_tests, workers=workers, find_hangs=find_hangs)
    print(gate.summary_table())
    if errors:
        print(f"{len(errors)} folder(s) are not valid tasks (see above)")
    if report_path is not None:
        data = {"load_errors": errors, **gate.to_dict()}
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(data, indent=2) + "\n")
    return tasks, errors, gate


def main_check(argv: list[str], *, run_tests: RunTests, find_hangs: FindHangs | None = None) -> int:
    p = argparse.ArgumentParser(prog="tasks check", description="run the data gate on a folder")
    p.add_argument("--tasks", required=True, type=Path, help="folder of task folders")
    p.add_argument("--workers", type=int, default=2, help="parallel checks")
    p.add_argument("--report", type=Path, default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    _, errors, gate = _gate(args.tasks, args.workers, run_tests, args.report, find_hangs)
    return 0 if gate.ok and not errors else 1


def _import_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tasks import",
        description="convert a benchmark or load a folder of tasks (docs/tasks.md), gate "
        "them in the sandbox, copy the valid ones",
    )
    p.add_argument("src", nargs="?", type=Path, help="task folder, or the benchmark checkout")
    p.add_argument("--src", dest="src_opt", type=Path, help="same as SRC")
    p.add_argument("--from", dest="source", choices=("tasks", "quixbugs"), default="tasks",
                   help="tasks: SRC holds task folders; quixbugs: SRC is a QuixBugs checkout")  # fmt: skip
    p.add_argument("--programs", default=None,
                   help="quixbugs: comma-separated program names (default: all in SRC)")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="destination; one folder per task id")
    p.add_argument("--workers", type=int, default=2, help="parallel checks")
    p.add_argument("--report", type=Path, default=None, help="write a JSON report here")
    return p


def _convert(args, run_python: RunPython, staging: Path) -> list[str]:
    """Convert the benchmark into staging/; print and return the conversion errors."""
    programs = args.programs.split(",") if args.programs else None
    start = time.monotonic()
    tasks, errors = convert_quixbugs(args.src, staging, run_python, programs=programs)
    for err in errors:
        print(f"NOT CONVERTED {err}", file=sys.stderr)
    total = len(tasks) + len(errors)
    print(f"converted {len(tasks)} of {total} program(s) in {time.monotonic() - start:.1f}s")
    return errors


def main_import(
    argv: list[str], *, run_tests: RunTests, run_python: RunPython,
    find_hangs: FindHangs | None = None,
) -> int:  # fmt: skip
    p = _import_parser()
    args = p.parse_args(argv)
    if (args.src is None) == (args.src_opt is None):
        p.error("give the source once: SRC or --src")
    args.src = args.src or args.src_opt
    with tempfile.TemporaryDirectory(prefix="agentrl-import-") as tmp:
        converted: list[str] = []
        src = args.src
        if args.source == "quixbugs":
            src = Path(tmp) / "converted"
            converted = _convert(args, run_python, src)
            if not src.is_dir():
                return 1  # nothing converted; the errors are printed
        tasks, errors, gate = _gate(src, args.workers, run_tests, None, find_hangs)
        copied = _copy_passed(tasks, set(gate.passed), args.out, errors)
    if args.report is not None:
        data = {"conversion_errors": converted, "load_errors": errors, **gate.to_dict()}
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(data, indent=2) + "\n")
    print(f"imported {copied} of {len(tasks)} loaded task(s) into {args.out}")
    return 0 if gate.ok and not errors and not converted else 1


def _copy_passed(tasks, passed: set[str], out: Path, errors: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    copied = 0
    for task in tasks:
        if task.id not in passed:
            continue
        dst = out / task.id
        if dst.exists():
            print(f"SKIPPED {task.id}: {dst} already exists", file=sys.stderr)
            errors.append(f"{dst}: already exists")
            continue
        shutil.copytree(task.root, dst, symlinks=True)
        copied += 1
    return copied


def main(argv: list[str] | None = None) -> int:
    """`python -m components.tasks CMD ...` = `agentrl tasks CMD ...` (the same code path)."""
    from components.cli import main as agentrl

    argv = list(sys.argv[1:] if argv is None else argv)
    return agentrl(["tasks", *argv])


if __name__ == "__main__":
    sys.exit(main())
