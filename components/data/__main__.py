"""Command lines of the data stages; components/cli.py mounts them as `agentrl data ...`.

    agentrl data ingest SRC... [--format auto|mission|openai|miniswe|rollout|atif] [--out DIR]
                        [--overwrite]
    agentrl data validate [--in DIR] [--out DIR] [--report-dir DIR] [--secret-policy P]
                          [--max-failure-rate F] [--eval-tasks DIR] [--eval-task-id ID ...]
    agentrl data snapshot [--message TEXT] [--init-only]
    agentrl data versions [--json]
    agentrl data rollback VERSION [--snapshot-first]
    agentrl data repair

Every command takes --preset FILE and reads its `data` section (sub-sections ingest /
validate / versioning, components/data/config.py; no preset or no section: the defaults);
flags given on the command line override it. Each function returns the exit status:
0 done, 1 the stage failed or refused (validation over threshold, an empty input, a
dataset in --out without --overwrite, unsnapshotted changes before a rollback, another
writer holding the target past the lock timeout; one `error:` line, no traceback),
2 usage or a missing input.
Also runnable as `python -m components.data <command> ...`.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from components.cli_args import (
    ArgumentParser,
    existing_dir,
    existing_path,
    fraction,
    nonempty,
    positive_int,
    preset_file,
)
from components.data.config import FORMATS, DataConfig
from components.stage_contract import DataVersionResult, stage


def _parser(prog: str, description: str, repo_root: bool = False) -> ArgumentParser:
    p = ArgumentParser(prog=f"agentrl data {prog}", description=description)
    p.add_argument(
        "--preset", default=None, type=preset_file,
        help="preset YAML; its `data` section configures the stage",
    )  # fmt: skip
    if repo_root:
        p.add_argument("--repo-root", default=None, type=lambda t: str(existing_dir(t)),
                       help="repository root (default: .)")  # fmt: skip
    return p


def _load(args) -> DataConfig:
    if args.preset is None:
        return DataConfig()
    from components.preset import stage_config

    return stage_config(args.preset, "data")


def _with(config, **flags):
    """`config` with the flags that were given (not None) replacing its fields."""
    return dataclasses.replace(config, **{k: v for k, v in flags.items() if v is not None})


def _versioning(args):
    return _with(_load(args).versioning, repo_root=args.repo_root)


def _error(e: BaseException) -> int:
    """One line on stderr for an expected failure; 2 for a missing input, else 1."""
    print(f"error: {e}", file=sys.stderr)
    return 2 if isinstance(e, FileNotFoundError) else 1


def _expected_errors() -> tuple[type[BaseException], ...]:
    """What a data command reports as one line instead of a traceback: refusals, lock
    timeouts, damaged datasets and file-system errors (permissions, a full disk)."""
    from components.data.dvc_store import VersioningError
    from components.data.ingest import DatasetError
    from components.data.writers import LockTimeout

    return (DatasetError, VersioningError, LockTimeout, OSError)


@stage("data")
def main_ingest(argv: list[str] | None = None) -> int:
    p = _parser("ingest", "Read trajectories in any supported format into Parquet shards.")
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        type=lambda t: str(existing_path(t)),
        help="input files or folders (searched recursively)",
    )
    p.add_argument(
        "--format", choices=FORMATS, default=None, help="input format (default: detect per record)"
    )
    p.add_argument("--out", default=None, help="output dataset folder (default: data/ingested)")
    p.add_argument(
        "--rows-per-shard", type=positive_int, default=None, help="trajectories per Parquet shard"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in --out")
    args = p.parse_args(argv)
    from components.data.ingest import ingest

    cfg = _with(_load(args).ingest, format=args.format, out_dir=args.out,
                rows_per_shard=args.rows_per_shard)  # fmt: skip
    from components.workdir_lock import workdir_lock

    try:  # one writer per dataset folder (a second is refused, not interleaved)
        with workdir_lock(cfg.out_dir, "agentrl data ingest"):
            result = ingest(args.sources, cfg, overwrite=args.overwrite)
    except _expected_errors() as e:
        return _error(e)
    for entry in result.quarantine:
        for reason in entry["reasons"]:
            print(f"quarantined: {reason}", file=sys.stderr)
    print(
        json.dumps(
            {"out_dir": str(result.out_dir), "counts": result.counts, "sources": result.per_source},
            indent=2,
        )
    )
    return 0


def _validate_locked(cfg) -> dict:
    """validate_dataset under the lock of its output folder (one writer at a time)."""
    from components.data.validate import validate_dataset
    from components.workdir_lock import workdir_lock

    with workdir_lock(cfg.out_dir, "agentrl data validate"):
        return validate_dataset(cfg)


@stage("data")
def main_validate(argv: list[str] | None = None) -> int:
    p = _parser("validate", "Validate an ingested dataset with Great Expectations.")
    p.add_argument(
        "--in",
        dest="in_dir",
        default=None,
        type=lambda t: str(existing_dir(t)),
        help="ingested dataset (default: data/ingested)",
    )
    p.add_argument("--out", default=None, help="validated dataset folder (default: data/validated)")
    p.add_argument(
        "--report-dir",
        default=None,
        help="report.json + GX data docs (default: reports/data_validation)",
    )
    p.add_argument(
        "--secret-policy",
        choices=["redact", "reject"],
        default=None,
        help="what to do with API keys found",
    )
    p.add_argument(
        "--max-failure-rate",
        type=fraction,
        default=None,
        help="fail when quarantined/ingested exceeds this",
    )
    p.add_argument(
        "--eval-tasks",
        default=None,
        type=lambda t: str(existing_dir(t)),
        help="task folder; its val/test task ids must not appear",
    )
    p.add_argument(
        "--eval-task-id", action="append", default=None, help="an evaluation task id (repeatable)"
    )
    args = p.parse_args(argv)

    cfg = _load(args).validate
    cfg = _with(
        cfg,
        in_dir=args.in_dir,
        out_dir=args.out,
        report_dir=args.report_dir,
        secret_policy=args.secret_policy,
        max_failure_rate=args.max_failure_rate,
        eval_task_root=args.eval_tasks,
        eval_task_ids=(*cfg.eval_task_ids, *args.eval_task_id) if args.eval_task_id else None,
    )
    try:
        report = _validate_locked(cfg)
    except _expected_errors() as e:
        return _error(e)
    summary = {
        k: report[k]
        for k in (
            "passed",
            "failure_rate",
            "max_failure_rate",
            "counts",
            "quarantined_by_check",
            "redactions",
            "timings_s",
            "data_docs",
            "quarantine",
        )
    }
    print(json.dumps(summary, indent=2))
    if not report["passed"]:
        print(
            f"validation failed: {report['counts']['quarantined']} of {report['counts']['ingested']} "
            f"records quarantined ({report['failure_rate']:.1%} > {cfg.max_failure_rate:.1%}); "
            f"reasons in {report['quarantine']}",
            file=sys.stderr,
        )
        return 1
    return 0


@stage("data", result=DataVersionResult)
def main_snapshot(argv: list[str] | None = None) -> int:
    p = _parser(
        "snapshot", "Version data/ with DVC (add + push); prints the version id.", repo_root=True
    )
    p.add_argument("--message", "-m", default="", help="note stored in the version log")
    p.add_argument(
        "--init-only", action="store_true", help="only dvc init and configure the remote"
    )
    args = p.parse_args(argv)
    from components.data.dvc_store import init_dvc
    from components.data.versioning import snapshot

    cfg = _versioning(args)
    try:
        if args.init_only:
            for line in init_dvc(cfg) or ["already initialised"]:
                print(line)
            return 0
        entry = snapshot(cfg, args.message)
    except _expected_errors() as e:
        return _error(e)
    print(entry["version"])
    print(f"commit data.dvc and {cfg.version_log} to record this version", file=sys.stderr)
    return 0


def main_versions(argv: list[str] | None = None) -> int:
    p = _parser("versions", "List dataset versions (newest last).", repo_root=True)
    p.add_argument("--json", action="store_true", help="print the log entries as JSON lines")
    args = p.parse_args(argv)
    from components.data.dvc_store import VersioningError, check_dvc_file
    from components.data.version_log import pending, read_log

    cfg = _versioning(args)
    try:
        entries = read_log(cfg)
    except _expected_errors() as e:
        return _error(e)
    if note := pending(cfg):
        print(f"warning: {note}", file=sys.stderr)
    if args.json:
        for e in entries:
            print(json.dumps({k: v for k, v in e.items() if k not in ("files", "dvc_file")}))
    else:
        _print_versions(entries)
    try:
        check_dvc_file(cfg)  # the listing comes from the log; say when data.dvc is damaged
    except VersioningError as e:
        return _error(e)
    return 0


def version_counts(entry: dict) -> dict[str, int]:
    """Records of a version: valid and quarantined as the most processed stage of each
    dataset says (a validated dataset counts once, not again as the ingested dataset it was
    made from), and `unvalidated`: the valid records of ingested datasets no validated one
    was made from. Log entries older than the content hashes count as they did (validated
    datasets, else ingested)."""
    stages = [d for d in entry["datasets"].values() if d.get("counts")]
    validated = [d for d in stages if d.get("stage") == "validate"]
    if any("content_hash" not in d for d in stages):
        final, pending = (validated or stages), []
    else:
        consumed = {d["input_content_hash"] for d in validated}
        final = validated
        pending = [d for d in stages if d not in validated and d["content_hash"] not in consumed]
    return {
        "valid": sum(d["counts"].get("valid", 0) for d in final),
        "quarantined": sum(d["counts"].get("quarantined", 0) for d in [*final, *pending]),
        "unvalidated": sum(d["counts"].get("valid", 0) for d in pending),
    }


def _print_versions(entries: list[dict]) -> None:
    print(
        f"{'version':<34} {'date':<21} {'files':>5} {'valid':>7} {'quarantined':>11} "
        f"{'unvalidated':>11}  sources"
    )
    for e in entries:
        c = version_counts(e)
        srcs = ", ".join(e["sources"][:3]) + (
            f" (+{len(e['sources']) - 3})" if len(e["sources"]) > 3 else ""
        )
        print(
            f"{e['version']:<34} {e['created_at']:<21} {e['nfiles']:>5} {c['valid']:>7} "
            f"{c['quarantined']:>11} {c['unvalidated']:>11}  {srcs}"
        )


def main_rollback(argv: list[str] | None = None) -> int:
    p = _parser(
        "rollback",
        "Restore data/ to a version (pulling from the remote if needed).",
        repo_root=True,
    )
    p.add_argument("version", metavar="VERSION", type=nonempty,
                   help="version id or a unique prefix of one")  # fmt: skip
    p.add_argument(
        "--snapshot-first",
        action="store_true",
        help="snapshot changes in data/ that no version holds before rolling back",
    )
    args = p.parse_args(argv)
    from components.data.versioning import rollback

    try:
        result = rollback(_versioning(args), args.version, snapshot_first=args.snapshot_first)
    except _expected_errors() as e:
        return _error(e)
    print(json.dumps(result))
    return 0


def main_repair(argv: list[str] | None = None) -> int:
    p = _parser(
        "repair",
        "Rebuild a damaged data.dvc from the version log when data/ matches a version.",
        repo_root=True,
    )
    args = p.parse_args(argv)
    from components.data.version_log import repair

    try:
        result = repair(_versioning(args))
    except _expected_errors() as e:
        return _error(e)
    print(json.dumps(result))
    return 0


COMMANDS = {
    "ingest": main_ingest,
    "validate": main_validate,
    "snapshot": main_snapshot,
    "versions": main_versions,
    "rollback": main_rollback,
    "repair": main_repair,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m components.data {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    from components.cli import run

    return run(["data", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
