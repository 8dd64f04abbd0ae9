"""CLI of the training stages. Each command reads artefacts (paths), writes artefacts and a
small `result.json` into its output folder (components/stage_io.py), so a stage runs the
same in-process, as a subprocess or as a Kubernetes Job; its contract (`@stage`) names the
preset sections it reads and the result the flow reads back.

    agentrl train sft     --preset P --policy DIR --records SRC --out DIR
    agentrl train rs      --preset P --policy DIR --samples DIR --out DIR
    agentrl train dpo     --preset P --policy DIR --samples DIR --out DIR
    agentrl train grpo    (see --help)
    agentrl train ppo     (the same arguments as grpo; the preset's `ppo` section)

`train sft` (with the preset's sft.deepspeed), `train dpo`, `train grpo` and `train ppo`
also run under torchrun, one process per device (`python -m torch.distributed.run
--nproc_per_node N -m components.cli train dpo ...`, the k8s trainer Job): rank 0 writes
the result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from components.cli_args import existing_path, positive_float, positive_int, saved_policy
from components.stage_contract import PolicyResult, stage
from components.stage_io import (
    claim_stage_dir,
    read_records,
    stage_parser,
    start_stage_dir,
    write_stage_result,
)


def _section(args, name: str, **overrides):
    from components.preset import stage_config

    return stage_config(args.preset, name, **overrides)


@stage("sft", result=PolicyResult)
def main_sft(argv: list[str]) -> int:
    """Supervised fine-tuning on expert trajectories (loss on assistant tokens only)."""
    p = stage_parser("agentrl train sft", main_sft.__doc__)
    p.add_argument("--policy", required=True, type=saved_policy, help="policy folder to start from")
    p.add_argument("--records", nargs="+", required=True, type=existing_path,
                   help="JSONL files / dataset folders")  # fmt: skip
    p.add_argument("--max-steps", type=positive_int, help="override sft.max_steps")
    p.add_argument("--epochs", type=positive_float, help="override sft.epochs")
    args = p.parse_args(argv)
    claim_stage_dir(args.out)
    from components.output_files import disk_errors
    from components.policy.model import load_policy
    from components.train.parallel import relaunch_as_ranks, world
    from components.train.sft import train_sft

    config = _section(args, "sft", max_steps=args.max_steps, epochs=args.epochs,
                      output_dir=str(args.out))  # fmt: skip
    code = relaunch_as_ranks(["train", "sft", *argv]) if config.deepspeed is not None else None
    if code is not None:
        return code
    records = read_records(args.records)  # a bad record is found before the model loads
    model, tokenizer = load_policy(args.policy)  # a damaged policy: nothing written
    with disk_errors(args.out, "the SFT checkpoint and its result"):
        start_stage_dir(args.out)
        result = train_sft(model, tokenizer, records, config)
        if world()[0] != 0:  # a torchrun rank other than 0 (DeepSpeed SFT)
            return 0
        return write_stage_result(args.out, {**dataclasses.asdict(result),
                                             "policy_dir": str(Path(result.checkpoint_dir))})  # fmt: skip


def _policy_and_samples(prog: str, doc: str | None, argv: list[str]):
    """The arguments of a stage that trains a saved policy on sampled episodes (rs, dpo),
    its output folder claimed."""
    p = stage_parser(prog, doc)
    p.add_argument("--policy", required=True, type=saved_policy)
    p.add_argument("--samples", nargs="+", required=True, type=existing_path)
    args = p.parse_args(argv)
    claim_stage_dir(args.out)
    return args


@stage("rejection_sampling", result=PolicyResult)
def main_rejection_sampling(argv: list[str]) -> int:
    """Keep the verified successes among sampled episodes and fine-tune on them."""
    args = _policy_and_samples("agentrl train rs", main_rejection_sampling.__doc__, argv)
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
    start_stage_dir(args.out)
    model, tokenizer = load_policy(args.policy)
    result = train_rejection_sampling(model, tokenizer, samples, config)
    if world()[0] != 0:  # a torchrun rank other than 0 (DeepSpeed SFT)
        return 0
    # The policy it trained ('' when it kept no episode: nothing was trained).
    policy = result.sft.checkpoint_dir if result.sft else ""
    return write_stage_result(args.out, {**dataclasses.asdict(result), "policy_dir": policy})


@stage("dpo", result=PolicyResult)
def main_dpo(argv: list[str]) -> int:
    """DPO on success-vs-failure pairs of the same task (whole multi-turn trajectories)."""
    args = _policy_and_samples("agentrl train dpo", main_dpo.__doc__, argv)
    from components.policy.model import load_policy
    from components.train.dpo import train_dpo, unverified_fields, verified_pairs
    from components.train.parallel import join_process_group, relaunch_as_ranks

    config = _section(args, "dpo", output_dir=str(args.out))
    # Only this verifier's verdicts pair up; what was dropped is said in the result.
    records = read_records(args.samples)
    pairs, quarantine = verified_pairs(records, config.pairs_per_task, config.seed)
    if not pairs:
        return write_stage_result(args.out, {"skipped": "no success/failure pair on any task",
                                             "num_pairs": 0, "policy_dir": args.policy,
                                             **unverified_fields(quarantine)})  # fmt: skip
    start_stage_dir(args.out)
    if (code := relaunch_as_ranks(["train", "dpo", *argv])) is not None:
        return code
    rank, _ = join_process_group()
    model, tokenizer = load_policy(args.policy)
    result = train_dpo(model, None, tokenizer, pairs, config, quarantine)
    if rank != 0:
        return 0
    return write_stage_result(args.out, {**dataclasses.asdict(result),
                                         "policy_dir": result.checkpoint_dir})  # fmt: skip


@stage("grpo", "rollout", "env", "sandbox", "runtime", result=PolicyResult)
def main_grpo(argv: list[str]) -> int:
    from components.train.grpo import main_grpo as run

    return run(argv)


@stage("ppo", "rollout", "env", "sandbox", "runtime", result=PolicyResult)
def main_ppo(argv: list[str]) -> int:
    from components.train.ppo import main_ppo as run

    return run(argv)
