"""CLI of the training stages. Each command reads artefacts (paths), writes artefacts and a
small `result.json` into its output folder, so a stage runs the same in-process, as a
subprocess or as a Kubernetes Job.

    agentrl policy init   --preset P --records SRC --out DIR
    agentrl policy merge  --policy ADAPTER_DIR --out DIR
    agentrl train sft     --preset P --policy DIR --records SRC --out DIR
    agentrl rollout sample --preset P --policy DIR --tasks DIR --split train --out DIR
    agentrl train rs      --preset P --policy DIR --samples DIR --out DIR
    agentrl train dpo     --preset P --policy DIR --samples DIR --out DIR
    agentrl train grpo    (see --help)

`train sft` (with the preset's sft.deepspeed), `train dpo` and `train grpo` also run under
torchrun, one process per device (`python -m torch.distributed.run --nproc_per_node N -m
components.cli train dpo ...`, the k8s trainer Job): rank 0 writes the result.
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
    existing_dir,
    existing_path,
    output_dir,
    positive_float,
    positive_int,
    preset_file,
    saved_policy,
)
from components.outputs import check_output_dir, record_outputs, write_atomic
from components.preset import DEFAULT_PRESET


def read_records(sources: list[str]) -> list[dict]:
    """Canonical records from JSONL files or ingested/validated dataset folders."""
    from components.data.ingest import load_records

    records: list[dict] = []
    for src in map(Path, sources):
        if src.is_dir() and (src / "manifest.json").exists():
            records.extend(load_records(src))
        elif src.is_dir() and (src / "samples.jsonl").exists():
            records.extend(_jsonl(src / "samples.jsonl"))
        elif src.is_file():
            records.extend(_jsonl(src))
        else:
            raise CommandError(f"no records at {src} (a .jsonl file or a dataset folder)")
    return records


def _jsonl(path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise CommandError(f"{path}:{number}: not a JSON record ({e.msg})") from None
    return records


def _parser(prog: str, doc: str) -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=doc)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file,
                   help="preset YAML (configs/)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir,
                   help="output folder (empty, or a previous run of this stage: it resumes)")  # fmt: skip
    return p


def _claim(out: Path) -> None:
    """Before any work: `out` is empty, or this stage's own folder (it carries the output
    manifest from its start, or a finished run's result.json), which the stage resumes or
    rewrites; a folder holding anything else is refused with what it holds."""
    from components.outputs import MANIFEST

    ours = (out / MANIFEST).is_file() or (out / "result.json").is_file()
    if out.is_dir() and any(out.iterdir()) and not ours:
        check_output_dir(out, overwrite=True, what="stage output")


def _start(out: Path) -> None:
    """Mark `out` as this stage's folder once its inputs are read, before the long work:
    a run killed now is resumed, not refused, by the next."""
    from components.outputs import MANIFEST

    out.mkdir(parents=True, exist_ok=True)
    if not (out / MANIFEST).is_file():
        write_atomic(out / MANIFEST, '{"entries": []}\n')


def _section(args, name: str, **overrides):
    from components.preset import stage_config

    return stage_config(args.preset, name, **overrides)


def _write_result(out: Path, result: dict) -> int:
    write_atomic(out / "result.json", json.dumps(result, indent=2, default=str) + "\n")
    record_outputs(out)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, default=str))
    return 0


def main_policy_init(argv: list[str]) -> int:
    """Build the tiny policy from the preset (tokenizer trained on the records) and save it."""
    p = _parser("agentrl policy init", main_policy_init.__doc__)
    p.add_argument("--records", nargs="*", default=[], type=existing_path,
                   help="trajectories for the tokenizer")  # fmt: skip
    args = p.parse_args(argv)
    _claim(args.out)
    from components.policy.model import build_policy, save_policy

    t0 = time.monotonic()
    config = _section(args, "policy")
    records = read_records(args.records)
    _start(args.out)
    model, tokenizer = build_policy(config, records=records)
    save_policy(model, tokenizer, args.out / "policy")
    return _write_result(args.out, {
        "policy_dir": str(args.out / "policy"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seconds": round(time.monotonic() - t0, 2),
    })  # fmt: skip


def main_policy_merge(argv: list[str]) -> int:
    """Fold a LoRA adapter policy into its base: a plain checkpoint for serving."""
    p = ArgumentParser(prog="agentrl policy merge", description=main_policy_merge.__doc__)
    p.add_argument("--policy", required=True, type=existing_dir,
                   help="adapter folder (a stage run with lora)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir, help="output folder")
    args = p.parse_args(argv)
    from components.policy.lora import base_directory, is_adapter_dir, merge_adapters
    from components.policy.model import load_policy, save_policy

    if not is_adapter_dir(args.policy):
        raise CommandError(f"{args.policy} is not an adapter policy (no adapter metadata)")
    _claim(args.out)
    _start(args.out)
    model, tokenizer = load_policy(args.policy)
    merged = save_policy(merge_adapters(model), tokenizer, args.out / "policy")
    return _write_result(args.out, {"policy_dir": str(merged), "adapters": args.policy,
                                    "base": str(base_directory(args.policy))})  # fmt: skip


def main_sft(argv: list[str]) -> int:
    """Supervised fine-tuning on expert trajectories (loss on assistant tokens only)."""
    p = _parser("agentrl train sft", main_sft.__doc__)
    p.add_argument("--policy", required=True, type=saved_policy, help="policy folder to start from")
    p.add_argument("--records", nargs="+", required=True, type=existing_path,
                   help="JSONL files / dataset folders")  # fmt: skip
    p.add_argument("--max-steps", type=positive_int, help="override sft.max_steps")
    p.add_argument("--epochs", type=positive_float, help="override sft.epochs")
    args = p.parse_args(argv)
    _claim(args.out)
    from components.policy.model import load_policy
    from components.train.parallel import relaunch_as_ranks, world
    from components.train.sft import train_sft

    config = _section(args, "sft", max_steps=args.max_steps, epochs=args.epochs,
                      output_dir=str(args.out))  # fmt: skip
    code = relaunch_as_ranks(["train", "sft", *argv]) if config.deepspeed is not None else None
    if code is not None:
        return code
    records = read_records(args.records)  # a bad record is found before the model loads
    _start(args.out)
    model, tokenizer = load_policy(args.policy)
    result = train_sft(model, tokenizer, records, config)
    if world()[0] != 0:  # a torchrun rank other than 0 (DeepSpeed SFT)
        return 0
    return _write_result(args.out, {**dataclasses.asdict(result),
                                    "policy_dir": str(Path(result.checkpoint_dir))})  # fmt: skip


def main_sample(argv: list[str]) -> int:
    """Sample K episodes per task with the policy (the preset's rollout, env, sandbox and
    runtime sections), verify them, save records + summary."""
    p = _parser("agentrl rollout sample", main_sample.__doc__)
    from components.tasks.task import SPLITS

    p.add_argument("--policy", required=True, type=saved_policy)
    p.add_argument("--tasks", required=True, type=existing_dir)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--limit", type=positive_int, help="only the first N tasks")
    args = p.parse_args(argv)
    _claim(args.out)
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
    _start(args.out)
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
    return _write_result(args.out, {**summary, "samples": str(args.out / "samples.jsonl"),
                                    "seconds": round(time.monotonic() - t0, 2)})  # fmt: skip


def main_rejection_sampling(argv: list[str]) -> int:
    """Keep the verified successes among sampled episodes and fine-tune on them."""
    p = _parser("agentrl train rs", main_rejection_sampling.__doc__)
    p.add_argument("--policy", required=True, type=saved_policy)
    p.add_argument("--samples", nargs="+", required=True, type=existing_path)
    args = p.parse_args(argv)
    _claim(args.out)
    from components.policy.model import load_policy
    from components.train.parallel import relaunch_as_ranks, world
    from components.train.rejection_sampling import train_rejection_sampling

    config = _section(args, "rejection_sampling")
    config = dataclasses.replace(config, sft=dataclasses.replace(config.sft,
                                                                 output_dir=str(args.out)))  # fmt: skip
    ranks = relaunch_as_ranks(["train", "rs", *argv]) if config.sft.deepspeed else None
    if ranks is not None:
        return ranks
    samples = read_records(args.samples)
    _start(args.out)
    model, tokenizer = load_policy(args.policy)
    result = train_rejection_sampling(model, tokenizer, samples, config)
    if world()[0] != 0:  # a torchrun rank other than 0 (DeepSpeed SFT)
        return 0
    return _write_result(args.out, dataclasses.asdict(result))


def main_dpo(argv: list[str]) -> int:
    """DPO on success-vs-failure pairs of the same task (whole multi-turn trajectories)."""
    p = _parser("agentrl train dpo", main_dpo.__doc__)
    p.add_argument("--policy", required=True, type=saved_policy)
    p.add_argument("--samples", nargs="+", required=True, type=existing_path)
    args = p.parse_args(argv)
    _claim(args.out)
    from components.policy.model import load_policy
    from components.train.data import preference_pairs
    from components.train.dpo import train_dpo
    from components.train.parallel import join_process_group, relaunch_as_ranks

    config = _section(args, "dpo", output_dir=str(args.out))
    pairs = preference_pairs(read_records(args.samples), config.pairs_per_task, config.seed)
    if not pairs:
        return _write_result(args.out, {"skipped": "no success/failure pair on any task",
                                        "num_pairs": 0, "policy_dir": args.policy})  # fmt: skip
    _start(args.out)
    if (code := relaunch_as_ranks(["train", "dpo", *argv])) is not None:
        return code
    rank, _ = join_process_group()
    model, tokenizer = load_policy(args.policy)
    result = train_dpo(model, None, tokenizer, pairs, config)
    return _write_result(args.out, dataclasses.asdict(result)) if rank == 0 else 0


def main_grpo(argv: list[str]) -> int:
    from components.train.grpo import main_grpo as run

    return run(argv)
