"""CLI of evaluation: held-out evaluation with a report (`agentrl evaluate run`), the safety
suite (`agentrl evaluate safety`), stored episodes judged again (`agentrl rescore`) and the
environment demo (`agentrl demo`); `agentrl env eval` (components/env/__main__.py) shares
their settings and episode runner.

Each reads the preset's `env`, `sandbox`, `rollout` and `evaluate` sections (the settings a
candidate was trained with); the few flags here (--split, --limit, --workers, --n-tasks)
override the `evaluate` section for a one-off run, and the retrain flow passes none of them.
Every command evaluates through components/evaluate/episodes.run_policy.

    agentrl evaluate run --preset P --tasks DIR --model DIR --out runs/eval
    agentrl evaluate safety --preset P --out runs/safety [--model DIR]
    agentrl rescore SRC --tasks DIR [--preset P] [--out runs/rescore] [--write] [--run-id ID]
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from components.cli_args import (
    ArgumentParser,
    CommandError,
    UsageError,
    choice_list,
    existing_dir,
    existing_file,
    existing_path,
    nonnegative_int,
    output_dir,
    positive_int,
    preset_file,
)
from components.env.episode import EpisodeResult
from components.evaluate.episodes import MODEL_PREFIX, run_policy, statistics_for
from components.output_files import check_free_space, disk_errors, start_outputs, write_atomic
from components.outputs import check_output_dir, claim_output_dir
from components.preset import DEFAULT_PRESET, load_preset
from components.stage_contract import EvaluationResult, stage
from components.tasks.task import SPLITS, Task, load_tasks

_RESULT_FIELDS = {f.name for f in dataclasses.fields(EpisodeResult)}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The sections an evaluation reads, as the stage saw them."""

    env: object
    sandbox: object
    rollout: object  # the RolloutConfig a model is evaluated with (evaluate.rollout applied)
    evaluation: object

    def describe(self, policy: str) -> dict:
        """What the report states: the settings the episodes ran with."""
        shown = {"policy": policy, "episode_steps": self.env.max_steps,
                 "env": dataclasses.asdict(self.env)}  # fmt: skip
        if policy.startswith(MODEL_PREFIX):
            shown["rollout"] = dataclasses.asdict(self.rollout)
        return shown


def load_settings(preset_path: str, **evaluation_overrides) -> Settings:
    preset = load_preset(preset_path)
    evaluation = preset.section("evaluate")
    changes = {k: v for k, v in evaluation_overrides.items() if v is not None}
    evaluation = dataclasses.replace(evaluation, **changes) if changes else evaluation
    return Settings(env=preset.section("env"), sandbox=preset.section("sandbox"),
                    rollout=evaluation.rollout_config(preset.section("rollout")),
                    evaluation=evaluation)  # fmt: skip


def _policy_arg(args) -> str:
    return f"{MODEL_PREFIX}{args.model}" if getattr(args, "model", None) else args.policy


def progress_lines(total: int, label: str, every: int = 1):
    """Print a progress line per `every` finished episodes (to stderr)."""
    state = {"done": 0, "ok": 0}

    def tick(result) -> None:
        state["done"] += 1
        state["ok"] += result.success
        if state["done"] % every and state["done"] != total:
            return
        mark = "ok" if result.success else ("INFRA" if result.status != "ok" else "fail")
        print(f"      [{label} {state['done']:>3}/{total}] {state['ok']} successes so far"
              f" (last: {result.task_id} {mark})", file=sys.stderr, flush=True)  # fmt: skip

    return tick


def run_episodes(tasks, policy, settings: Settings, tasks_dir, on_result=None):
    e = settings.evaluation
    return run_policy(tasks, policy, rollout=settings.rollout, env=settings.env,
                      sandbox=settings.sandbox, workers=e.workers, seed=e.seed,
                      statistics=statistics_for(policy, tasks_dir, settings.env),
                      on_result=on_result)  # fmt: skip


def common_options(p: ArgumentParser) -> None:
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file,
                   help="preset YAML (configs/)")  # fmt: skip
    p.add_argument("--workers", type=positive_int, help="override evaluate.workers")


def scripted_policy(text: str) -> str:
    """A scripted policy's name (components/scripted/registry.py)."""
    import argparse

    from components.scripted.registry import SCRIPTED_POLICIES

    if text not in SCRIPTED_POLICIES:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r}; choose one of {', '.join(SCRIPTED_POLICIES)} "
            "(or model:CHECKPOINT_DIR where a model is allowed)"
        )
    return text


def policy_or_model(text: str) -> str:
    """A scripted policy's name, or model:DIR where DIR is a saved checkpoint."""
    if text.startswith(MODEL_PREFIX):
        return f"{MODEL_PREFIX}{checkpoint_dir(text[len(MODEL_PREFIX) :])}"
    return scripted_policy(text)


def checkpoint_dir(text: str) -> str:
    """A saved policy folder: a full checkpoint (config.json) or LoRA adapters on a base
    (adapter_config.json; a LoRA-trained candidate, as configs/cpu-pretrained.yaml makes)."""
    from components.cli_args import saved_policy

    return saved_policy(text)


def load_results(path: str | Path) -> list[EpisodeResult]:
    """Results written by `write_results` (`agentrl env eval --out` or this command).

    The rows carry no trajectory, so trajectory metrics of a loaded run are None; success
    per task (what regression needs) is always there."""
    rows = json.loads(Path(path).read_text())["results"]
    return [EpisodeResult(**{k: v for k, v in row.items() if k in _RESULT_FIELDS}) for row in rows]


def oracle_step_counts(tasks: list[Task]) -> dict[str, int]:
    """The oracle's planned steps per task (no recovery detours): step efficiency's yardstick."""
    from components.scripted.reference import OraclePolicy

    oracle = OraclePolicy(recovery_rate=0.0)
    return {t.id: len(oracle.plan(t)) for t in tasks if t.has_reference}


def _held_out_tasks(tasks_dir: Path, evaluation) -> list[Task]:
    tasks: list[Task] = []
    for split in evaluation.splits:
        found, errors = load_tasks(tasks_dir, split=split)
        for e in errors:
            print(f"agentrl: skipped invalid task: {e}", file=sys.stderr)
        tasks += found[: evaluation.limit] if evaluation.limit else found
    return tasks


@stage("evaluate", "rollout", "env", "sandbox", result=EvaluationResult)
def main_evaluate(argv: list[str]) -> int:
    """Held-out evaluation of a checkpoint or scripted policy: metrics, report and plots."""
    from components.env.batch_eval import write_results
    from components.evaluate.metrics import aggregate
    from components.evaluate.report import write_report

    p = ArgumentParser(prog="agentrl evaluate run", description=main_evaluate.__doc__)
    common_options(p)
    p.add_argument("--tasks", required=True, type=existing_dir, help="folder of task folders")
    p.add_argument("--split", action="append", choices=SPLITS,
                   help="override evaluate.splits (repeatable)")  # fmt: skip
    p.add_argument("--limit", type=nonnegative_int, help="override evaluate.limit (0: all)")
    p.add_argument("--policy", default="oracle", type=scripted_policy,
                   help="scripted policy (components/scripted/registry.py)")  # fmt: skip
    p.add_argument("--model", type=checkpoint_dir,
                   help="a saved checkpoint folder (overrides --policy)")  # fmt: skip
    p.add_argument("--champion-results", type=existing_file, help="the champion's results JSON")
    p.add_argument("--out", type=output_dir, default=Path("runs/eval"))
    p.add_argument("--title", default="Evaluation")
    args = p.parse_args(argv)
    settings = load_settings(args.preset, workers=args.workers, limit=args.limit,
                             splits=tuple(args.split) if args.split else None)  # fmt: skip
    tasks = _held_out_tasks(args.tasks, settings.evaluation)
    if not tasks:
        raise CommandError(f"no {'/'.join(settings.evaluation.splits)} tasks in {args.tasks}")
    policy = _policy_arg(args)
    results, cheating = _play(tasks, policy, settings, args.tasks, args.out)
    by_id, steps = {t.id: t for t in tasks}, oracle_step_counts(tasks)
    champion_results = load_results(args.champion_results) if args.champion_results else None
    agg = aggregate(results, champion_results, tasks=by_id, oracle_steps=steps)
    agg["settings"] = settings.describe(policy)
    champion = (
        aggregate(champion_results, tasks=by_id, oracle_steps=steps) if champion_results else None
    )
    if cheating is not None:
        agg["cheating"] = cheating
        agg["overall"]["cheating_rate"] = cheating["cheating_rate"]
    write_results(args.out / "results.json", results, args.out / "trajectories.jsonl")
    paths = write_report(agg, results, args.out, args.title, champion=champion)
    o = agg["overall"]
    print(f"success {o['success_rate']:.1%} over {o['verified']} verified episodes "
          f"({o['infra_failures']} infra failures); report: {paths['report']}")  # fmt: skip
    if "cheating" in agg:
        c = agg["cheating"]
        rate = "n/a" if c["cheating_rate"] is None else f"{c['cheating_rate']:.1%}"
        print(f"cheating rate {rate} ({c['cheats']} of {c['verified']} impossible variants "
              f"solved, {c['seconds']:.0f}s)")  # fmt: skip
    return 0


def _play(tasks: list[Task], policy: str, settings: Settings, tasks_dir: Path,
          out: Path) -> tuple[list[EpisodeResult], dict | None]:  # fmt: skip
    """The evaluated tasks' results (in `tasks`' order) and, with evaluate.
    impossible_variants, the cheating summary. The variants (each checked impossible with
    the reference fix first) are played in the same run as the evaluated tasks, under ids
    drawn from one space in one shuffled order (components/evaluate/cheating.py): nothing in
    id, order or batch tells a variant apart. The summary's seconds cover the mixed run."""
    if not settings.evaluation.impossible_variants:
        return run_episodes(tasks, policy, settings, tasks_dir), None
    from components.evaluate.cheating import cheating_summary, one_id_space, unmix
    from components.tasks.impossible import build_variants
    from components.verifier.gate_runner import sandboxed_test_runner

    start, seed = time.monotonic(), settings.evaluation.seed
    runner = sandboxed_test_runner(settings.env, settings.sandbox)
    built = build_variants(tasks, out / "impossible", settings.evaluation.impossible_variants,
                           runner, seed=seed)  # fmt: skip
    played, stands_for = one_id_space(tasks, built.tasks, seed, out / "mixed")
    mixed = run_episodes(played, policy, settings, tasks_dir)
    results, variants, theirs = unmix(played, mixed, stands_for)
    position = {t.id: i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: position[r.task_id])
    summary = cheating_summary(variants, theirs)
    summary["skipped"] = built.skipped
    summary["seconds"] = round(time.monotonic() - start, 1)
    return results, summary


def _attacks(names: str | None):
    from components.evaluate.safety.suite import ATTACKS

    if not names:
        return ATTACKS
    import argparse

    try:
        wanted = set(choice_list(a.name for a in ATTACKS)(names))
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"argument --attacks: {e}") from None
    return tuple(a for a in ATTACKS if a.name in wanted)


@stage("evaluate", "rollout", "env", "sandbox")
def main_safety(argv: list[str]) -> int:
    """Run every scripted attack (and optionally a candidate policy) on tempting tasks.
    Exit status 1 when any attack fooled the verifier."""
    from components.evaluate.safety.suite import candidate_safety, run_safety_suite
    from components.evaluate.safety.tasks import build_safety_tasks

    p = ArgumentParser(prog="agentrl evaluate safety", description=main_safety.__doc__)
    common_options(p)
    p.add_argument("--out", type=output_dir, default=Path("runs/safety"))
    p.add_argument("--n-tasks", type=positive_int, help="override evaluate.safety_n_tasks")
    p.add_argument("--every-task", action="store_true", help="each attack on every task")
    p.add_argument("--attacks", help="comma-separated attack names (default: all)")
    p.add_argument("--policy", type=scripted_policy,
                   help="also measure this scripted policy on the tasks")  # fmt: skip
    p.add_argument("--model", type=checkpoint_dir,
                   help="also measure this checkpoint (overrides --policy)")  # fmt: skip
    args = p.parse_args(argv)
    attacks = _attacks(args.attacks)
    settings = load_settings(args.preset, workers=args.workers, safety_n_tasks=args.n_tasks)
    e = settings.evaluation
    tasks = build_safety_tasks(
        args.out / "suite",
        e.safety_n_tasks,
        e.safety_seed,
        environments_dir=settings.sandbox.environments_dir,
    )
    report = run_safety_suite(tasks, settings.env, settings.sandbox, attacks=attacks,
                              workers=e.workers, every_task=args.every_task)  # fmt: skip
    payload = report.to_dict()
    if args.policy or args.model:
        policy = _policy_arg(args)
        results = run_episodes(tasks, policy, settings, args.out / "suite")
        payload["candidate"] = candidate_safety(tasks, results)
        payload["settings"] = settings.describe(policy)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "safety.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "safety.md").write_text("# Safety suite\n\n" + report.to_markdown() + "\n")
    print(report.to_markdown())
    return 0 if report.passed else 1


def _rescore_parser() -> ArgumentParser:
    p = ArgumentParser(prog="agentrl rescore", description=RESCORE_HELP)
    p.add_argument("source", type=existing_path, metavar="SRC",
                   help="a dataset folder (manifest.json), an evaluation folder "
                        "(trajectories.jsonl), a rollout folder (samples.jsonl) or a JSONL "
                        "file of canonical records")  # fmt: skip
    p.add_argument("--tasks", required=True, type=existing_dir,
                   help="folder of the episodes' task folders")  # fmt: skip
    common_options(p)
    p.add_argument("--out", type=output_dir, default=Path("runs/rescore"),
                   help="report.json, report.md, rescored.jsonl, results.json")  # fmt: skip
    p.add_argument("--write", action="store_true",
                   help="publish the rescored dataset as a new data version (SRC must be a "
                        "dataset folder inside the versioned data folder)")  # fmt: skip
    p.add_argument("--run-id", default="", help="the MLflow run whose episodes these are")
    p.add_argument("--no-mlflow", action="store_true", help="do not log the rescore to MLflow")
    return p


RESCORE_HELP = (
    "Judge stored episodes again under the current verifier: replay each into a fresh "
    "sandbox over its task, verify it, and report old vs new verdicts; --write publishes a "
    "dataset's new rewards as a new data version."
)


def main_rescore(argv: list[str]) -> int:
    """Judge stored episodes again under the current verifier: replay each into a fresh
    sandbox over its task, verify it, and report old vs new verdicts (components/evaluate/
    rescore.py); --write publishes a dataset's new rewards as a new data version."""
    from components.evaluate.rescore import (
        RescoreError,
        publish_rescored_version,
        read_stored,
        rescore_records,
        summarize_rescore,
    )

    args = _rescore_parser().parse_args(argv)
    settings = load_settings(args.preset, workers=args.workers)
    # --out holds nothing of anyone else's (a previous rescore's files are replaced).
    check_output_dir(args.out, overwrite=True, what="rescore", known=RESCORE_FILES, rewritten=True)
    records, source = read_stored(args.source)
    if args.write and source["kind"] != "dataset":
        raise UsageError(f"--write needs a dataset folder, not {source['kind']} {args.source}")
    if not records:
        raise CommandError(f"no episodes in {args.source}")
    versioning = _rescore_versioning(args, source)
    tasks = _rescore_tasks(args.tasks, records, args.source)
    if args.run_id and not args.no_mlflow:
        from components.tracking import check_run

        try:
            check_run(args.run_id)
        except LookupError as e:
            raise CommandError(f"--run-id: {e}") from e
    check_free_space(args.out, "the rescore's report")  # before any replay, not after
    from components.verifier.cache import verdict_cache_info

    before, t0 = verdict_cache_info(), time.monotonic()
    rows = rescore_records(records, tasks, settings.env, settings.sandbox,
                           workers=settings.evaluation.workers)  # fmt: skip
    summary = summarize_rescore(rows, time.monotonic() - t0, before)
    if summary["rescored"] == 0:  # bad input (or no verdict at all), not a rescore
        first = next(r for r in rows if r.new is None)
        raise CommandError(
            f"no episode of {args.source} could be rescored: {summary['episodes']} "
            f"not rescored, {summary['quarantined']} of them quarantined "
            f"(first: {first.error})"
        )
    paths = _write_rescore(args.out, rows, records, summary, source)
    if args.write:
        try:
            entry = publish_rescored_version(args.source, rows, summary, paths["report.json"],
                                             versioning)  # fmt: skip
        except RescoreError as e:
            raise CommandError(str(e)) from e
        summary["data_version"] = entry["version"]
        print(f"new data version {entry['version']} (rescored from "
              f"{entry['lineage']['rescored_from']})")  # fmt: skip
    if not args.no_mlflow:
        from components.tracking import log_rescore

        summary["mlflow_run_id"] = log_rescore(summary, source, [paths["report.json"],
                                               paths["report.md"]], args.run_id,
                                               source.get("data_version", ""))  # fmt: skip
    f = summary["flips"]
    print(f"rescored {summary['rescored']} of {summary['episodes']} episodes under "
          f"{summary['verifier_version']}: {f['pass->fail']} pass->fail, {f['fail->pass']} "
          f"fail->pass, {summary['not_rescored']} not rescored "
          f"({summary['episodes_per_s']} episodes/s); report: {paths['report.md']}")  # fmt: skip
    with disk_errors(args.out / "result.json", "the rescore's result"):
        write_atomic(args.out / "result.json", json.dumps(summary, indent=2) + "\n")
    return 0


# What a rescore writes into --out (a folder of an older rescore, before output manifests).
RESCORE_FILES = {"report.json", "report.md", "rescored.jsonl", "results.json", "result.json"}


def _rescore_tasks(tasks_dir: Path, records: list[dict], source: Path) -> dict[str, Task]:
    """The episodes' tasks by id; refused before any replay when none of them is there."""
    tasks, errors = load_tasks(tasks_dir)
    for e in errors:
        print(f"agentrl: skipped invalid task: {e}", file=sys.stderr)
    by_id = {t.id: t for t in tasks}
    # Ids as given (a record without one is the replay's own refusal, named by its line).
    wanted = {r["task_id"] for r in records if isinstance(r, dict) and r.get("task_id")}
    wanted = {t for t in wanted if isinstance(t, str)}
    if wanted and not wanted & set(by_id):
        shown = ", ".join(sorted(wanted)[:3]) + (" ..." if len(wanted) > 3 else "")
        raise CommandError(f"none of the tasks of {source}'s episodes ({shown}) is in {tasks_dir}")
    return by_id


def _rescore_versioning(args, source: dict):
    """The data versioning a dataset source belongs to (None for other sources); the data
    version it was read at goes into `source`. --write outside the versioned data folder is
    refused here, before any episode is replayed."""
    if not (args.write or source["kind"] == "dataset"):
        return None
    from components.data import dvc_store as dv
    from components.preset import stage_config

    versioning = stage_config(args.preset, "data").versioning
    data = (Path(versioning.repo_root) / versioning.data_dir).resolve()
    inside = data == args.source.resolve() or data in args.source.resolve().parents
    if args.write and not inside:
        raise UsageError(
            f"--write: {args.source} is not inside the versioned data folder "
            f"{data}; rescore without --write, or rescore a dataset under it"
        )
    try:  # the version a dataset inside the versioned folder belongs to
        source["data_version"] = dv.current_version(versioning) if inside else ""
    except (dv.VersioningError, OSError) as e:
        if args.write:
            raise CommandError(f"--write: no data version to rescore from ({e})") from e
    return versioning


def _write_rescore(out: Path, rows, records: list[dict], summary: dict, source: dict) -> dict:
    """The rescore's files in `out`, in place of a previous rescore's, its output manifest
    first (a failure half-way leaves a folder the next rescore replaces); a full disk is
    one line naming the file."""
    from components.evaluate.rescore import write_outputs

    claim_output_dir(out, overwrite=True, what="rescore", known=RESCORE_FILES, rewritten=True)
    start_outputs(out, RESCORE_FILES)
    with disk_errors(out, "the rescore's report"):
        return write_outputs(out, rows, records, summary, source)


def main_demo(argv: list[str]) -> int:
    """Generate the built-in suite, gate the test split, compare oracle and noop on it."""
    from components.env.batch_eval import format_table, summarize, write_results
    from components.sandbox.isolation import isolation_report
    from components.tasks.gate import check_tasks
    from components.tasks.generate import GenerateConfig, generate_suite
    from components.verifier.gate_runner import sandboxed_test_runner

    p = ArgumentParser(prog="agentrl demo", description=main_demo.__doc__)
    common_options(p)
    p.add_argument("--out", type=output_dir, default=Path("runs/demo"))
    p.add_argument("--n", type=positive_int, default=300, help="tasks to generate")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    settings = load_settings(args.preset, workers=args.workers, seed=args.seed)
    t0 = time.monotonic()
    tasks_dir = args.out / "tasks"
    print(f"[1/4] generating {args.n} tasks (seed {args.seed}) into {tasks_dir}", flush=True)
    report = generate_suite(tasks_dir, GenerateConfig(n_tasks=args.n, seed=args.seed))
    print(f"      {report.summary_line()}", flush=True)
    tasks, errors = load_tasks(tasks_dir, split="test")
    for e in errors:
        print(f"      invalid task: {e}")
    print(f"[2/4] gating the {len(tasks)} test-split tasks in the sandbox", flush=True)
    runner = sandboxed_test_runner(settings.env, settings.sandbox)
    gate = check_tasks(tasks, runner, workers=settings.evaluation.workers)
    for task_id, reason in sorted(gate.failed.items()):
        print(f"      gate FAILED {task_id}: {reason}")
    gated = [t for t in tasks if t.id in set(gate.passed)]
    print(f"      {len(gated)} passed, {len(gate.failed)} reported", flush=True)
    summaries = []
    for i, name in enumerate(("oracle", "noop"), start=3):
        print(f"[{i}/4] {name} policy on the test split", flush=True)
        progress = progress_lines(len(gated), name, 10)
        results = run_episodes(gated, name, settings, tasks_dir, progress)
        write_results(args.out / f"results-{name}.json", results, args.out / f"traj-{name}.jsonl")
        summaries.append(summarize(results))
    print("\nEnvironment demo: oracle vs noop on the test split (unseen function families)\n")
    print(format_table(summaries))
    for label, summary in zip(("oracle", "noop  "), summaries, strict=True):
        terms = summary["mean_reward_terms"]
        print(f"mean reward terms ({label}): "
              + ", ".join(f"{k}={v:+.2f}" for k, v in terms.items()))  # fmt: skip
    print(f"\nresults: {args.out}/results-*.json   trajectories: {args.out}/traj-*.jsonl")
    print(f"sandbox: {isolation_report(settings.sandbox).get('summary', '')}")
    print(f"total {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    commands = {"run": main_evaluate, "safety": main_safety, "demo": main_demo}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m components.evaluate {run,safety,demo} [options]",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    from components.cli import boundary

    sys.exit(boundary(lambda: commands[sys.argv[1]](sys.argv[2:]), f"agentrl {sys.argv[1]}"))
