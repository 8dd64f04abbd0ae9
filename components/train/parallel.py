"""The one stepper of every training stage (SFT, DPO, GRPO), on one process or one per
device under torchrun.

Launched by `torch.distributed.run` (WORLD_SIZE in the environment), a stage joins the
process group (`join_process_group`) and every rank holds the same batch (GRPO: the
iteration's episodes, gathered from the ranks that sampled them; DPO and SFT: the same
seeded stream of pairs or examples). Each optimizer step's items are dealt out round-robin (`deal`), each rank's loss is
normalised by the *whole* step's count (tokens or sequences) and multiplied by the world
size, because both engines below average gradients over ranks: the averaged gradient is
then exactly the one-process gradient of the same batch (tests/train/test_parallel.py,
within float32 summation order).

Two engines apply the gradients (`make_stepper`):
- DeepSpeed ZeRO-2/3 (`deepspeed` set in the stage's config): deepspeed.initialize with the
  shipped JSON (configs/deepspeed/); the accumulation boundary is set by hand at each
  step's last micro-batch, because a GRPO minibatch's micro-batch count varies;
- plain torch (no `deepspeed`): gradients all-reduced (mean) before clipping and AdamW,
  i.e. DDP's arithmetic without its bucketing; also the one-process path (world 1).

Every rank runs the same number of forward passes (ZeRO-3 gathers each layer's parameters
collectively in forward): a rank with fewer items runs zero-weighted passes (`deal` pads).
Why not FSDP2 / accelerate: the k8s trainer Job launches DeepSpeed with these JSON files;
one engine for every stage keeps one set of checkpoints, configs and launch commands. The target single-GPU machine has no DeepSpeed: there, world 1
uses the plain path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from components.train.devices import plain_adamw


def join_process_group() -> tuple[int, int]:
    """(rank, world size): joins torchrun's process group when WORLD_SIZE > 1 (gloo on CPU,
    nccl on CUDA; each rank on its LOCAL_RANK device), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    cuda = torch.cuda.is_available() and os.environ.get("AGENTRL_USE_CPU", "") != "1"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size()


def relaunch_as_ranks(cli_argv: list[str]) -> int | None:
    """A stage started as one process on a multi-device machine runs itself again as
    AGENTRL_NPROC_PER_NODE torchrun ranks (the launcher sets it from the preset's
    launcher.env, e.g. on an 8-GPU pod). Returns their exit code, or None when this process
    trains itself (a rank already, or no such setting)."""
    import subprocess
    import sys

    count = int(os.environ.get("AGENTRL_NPROC_PER_NODE") or "1")
    if count <= 1 or "LOCAL_RANK" in os.environ:
        return None
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={count}", "-m", "components.cli", *cli_argv]  # fmt: skip
    return subprocess.run(command, check=False).returncode


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside a process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def deal(items: list, rank: int, world: int) -> list[tuple[object, float]]:
    """This rank's share of a step's items, round-robin, as (item, weight) pairs; padded
    with zero-weight repeats of an item to the largest share so that every rank runs the
    same number of forward passes."""
    mine = [(item, 1.0) for item in items[rank::world]]
    longest = -(-len(items) // world)
    filler = items[rank % len(items)] if items else None
    return mine + [(filler, 0.0)] * (longest - len(mine))


def all_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum each value over the ranks (the values of one process when there is no group)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(tensor)
    return dict(zip(keys, tensor.tolist(), strict=True))


def all_gather_list(mine: list) -> list[list]:
    """Every rank's list, in rank order (pickled objects; CPU objects only)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def score_shares(count: int, chunk_size: int, score) -> list:
    """The values of items 0..count-1 on every rank, each rank computing its share (`deal`)
    without gradients, `chunk_size` items a call: score(indices) -> one CPU value per index
    (zero-weight fillers are scored too, so the ranks' forwards stay in step, then dropped);
    the ranks exchange their values."""
    rank, size = world()
    mine = deal(list(range(count)), rank, size)
    out: dict[int, object] = {}
    with torch.no_grad():
        for start in range(0, len(mine), chunk_size):
            chunk = mine[start : start + chunk_size]
            values = score([i for i, _ in chunk])
            for (i, weight), value in zip(chunk, values, strict=True):
                if weight:
                    out[i] = value
    for part in all_gather_list(sorted(out.items(), key=lambda kv: kv[0])) if size > 1 else []:
        out.update(part)
    return [out[i] for i in range(count)]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@dataclass
class Stepper:
    """How a stage's losses become an optimizer step. `module` is what forward runs on
    (the DeepSpeed engine, or the model itself); `model` the model inside it."""

    module: object
    model: object
    optimizer: object
    rank: int = 0
    world: int = 1
    max_grad_norm: float = 0.0
    engine: object = None  # the DeepSpeed engine, when there is one
    zero_stage: int = 0
    scheduler: object = None  # a learning-rate schedule the step advances

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch's loss; `last`: the step's last micro-batch."""
        if self.engine is None:
            loss.backward()
            return
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> float:
        """Average gradients over ranks, clip, step, zero them; returns the global grad norm
        (before clipping)."""
        if self.engine is not None:
            self.engine.step()
            norm = self.engine.get_global_grad_norm()
            return float(norm) if norm is not None else float("nan")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.world > 1:
            import torch.distributed as dist

            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= self.world
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or float("inf"))
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def learning_rate(self) -> float:
        """The rate the next step will use."""
        if self.engine is not None:
            return self.engine.get_lr()[0]
        if self.scheduler is not None:
            return self.scheduler.get_last_lr()[0]
        return self.optimizer.param_groups[0]["lr"]

    def gathered(self):
        """A context in which every parameter is whole on every rank (ZeRO-3 shards them):
        for sampling and saving. A collective: every rank must enter it."""
        import contextlib

        if self.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()))


@dataclass(frozen=True)
class OptimizerSettings:
    """How a stage's optimizer steps: AdamW's rate and decay, the clip, the micro-batch size
    DeepSpeed is told, bf16, and the learning-rate schedule (`scheduler`: optimizer -> a
    torch scheduler, advanced once per optimizer step). `optimizer` builds the plain path's
    optimizer from (model, learning_rate, weight_decay); DeepSpeed builds its own from the
    JSON."""

    learning_rate: float
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0
    micro_batch_size: int = 1
    bf16: bool = False
    scheduler: Callable | None = None
    optimizer: Callable = plain_adamw


def make_stepper(model, deepspeed_config, settings: OptimizerSettings | None = None,
                 **fields) -> Stepper:  # fmt: skip
    """The Stepper for `model` in this process group: DeepSpeed when `deepspeed_config`
    (a train.config.DeepSpeedConfig) is set, else `settings.optimizer` over the trainable
    parameters (gradients all-reduced when world > 1). `fields`: the OptimizerSettings'
    fields, when no `settings` is given."""
    settings = settings or OptimizerSettings(**fields)
    rank, size = world()
    if deepspeed_config is None:
        optimizer = settings.optimizer(model, settings.learning_rate, settings.weight_decay)
        scheduler = settings.scheduler(optimizer) if settings.scheduler is not None else None
        return Stepper(model, model, optimizer, rank, size, settings.max_grad_norm,
                       scheduler=scheduler)  # fmt: skip
    import deepspeed

    # bf16 parameters (PolicyConfig.dtype) train with DeepSpeed's fp32 master weights.
    bf16 = settings.bf16 or any(p.dtype == torch.bfloat16 for p in model.parameters())
    # One micro-batch per engine step: Stepper.backward sets the accumulation boundary.
    ds_config = deepspeed_config.load(
        micro_batch_size=settings.micro_batch_size, grad_accum=1, lr=settings.learning_rate,
        weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm, bf16=bf16,
    )  # fmt: skip
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config, lr_scheduler=settings.scheduler,
    )  # fmt: skip
    # The engine steps its scheduler itself (engine.step).
    return Stepper(engine, engine.module, optimizer, rank, size, settings.max_grad_norm, engine,
                   deepspeed_config.zero_stage)  # fmt: skip


def save_gathered(stepper: Stepper, tokenizer, directory) -> Path:
    """Rank 0 writes the policy (whole: ZeRO-3 shards are gathered on every rank first)."""
    from components.policy.model import save_policy

    with stepper.gathered():
        if stepper.rank == 0:
            save_policy(stepper.model, tokenizer, directory)
    barrier()
    return Path(directory)
