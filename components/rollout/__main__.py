"""Command line of the rollout engine: `agentrl rollout sample` samples K episodes per task
with a policy, verifies them and saves their records (the samples RS and DPO learn from).

    agentrl rollout sample --preset P --policy DIR --tasks DIR --split train --out DIR

    agentrl rollout export SRC... --format atif --out DIR     (episodes as ATIF documents)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from components.cli_args import (
    ArgumentParser,
    CommandError,
    UsageError,
    existing_dir,
    existing_path,
    output_dir,
    positive_int,
    saved_policy,
)
from components.stage_contract import stage
from components.stage_io import claim_stage_dir, stage_parser, start_stage_dir, write_stage_result


@stage("rollout", "env", "sandbox", "runtime")
def main_sample(argv: list[str]) -> int:
    """Sample K episodes per task with the policy (the preset's rollout, env, sandbox and
    runtime sections), verify them, save records + summary."""
    p = stage_parser("agentrl rollout sample", main_sample.__doc__)
    from components.tasks.task import SPLITS

    p.add_argument("--policy", required=True, type=saved_policy)
    p.add_argument("--tasks", required=True, type=existing_dir)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--limit", type=positive_int, help="only the first N tasks")
    args = p.parse_args(argv)
    claim_stage_dir(args.out)
    from components.policy.model import load_policy
    from components.preset import load_preset
    from components.rollout.engine import rollout_summary, sample_episodes
    from components.serve.vllm_launcher import sampling_server
    from components.tasks.task import load_tasks

    preset = load_preset(args.preset)
    tasks, errors = load_tasks(args.tasks, split=args.split)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CommandError(f"invalid task: {errors[0]}{more}")
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise CommandError(f"no {args.split} tasks in {args.tasks}")
    start_stage_dir(args.out)
    model, tokenizer = load_policy(args.policy)
    t0 = time.monotonic()
    budget = preset.section("runtime").startup_timeout_s
    with sampling_server(preset.section("rollout"), args.policy, budget,
                         args.out / "vllm-logs") as (rollout, base):  # fmt: skip
        # The server samples: make it serve this policy first (unless it was started on it).
        if rollout.backend == "openai" and base != Path(args.policy):
            from components.rollout.policy_sync import PolicySyncError, serve_checkpoint

            try:
                rollout = serve_checkpoint(rollout, args.policy)
            except PolicySyncError as e:
                print(f"agentrl rollout sample: {e}", file=sys.stderr)
                return 1
        model = None if rollout.backend == "openai" else model
        rollouts = sample_episodes(tasks, model, tokenizer, rollout,
                                   preset.section("env"), preset.section("sandbox"),
                                   policy_name=Path(args.policy).name)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "samples.jsonl").open("w") as f:
        for r in rollouts:
            record = r.result.record
            if r.policy_version:  # the served version that sampled it (oldest turn's)
                record = {**record, "metadata": {**record["metadata"],
                                                 "model_version": r.policy_version}}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    summary = rollout_summary(rollouts)
    return write_stage_result(args.out, {**summary, "samples": str(args.out / "samples.jsonl"),
                                         "seconds": round(time.monotonic() - t0, 2)})  # fmt: skip


def main_export(argv: list[str] | None = None) -> int:
    """Write episodes (rollout samples.jsonl, or dataset folders) in another format: one
    ATIF-v1.6 document per episode (components/data/atif.py). Written into a staging folder
    beside --out and moved in only when every episode converted: bad input (not UTF-8, no
    episode, a record that is none) leaves --out as it was."""
    p = ArgumentParser(prog="agentrl rollout export", description=main_export.__doc__)
    p.add_argument("sources", nargs="+", metavar="SRC", type=existing_path,
                   help="JSONL files or dataset folders")  # fmt: skip
    p.add_argument("--format", choices=["atif"], required=True, help="output format")
    p.add_argument(
        "--out",
        required=True,
        type=output_dir,
        help="folder for <episode id>.json files (empty, or a previous export with --overwrite)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous export in --out (only what agentrl wrote)",
    )
    args = p.parse_args(argv)
    from components.output_files import disk_errors
    from components.outputs import check_output_dir, claim_output_dir

    out = Path(args.out)
    check_output_dir(out, args.overwrite, "export")
    for src in args.sources:
        _check_text_source(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.export-")
    with staging as tmp, disk_errors(out, "the ATIF documents"):
        written = _export_staged(args.sources, Path(tmp))
        claim_output_dir(out, args.overwrite, "export")
        _move_in(written, out)
    print(json.dumps({"format": args.format, "out_dir": str(out), "episodes": len(written)}))
    return 0


def _check_text_source(src: Path) -> None:
    """A file source must be UTF-8 text (a JSONL file); said by name before any work."""
    if src.is_file():
        try:
            with src.open(encoding="utf-8") as f:
                for _ in f:
                    pass
        except UnicodeDecodeError as e:
            raise CommandError(
                f"{src}: not UTF-8 text at byte {e.start} (expected a JSONL "
                "file of episode records)"
            ) from None


def _export_staged(sources: list[Path], staging: Path) -> list[Path]:
    """The ATIF documents of `sources` in `staging`; CommandError when there are none."""
    from components.data.atif import export_atif
    from components.data.ingest import DatasetError
    from components.data.writers import LockTimeout

    try:
        written = export_atif([str(s) for s in sources], staging)
    except FileNotFoundError as e:  # a source gone since the arguments were checked
        raise UsageError(str(e)) from e
    except (DatasetError, LockTimeout) as e:
        raise CommandError(str(e)) from e
    if not written:
        raise CommandError(f"no episodes in {', '.join(map(str, sources))}: nothing exported")
    return written


def _move_in(written: list[Path], out: Path) -> None:
    """Move the staged documents into `out`, each listed in its output manifest first."""
    from components.output_files import add_outputs, start_outputs

    start_outputs(out)
    add_outputs(out, *(path.name for path in written))
    for path in written:
        os.replace(path, out / path.name)
