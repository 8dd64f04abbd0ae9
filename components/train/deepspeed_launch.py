"""SFT through DeepSpeed ZeRO: `train_sft` with `SFTConfig.deepspeed` set comes here.

Launch one process per device with either launcher, e.g. on CPU (gloo):

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \
        -m components.train.deepspeed_launch --records expert.jsonl \
        --policy-config policy.json --sft-config sft.json --result result.json

The engine comes from `deepspeed.initialize` with the shipped JSON (configs/deepspeed/
zero{2,3}.json), its "auto" values filled from SFTConfig (`DeepSpeedConfig.load`). The JSON
asks for `torch_adam` (torch's AdamW): no C++ op to compile, and it runs on CPU and GPU.
Each rank takes its own slice of a seeded permutation of the examples; the loss of a
micro-batch is the mean over its assistant tokens (HF's causal-LM loss with -100 labels),
DeepSpeed averages over accumulation and ranks. The saved policy is gathered from the
ZeRO-3 shards on every rank and written by rank 0 with `save_policy`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from components.train.config import SFTConfig
from components.train.data import collate, sft_examples
from components.train.sft_result import SFTResult


def train_sft_deepspeed(model, tokenizer, examples: list[dict], config: SFTConfig) -> SFTResult:
    """Train on `examples` (data.sft_examples) under torch.distributed; returns an SFTResult."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    rank, world = dist.get_rank(), dist.get_world_size()
    per_step = config.batch_size * config.grad_accum * world  # sequences per optimizer step
    if config.max_steps > 0:
        total_steps = config.max_steps
    else:
        total_steps = max(1, int(config.epochs * len(examples) // per_step))
    torch.manual_seed(config.seed)
    engine, scheduler = _initialize(model, config, total_steps)
    engine.train()

    batches = _rank_batches(examples, config.batch_size, rank, world, config.seed)
    started = time.perf_counter()
    curves, tokens = _train_steps(engine, scheduler, batches, tokenizer.pad_token_id, config,
                                  total_steps, world)  # fmt: skip
    seconds = time.perf_counter() - started
    total_tokens = torch.tensor(float(tokens))
    dist.all_reduce(total_tokens)
    checkpoint = _save_gathered(engine, tokenizer, config, rank)
    return SFTResult(
        losses=curves["loss"],
        learning_rates=curves["learning_rate"],
        grad_norms=curves["grad_norm"],
        steps=total_steps,
        tokens=int(total_tokens.item()),
        train_seconds=seconds,
        tokens_per_second=total_tokens.item() / max(seconds, 1e-9),
        checkpoint_dir=str(checkpoint),
        num_examples=len(examples),
        num_truncated=sum(e["truncated"] for e in examples),
        metrics={"world_size": world, "zero_stage": config.deepspeed.zero_stage},
    )


def _initialize(model, config: SFTConfig, total_steps: int):
    """(engine, lr scheduler) from deepspeed.initialize with the ZeRO JSON filled from `config`."""
    import deepspeed
    from transformers import get_scheduler

    ds_config = config.deepspeed.load(
        micro_batch_size=config.batch_size,
        grad_accum=config.grad_accum,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        bf16=config.bf16,
    )
    engine, _, _, scheduler = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
        lr_scheduler=lambda opt: get_scheduler(
            config.lr_scheduler, opt, config.warmup_steps, total_steps
        ),
    )
    return engine, scheduler


def _rank_batches(examples: list[dict], batch_size: int, rank: int, world: int, seed: int):
    """Endless micro-batches of this rank: consecutive windows of batch_size * world indices
    of seeded permutations (the same on every rank), rank r taking every world-th of each."""
    rng = random.Random(seed)
    window_size = batch_size * world
    order: list[int] = []
    while True:
        if len(order) < window_size:
            permutation = list(range(len(examples)))
            rng.shuffle(permutation)
            order += permutation * -(-window_size // len(examples))
        window, order = order[:window_size], order[window_size:]
        yield [examples[i] for i in window[rank::world]]


def _train_steps(engine, scheduler, batches, pad_id: int, config: SFTConfig, total_steps: int,
                 world: int) -> tuple[dict[str, list[float]], int]:  # fmt: skip
    """`total_steps` optimizer steps of grad_accum micro-batches each: (per-step loss, learning
    rate and grad norm, non-padding tokens this rank saw)."""
    import torch
    import torch.distributed as dist

    curves: dict[str, list[float]] = {"loss": [], "learning_rate": [], "grad_norm": []}
    tokens = 0
    for _ in range(total_steps):
        step_loss = torch.zeros((), device=engine.device)
        for _ in range(config.grad_accum):
            tensors = collate(next(batches), pad_id, config.pad_to_multiple_of)
            tokens += int(tensors["attention_mask"].sum())
            out = engine(
                input_ids=tensors["input_ids"].to(engine.device),
                attention_mask=tensors["attention_mask"].to(engine.device),
                labels=tensors["labels"].to(engine.device),
            )
            engine.backward(out.loss)
            engine.step()  # steps the optimizer at the accumulation boundary only
            step_loss += out.loss.detach().float() / config.grad_accum
        dist.all_reduce(step_loss)
        curves["loss"].append(step_loss.item() / world)
        lr = scheduler.get_last_lr()[0] if scheduler is not None else config.learning_rate
        curves["learning_rate"].append(lr)
        norm = engine.get_global_grad_norm()
        curves["grad_norm"].append(float(norm) if norm is not None else float("nan"))
    return curves, tokens


def _save_gathered(engine, tokenizer, config: SFTConfig, rank: int) -> Path:
    """Write the policy from rank 0. ZeRO-3 keeps a shard of each parameter per rank: gather
    them (a collective, so every rank enters) and let rank 0 write the whole model."""
    import deepspeed
    import torch.distributed as dist

    from components.policy.model import save_policy

    checkpoint = Path(config.output_dir) / "policy"
    stage3 = config.deepspeed.zero_stage == 3
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage3):
        if rank == 0:
            save_policy(engine.module, tokenizer, checkpoint)
    dist.barrier()
    return checkpoint


def main(argv: list[str] | None = None) -> None:
    """Entry point for one launched process: build the policy, train, rank 0 writes --result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", required=True, help="trajectory records (JSONL)")
    parser.add_argument("--policy-config", required=True, help="PolicyConfig as JSON")
    parser.add_argument("--sft-config", required=True, help="SFTConfig as JSON (with deepspeed)")
    parser.add_argument("--result", default="", help="rank 0 writes the SFTResult here (JSON)")
    args = parser.parse_args(argv)

    import dataclasses

    import torch.distributed as dist

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy
    from components.typed_config import config_from_dict

    policy_config = config_from_dict(PolicyConfig, json.loads(Path(args.policy_config).read_text()))
    config = SFTConfig(**json.loads(Path(args.sft_config).read_text()))
    if config.deepspeed is None:
        raise SystemExit("--sft-config must set 'deepspeed' (e.g. {\"zero_stage\": 2})")
    lines = Path(args.records).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    model, tokenizer = build_policy(policy_config, records)
    examples = sft_examples(records, tokenizer, config.max_seq_len)
    if not examples:
        raise SystemExit("no example with an assistant token (empty or all truncated)")
    result = train_sft_deepspeed(model, tokenizer, examples, config)
    if dist.get_rank() == 0 and args.result:
        Path(args.result).write_text(json.dumps(dataclasses.asdict(result), indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
