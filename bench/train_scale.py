"""Training at size, measured here: DPO and GRPO update throughput with 1 vs 2 processes
(torchrun, gloo on CPU: train/parallel.py), and full vs LoRA SFT (trainable parameters, peak
memory). bench/train_throughput.py prints these as its `distributed` and `lora` tables;
every measurement runs in fresh processes started from there (this file is also their
entry point).

Update throughput: the same stored rollouts / preference pairs, the same micro-batches,
tokens of every rank per wall second of the update steps (a barrier on each side of the
clock). On a 2-core machine shared with other work, 2 processes can at best double the
rate; the ratio says how much of that the data-parallel path keeps.

Peak memory: CUDA's max_memory_allocated on a GPU; on the CPU the process's peak resident
set (ru_maxrss) minus its resident set before training (model built, data tokenized), so the
number is the training's own: activations, gradients and optimizer state. Short sequences
on a wide model by default, so that what LoRA saves (gradients and AdamW state of the base:
12 of full fine-tuning's 16 bytes per parameter in fp32) is not hidden by activations,
which LoRA does not reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def _run_worker(command: list[str], env: dict[str, str], out: Path) -> dict:
    """A worker process's JSON result; its stderr's tail in the error when it fails."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"bench worker failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _torchrun(nproc: int, args: list[str]) -> dict:
    out = Path(args[args.index("--out") + 1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_USE_CPU": "1", "PYTHONPATH": str(REPO)}
    # --standalone: torchrun picks a free port, so two runs at once on a shared machine
    # (another bench, a test) do not collide on a fixed one.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        __file__,
        *args,
    ]
    return _run_worker(command, env, out)


def distributed_rows(policy_dir: Path, rollouts, pairs, steps: int, root: Path) -> list[str]:
    """A table: GRPO and DPO update tokens/s with 1 and 2 processes."""
    data = root / "update-data.pkl"
    data.write_bytes(pickle.dumps({"rollouts": rollouts, "pairs": pairs}))
    lines = [
        "| update | 1 process tokens/s | 2 processes tokens/s | 2 / 1 | tokens per run |",
        "|---|---|---|---|---|",
    ]
    for stage in ("grpo", "dpo"):
        rates = []
        for nproc in (1, 2):
            args = [
                "--update",
                stage,
                "--policy",
                str(policy_dir),
                "--data",
                str(data),
                "--steps",
                str(steps),
                "--out",
                str(root / f"{stage}-{nproc}.json"),
            ]
            got = _torchrun(nproc, args)
            rates.append((got["tokens"], got["tokens"] / got["seconds"]))
        lines.append(
            f"| {stage.upper()} ({steps} steps) | {rates[0][1]:,.0f} | "
            f"{rates[1][1]:,.0f} | {rates[1][1] / rates[0][1]:.2f} | "
            f"{rates[0][0]:,} / {rates[1][0]:,} |"
        )
    return lines


def lora_rows(
    tokenizer_dir: Path, records_file: Path, policy: dict, max_seq_len: int, steps: int, root: Path
) -> list[str]:
    """A table: full vs LoRA SFT on the same model and data."""
    lines = [
        "| SFT | trainable parameters | of | weights + grads + AdamW (GiB) "
        "| peak memory (GiB, training's own) | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("full", "lora"):
        out = root / f"memory-{kind}.json"
        args = [
            sys.executable,
            __file__,
            "--memory",
            kind,
            "--tokenizer",
            str(tokenizer_dir),
            "--records",
            str(records_file),
            "--policy-json",
            json.dumps(policy),
            "--steps",
            str(steps),
            "--out",
            str(out),
            "--root",
            str(root / kind),
            "--max-seq-len",
            str(max_seq_len),
        ]
        got = _run_worker(args, {**os.environ, "PYTHONPATH": str(REPO)}, out)
        # fp32: 4 bytes per weight; 4 (gradient) + 8 (AdamW moments) per trainable one.
        state = (4 * got["total_parameters"] + 12 * got["trainable_parameters"]) / 2**30
        lines.append(
            f"| {kind} | {got['trainable_parameters']:,} | {got['total_parameters']:,} "
            f"| {state:.3f} | {got['peak_gib']:.3f} ({got['where']}) "
            f"| {got['tokens_per_s']:,.0f} |"
        )
    return lines


def _update_worker(args) -> dict:
    import torch

    from components.policy.model import load_policy
    from components.rollout.config import RolloutConfig
    from components.train.config import DPOConfig, GRPOConfig
    from components.train.dpo import _accumulate, _pair_batches, _score_reference
    from components.train.grpo.update import update_with as _update
    from components.train.parallel import barrier, join_process_group, make_stepper

    torch.set_num_threads(1)
    rank, world = join_process_group()
    model, tokenizer = load_policy(args.policy)
    data = pickle.loads(Path(args.data).read_bytes())
    device, pad = torch.device("cpu"), tokenizer.pad_token_id
    stepper = make_stepper(
        model, None, learning_rate=1e-5, weight_decay=0.0, max_grad_norm=1.0, micro_batch_size=4
    )
    if args.update == "dpo":
        config = DPOConfig(batch_size=4)
        _score_reference(model, data["pairs"], pad, config, device)
        batches = _pair_batches(data["pairs"], config.batch_size, 0)
    rollouts = data["rollouts"]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(rollouts))])
    barrier()
    t0, tokens = time.perf_counter(), 0
    for step in range(args.steps):
        if args.update == "grpo":
            out = _update(
                stepper,
                None,
                rollouts,
                advantages,
                GRPOConfig(micro_batch_size=4),
                RolloutConfig(),
                pad,
                device,
                step + 1,
            )
            tokens += out["update_tokens"]
        else:
            tokens += _accumulate(stepper, batches, pad, config, device)[3]
            stepper.step()
    barrier()
    return {"tokens": tokens, "seconds": time.perf_counter() - t0, "world": world, "rank": rank}


def _memory_worker(args) -> dict:
    import torch

    from components.policy.config import LoRAConfig, PolicyConfig
    from components.policy.model import build_policy
    from components.train.config import SFTConfig
    from components.train.sft import train_sft

    torch.set_num_threads(1)
    policy = PolicyConfig(**json.loads(args.policy_json), tokenizer_path=args.tokenizer)
    model, tokenizer = build_policy(policy)
    records = [json.loads(x) for x in Path(args.records).read_text().splitlines() if x.strip()]
    cuda = torch.cuda.is_available()
    config = SFTConfig(
        max_steps=args.steps,
        batch_size=2,
        max_seq_len=args.max_seq_len,
        pad_to_multiple_of=0,
        output_dir=args.root,
        bf16=cuda,
        lora=LoRAConfig() if args.memory == "lora" else None,
    )
    baseline = _rss_gib()
    if cuda:
        model.cuda()
        torch.cuda.reset_peak_memory_stats()
    result = train_sft(model, tokenizer, records, config)
    if cuda:
        peak, where = torch.cuda.max_memory_allocated() / 2**30, "GPU allocated"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - baseline
        where = "CPU peak RSS - RSS before"
    return {
        **result.metrics,
        "peak_gib": peak,
        "where": where,
        "tokens_per_s": result.tokens_per_second,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--update", choices=["grpo", "dpo"])
    p.add_argument("--memory", choices=["full", "lora"])
    p.add_argument("--policy", default="")
    p.add_argument("--data", default="")
    p.add_argument("--tokenizer", default="")
    p.add_argument("--records", default="")
    p.add_argument("--policy-json", default="{}")
    p.add_argument("--root", default="")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    result = _update_worker(args) if args.update else _memory_worker(args)
    if result.get("rank", 0) == 0:
        Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
