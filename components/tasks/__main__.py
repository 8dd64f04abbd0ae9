"""`agentrl tasks {generate,check,import,export,prepare,mine} ...`; `python -m components.tasks ...` is the same
command line (it calls components.cli), so both run task code only in the sandbox.

Each subcommand is a function taking an argv list and returning an exit code. `check`
and `import` run task and benchmark code, so `main_check` and `main_import` take their
runners as parameters and have no default: the commands `agentrl tasks check|import` are
`main_sandboxed_check|import`, which pass the sandboxed ones, and nothing reachable from a
command line runs that code on the host.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from components import shutdown
from components.cli_args import (
    ArgumentParser,
    CommandError,
    UsageError,
    existing_dir,
    existing_file,
    nonempty,
    output_dir,
    output_file,
    positive_float,
    positive_int,
    preset_file,
)
from components.outputs import check_output_dir, claim_output_dir, record_outputs, write_atomic
from components.stage_contract import stage
from components.tasks.external import RunPython
from components.tasks.gate import FindHangs, GateReport, ReplayOracle, RunTests, check_tasks
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.quixbugs import convert_quixbugs
from components.tasks.task import load_tasks


@stage("tasks")
def main_generate(argv: list[str]) -> int:
    p = ArgumentParser(prog="agentrl tasks generate", description="write the built-in suite")
    p.add_argument("--preset", default=None, type=preset_file,
                   help="preset YAML whose `tasks` section configures the suite "
                        "(default: the section's defaults)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir, help="output folder (must be empty)")
    p.add_argument("--n", type=positive_int, help="override tasks.n_tasks")
    p.add_argument("--seed", type=int, help="override tasks.seed")
    p.add_argument("--overwrite", action="store_true", help="replace a previous suite in --out")
    args = p.parse_args(argv)
    if args.preset:
        from components.preset import stage_config

        config = stage_config(args.preset, "tasks", n_tasks=args.n, seed=args.seed)
    else:
        defaults = {"n_tasks": args.n, "seed": args.seed}
        config = GenerateConfig(**{k: v for k, v in defaults.items() if v is not None})
    from components.workdir_lock import workdir_lock

    with workdir_lock(args.out, "agentrl tasks generate"):
        claim_output_dir(args.out, args.overwrite, "generated suite", _suite_entries(args.out))
        report = generate_suite(args.out, config=config)
        record_outputs(args.out)
    print(f"wrote {report.n_tasks} tasks to {report.out_dir} in {report.seconds:.1f}s")
    print("splits:    " + ", ".join(f"{k}={v}" for k, v in report.by_split.items()))
    print("operators: " + ", ".join(f"{k}={v}" for k, v in report.by_operator.items()))
    print(
        f"families:  {len(report.by_family)} ({len(report.family_partition['test'])} held out for test)"
    )
    return 0


def _suite_entries(out: Path) -> set[str]:
    """What a suite generated before output manifests existed wrote: suite.json and its
    tasks' folders (as suite.json lists them)."""
    try:
        return {"suite.json", *json.loads((out / "suite.json").read_text())["tasks"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _gate(tasks_dir: Path, workers: int, run_tests: RunTests, report_path: Path | None,
          find_hangs: FindHangs | None = None, replay: ReplayOracle | None = None):  # fmt: skip
    if not tasks_dir.is_dir():
        raise CommandError(f"no such task folder: {tasks_dir}")
    tasks, errors = load_tasks(tasks_dir)
    if not tasks and not errors:
        raise CommandError(f"no tasks (no task.json) under {tasks_dir}")
    for err in errors:
        print(f"INVALID {err}", file=sys.stderr)
    gate = check_tasks(tasks, run_tests=run_tests, workers=workers, find_hangs=find_hangs,
                       replay=replay)  # fmt: skip
    print(gate.summary_table())
    if errors:
        print(f"{len(errors)} folder(s) are not valid tasks (see above)")
    if report_path is not None:
        data = {"load_errors": errors, **gate.to_dict()}
        write_atomic(report_path, json.dumps(data, indent=2) + "\n")
    return tasks, errors, gate


def main_check(
    argv: list[str], *, run_tests: RunTests, find_hangs: FindHangs | None = None,
    replay: ReplayOracle | None = None,
) -> int:  # fmt: skip
    p = ArgumentParser(prog="agentrl tasks check", description="run the data gate on a folder")
    p.add_argument("--tasks", required=True, type=existing_dir, help="folder of task folders")
    p.add_argument("--workers", type=positive_int, default=2, help="parallel checks")
    p.add_argument("--report", type=output_file, default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    _, errors, gate = _gate(args.tasks, args.workers, run_tests, args.report, find_hangs, replay)
    return 0 if gate.ok and not errors else 1


def _import_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="agentrl tasks import",
        description="convert a benchmark or load a folder of tasks (docs/tasks.md), gate "
        "them in the sandbox, copy the valid ones",
    )
    p.add_argument("src", nargs="?", type=existing_dir,
                   help="task folder, or the benchmark checkout")  # fmt: skip
    p.add_argument("--src", dest="src_opt", type=existing_dir, help="same as SRC")
    p.add_argument("--from", "--format", dest="source", choices=("tasks", "quixbugs", "harbor"),
                   default=None, help="tasks: SRC holds task folders; quixbugs: SRC is a "
                   "QuixBugs checkout; harbor: SRC is a Harbor task or a folder of them "
                   "(default: told by SRC's layout)")  # fmt: skip
    p.add_argument("--programs", default=None,
                   help="quixbugs: comma-separated program names (default: all in SRC)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir,
                   help="destination; one folder per task id")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=2, help="parallel checks")
    p.add_argument("--report", type=output_file, default=None, help="write a JSON report here")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what a previous import wrote in the destination (anything "
                        "else there is refused; default: keep it, skip tasks there)")  # fmt: skip
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
    find_hangs: FindHangs | None = None, replay: ReplayOracle | None = None, sandbox=None,
) -> int:  # fmt: skip
    p = _import_parser()
    args = p.parse_args(argv)
    if (args.src is None) == (args.src_opt is None):
        p.error("give the source once: SRC or --src")
    args.src = args.src or args.src_opt
    args.source = args.source or detect_source(args.src)
    if args.overwrite:  # refused before the work if the folder holds anything not ours
        check_output_dir(args.out, overwrite=True, what="import")
    with shutdown.temporary_folder("agentrl-import-") as tmp:  # a signal removes it too
        converted: list[str] = []
        src = args.src
        if args.source == "quixbugs":
            src = Path(tmp) / "converted"
            converted = _convert(args, run_python, src)
            if not src.is_dir():  # nothing converted; the errors are printed and reported
                _write_import_report(args.report, converted, [], None)
                return 1
        elif args.source == "harbor":
            from components.tasks.harbor_import import convert_harbor

            src = Path(tmp) / "converted"
            src.mkdir()
            folders, converted = convert_harbor(args.src, src, sandbox)
            for err in converted:
                print(f"REFUSED {err}", file=sys.stderr)
            print(f"converted {len(folders)} of {len(folders) + len(converted)} Harbor task(s)")
            if not folders:  # the report says why, task by task
                _write_import_report(args.report, converted, [], None)
                return 1
        tasks, errors, gate = _gate(src, args.workers, run_tests, None, find_hangs, replay)
        from components.workdir_lock import workdir_lock

        with workdir_lock(args.out, "agentrl tasks import"):
            if args.overwrite:
                claim_output_dir(args.out, overwrite=True, what="import")
            copied = _copy_passed(tasks, set(gate.passed), args.out, errors)
            record_outputs(args.out)
    _write_import_report(args.report, converted, errors, gate)
    print(f"imported {copied} of {len(tasks)} loaded task(s) into {args.out}")
    return 0 if gate.ok and not errors and not converted else 1


def _write_import_report(path: Path | None, converted: list[str], errors: list[str], gate) -> None:
    """--report, written whatever came of the import (also when nothing converted)."""
    if path is not None:
        data = {"conversion_errors": converted, "load_errors": errors}
        data.update((gate or GateReport()).to_dict())
        write_atomic(path, json.dumps(data, indent=2) + "\n")


def detect_source(src: Path) -> str:
    """What SRC holds, by its layout: our task folders (task.json), a QuixBugs checkout
    (python_programs/), Harbor tasks (task.toml with instruction.md, tests/test.sh or
    environment/Dockerfile, in SRC or its subfolders); CommandError naming the --format
    choices when none."""
    harbor = ("instruction.md", "tests/test.sh", "environment/Dockerfile")
    for root in [src, *sorted(p for p in src.iterdir() if p.is_dir())]:
        # one of Harbor's files besides task.toml: a malformed task is then refused by name
        if (root / "task.toml").is_file() and any((root / n).is_file() for n in harbor):
            return "harbor"
    if (src / "python_programs").is_dir():
        return "quixbugs"
    if next(src.rglob("task.json"), None) is not None:
        return "tasks"
    raise CommandError(
        f"no tasks under {src}: no task.json (agentrl task folders), no python_programs/ "
        "(--format quixbugs), no task.toml with instruction.md and tests/test.sh (--format "
        "harbor); name the format with --format if SRC is one of them"
    )


def _sandboxed_runner(argv: list[str]):
    """(the gate's test runner, the converters' `run_python`, the gate's hang finder, its
    oracle replay, all under the preset's env and sandbox sections, the rest of argv)."""
    import dataclasses

    from components.preset import DEFAULT_PRESET, load_preset
    from components.sandbox.process import run_sandboxed
    from components.scripted.registry import oracle_replay
    from components.tasks.gate import hang_finder
    from components.verifier.gate_runner import sandboxed_test_runner

    p = ArgumentParser(add_help=False)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    args, rest = p.parse_known_args(argv)
    preset = load_preset(args.preset)
    env, sandbox = preset.section("env"), preset.section("sandbox")

    def run_python(folder, python_args: list[str], wall_s: float) -> tuple[int, str]:
        cfg = dataclasses.replace(
            sandbox, wall_time_s=wall_s, cpu_time_s=max(sandbox.cpu_time_s, int(wall_s) + 1)
        )
        result = run_sandboxed(["python", *python_args], folder, cfg)
        return result.exit_code, result.output

    find_hangs = hang_finder(run_python, env.per_test_timeout_s)
    replay = oracle_replay(env, sandbox)
    return sandboxed_test_runner(env, sandbox), run_python, find_hangs, replay, rest


@stage("env", "sandbox")
def main_sandboxed_check(argv: list[str]) -> int:
    """`agentrl tasks check [--preset P]`: the data gate, with hidden tests run by the
    sandboxed verifier under the preset's env and sandbox sections."""
    run_tests, _, find_hangs, replay, rest = _sandboxed_runner(argv)
    return main_check(rest, run_tests=run_tests, find_hangs=find_hangs, replay=replay)


@stage("env", "sandbox")
def main_sandboxed_import(argv: list[str]) -> int:
    """`agentrl tasks import [--preset P] [--from quixbugs] SRC --out DIR`: convert a
    benchmark or load a folder of tasks, gate them and copy the valid ones; benchmark and
    task code run only in the sandbox."""
    from components.preset import DEFAULT_PRESET, load_preset

    run_tests, run_python, find_hangs, replay, rest = _sandboxed_runner(argv)
    p = ArgumentParser(add_help=False)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    sandbox = load_preset(p.parse_known_args(argv)[0].preset).section("sandbox")
    return main_import(rest, run_tests=run_tests, run_python=run_python, find_hangs=find_hangs,
                       replay=replay, sandbox=sandbox)  # fmt: skip


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


def _wheelhouse(text: str) -> str:
    """'' (the index) or a folder that exists."""
    return str(existing_dir(text)) if text else ""


@stage("sandbox")
def main_prepare(argv: list[str]) -> int:
    """`agentrl tasks prepare --tasks DIR`: build every distinct task environment once into
    the cache (`sandbox.environments_dir`); exit 1 if one fails to build."""
    from components.tasks.environments import (
        PrepareConfig,
        prepare_environments,
        prepared_summary,
    )

    p = ArgumentParser(prog="agentrl tasks prepare", description=main_prepare.__doc__)
    p.add_argument("--tasks", required=True, type=existing_dir, help="folder of task folders")
    p.add_argument("--preset", default=None, type=preset_file,
                   help="preset whose sandbox section names the cache")  # fmt: skip
    p.add_argument("--wheelhouse", default="", type=_wheelhouse,
                   help="install from this folder of wheels only")  # fmt: skip
    p.add_argument("--report", type=output_file, default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    from components.preset import DEFAULT_PRESET, stage_config

    sandbox = stage_config(args.preset or DEFAULT_PRESET, "sandbox")
    tasks, errors = load_tasks(args.tasks)
    if not tasks and not errors:
        raise CommandError(f"no tasks (no task.json) under {args.tasks}")
    for err in errors:
        print(f"INVALID {err}", file=sys.stderr)
    config = PrepareConfig(cache_dir=sandbox.environments_dir, wheelhouse=args.wheelhouse)
    start = time.monotonic()
    prepared = prepare_environments(tasks, config)
    for env in prepared:
        state = f"ERROR {env.error}" if env.error else ("built" if env.built else "cached")
        print(f"{env.key} python {env.python} {env.tasks} task(s) {env.seconds:.1f}s {state}")
    summary = prepared_summary(prepared)
    print(f"{len(prepared)} environment(s) for {len(tasks)} task(s): {summary['built']} built, "
          f"{summary['cached']} cached, {summary['failed']} failed in "
          f"{time.monotonic() - start:.1f}s")  # fmt: skip
    if args.report is not None:
        write_atomic(args.report, json.dumps({"load_errors": errors, **summary}, indent=2) + "\n")
    return 1 if summary["failed"] or errors else 0


def main_mine(argv: list[str]) -> int:
    """`agentrl tasks mine (--repo PATH | --sdist NAME==VERSION) ... --out DIR`: turn
    repositories with a pytest suite into tasks (components/mining/); one line per
    repository. Settings come from the preset's `mine` section; options override them."""
    import dataclasses

    from components.mining.config import MineReport
    from components.mining.mine import RepoSource, mine_repository, report_dict
    from components.preset import DEFAULT_PRESET, load_preset
    from components.tasks.environments import PrepareConfig
    from components.tasks.sdist import SdistError, fetch_sdist
    from components.tasks.task import requirement_lines
    from components.verifier.gate_runner import sandboxed_test_runner

    p = ArgumentParser(prog="agentrl tasks mine", description=main_mine.__doc__)
    p.add_argument("--repo", action="append", type=existing_dir, default=[], help="a repository")
    p.add_argument("--sdist", action="append", default=[], type=nonempty,
                   help="NAME==VERSION: mine this release's sdist from the registry")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir, help="where the task folders go")
    p.add_argument("--requirements", type=existing_file, default=None,
                   help="pinned requirements of the repositories' tests (pip syntax)")  # fmt: skip
    p.add_argument("--preset", default=None, type=preset_file,
                   help="preset: its mine, env and sandbox sections")  # fmt: skip
    p.add_argument("--wheelhouse", default="", type=_wheelhouse,
                   help="install from this folder of wheels only")  # fmt: skip
    p.add_argument("--report", type=output_file, default=None, help="write a JSON report here")
    overrides = {  # option -> (MineConfig field, type); MineConfig checks the values
        "--python": ("python", nonempty), "--seed": ("seed", int),
        "--max-candidates": ("max_candidates", positive_int),
        "--max-tasks": ("max_tasks", positive_int), "--budget-s": ("budget_s", positive_float),
"--suite-timeout-s": ("suite_timeout_s", positive_float),
        "--per-test-timeout-s": ("per_test_timeout_s", positive_float),
        "--memory-mb": ("memory_mb", int), "--baseline-runs": ("baseline_runs", positive_int),
    }  # fmt: skip
    for option, (name, kind) in overrides.items():
        p.add_argument(option, dest=name, type=kind, default=None, help=f"mine.{name}")
    p.add_argument("--split", default=None, choices=("auto", "train", "val", "test"),
                   help="mine.split")  # fmt: skip
    p.add_argument("--keep-failing", dest="deselect_failing", action="store_const", const=False,
                   default=None, help="refuse a repository with a failing test (no deselection)")  # fmt: skip
    args = p.parse_args(argv)
    if not args.repo and not args.sdist:
        p.error("give --repo PATH or --sdist NAME==VERSION")
    preset = load_preset(args.preset or DEFAULT_PRESET)
    env, sandbox = preset.section("env"), preset.section("sandbox")
    changes = {n: getattr(args, n) for n in [*(f for f, _ in overrides.values()), "split",
                                             "deselect_failing"]
               if getattr(args, n) is not None}  # fmt: skip
    try:
        config = dataclasses.replace(preset.section("mine"), **changes)
    except ValueError as e:
        raise UsageError(f"agentrl tasks mine: {e}") from e
    reqs = requirement_lines(args.requirements.read_text()) if args.requirements else ()
    run_tests = sandboxed_test_runner(env, sandbox)
    prepare = PrepareConfig(wheelhouse=args.wheelhouse)
    reports = []
    with shutdown.temporary_folder("agentrl-sdists-") as tmp:  # a signal removes it too
        sources = [(repo, {}, None) for repo in args.repo]
        for i, req in enumerate(args.sdist):
            try:
                sdist = fetch_sdist(req, Path(tmp) / str(i))
            except SdistError as e:  # this source's error; the others still run
                reports.append(MineReport(repository=req, error=str(e)))
                print(reports[-1].line(), file=sys.stderr)
                continue
            sources.append((sdist.root, sdist.upstream, req.replace("==", "-")))
        for root, upstream, name in sources:
            source = RepoSource(root, name=name, requirements=reqs, upstream=upstream)
            report = mine_repository(source, args.out, config=config, sandbox=sandbox,
                                     run_tests=run_tests, prepare=prepare)  # fmt: skip
            print(report.line(), file=sys.stdout if report.ok else sys.stderr)
            reports.append(report)
    if args.report is not None:
        write_atomic(args.report, json.dumps(report_dict(reports), indent=2) + "\n")
    return 0 if all(r.ok for r in reports) else 1


def main_export(argv: list[str]) -> int:
    """`agentrl tasks export --format harbor --tasks DIR --out DIR`: write task folders
    (generated, mined, imported) as Harbor tasks, one folder per task id."""
    p = ArgumentParser(prog="agentrl tasks export", description=main_export.__doc__)
    p.add_argument("--format", choices=("harbor",), required=True, help="output format")
    p.add_argument("--tasks", required=True, type=existing_dir, help="folder of task folders")
    p.add_argument("--out", required=True, type=output_dir, help="where the Harbor tasks go")
    p.add_argument("--split", default=None, choices=("train", "val", "test"),
                   help="only tasks of this split")  # fmt: skip
    args = p.parse_args(argv)
    from components.tasks.harbor_export import export_harbor_task

    tasks, errors = load_tasks(args.tasks, split=args.split)
    for err in errors:
        print(f"INVALID {err}", file=sys.stderr)
    if not tasks:
        raise CommandError(f"no tasks under {args.tasks}")
    taken = [t.id for t in tasks if (args.out / t.id).exists()]
    if taken:
        raise CommandError(f"{args.out} already holds {', '.join(taken[:5])}")
    for task in tasks:
        export_harbor_task(task, args.out)
    print(f"exported {len(tasks)} task(s) to {args.out} as Harbor tasks")
    return 1 if errors else 0


# Commands not yet in components/cli.py's table: served here until they are.
LOCAL_COMMANDS = {"prepare": main_prepare, "mine": main_mine}


def main(argv: list[str] | None = None) -> int:
    """`python -m components.tasks CMD ...` = `agentrl tasks CMD ...` (the same code path)."""
    from components.cli import COMMANDS, run

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LOCAL_COMMANDS and ("tasks", argv[0]) not in COMMANDS:
        return LOCAL_COMMANDS[argv[0]](argv[1:])
    return run(["tasks", *argv])


if __name__ == "__main__":
    sys.exit(main())
