"""Supervised fine-tuning on trajectories: a plain torch loop, top to bottom.

The loss is the cross-entropy of the assistant's own tokens (labels -100 everywhere else,
`data.sft_examples`), summed over a whole gradient-accumulation window and divided by that
window's label tokens, so long and short transcripts weigh per token whichever micro-batch
they land in. Only the positions that predict a label go through the output head
(`logits_to_keep`, the model's own forward): on agent transcripts most tokens are prompt and
tool output, and the head is a large share of a small model's forward (and of a real
model's memory: [T, 150k] logits). For Qwen/Llama-style models the head runs on exactly
those rows (`labelled_logits`); other models get their own forward with `logits_to_keep`.

Why not TRL's SFTTrainer: its compute_loss also computes the entropy and top-1 accuracy of
every token, with a device sync, on every micro-batch, and TRL has no switch to turn that
off (bench/train_throughput.py measures this loop against a bare one); and the GPU machine
the project targets has no TRL and no `datasets`. What it gave is a few lines here: the
data order, schedule, optimizer and per-token loss normalisation are those of transformers'
Trainer (a seeded permutation per epoch, seed + epoch; AdamW without decay on biases and
norms; the learning rate of each step logged before the scheduler steps).

`config.lora` set: the model is wrapped with PEFT adapters first (policy/lora.py) and the
saved policy is the adapter folder. The optimizer steps through parallel.Stepper, as DPO's
and GRPO's do: plain torch on one process, or with `config.deepspeed` a DeepSpeed ZeRO
engine on every torchrun rank, each rank training on its share of every window (the same
windows, the same per-window token normalisation).
Per-step loss, learning rate, grad norm and tokens/s are returned in SFTResult and, when a
tracking URI is configured, logged to MLflow. Resuming is out of scope.

`config.eval_fraction` > 0: a share of the records' tasks is held out whole
(`data.held_out_split`); every `eval_every` steps and at the last step the model, in eval mode
and without gradients, is scored on them with the training loss itself (`sft_loss_sum`: the
assistant's tokens, a mean per token). After `early_stopping_patience` evaluations in a row
that do not beat the best by `early_stopping_min_delta`, training stops; epochs / max_steps
stay the upper bound and set the schedule. The saved policy (and the model left in place) has
the weights of the best evaluation: a CPU copy of the trainable parameters is kept in memory
at each improvement (LoRA: the adapters only; full fine-tuning: the whole model, once more in
host memory) rather than written to disk, so an improvement costs a copy, not a checkpoint.
The weights before the first evaluation are never the result. Refused with DeepSpeed
(SFTConfig): its engine holds sharded or master copies of the weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from components.tracking import start_trainer_run
from components.train.config import SFTConfig
from components.train.data import IGNORE_INDEX, collate, held_out_split, sft_examples
from components.train.devices import adamw, lr_schedule, trainable_parameters, training_device
from components.train.parallel import (
    OptimizerSettings,
    all_sum,
    deal,
    join_process_group,
    make_stepper,
    save_gathered,
)
from components.train.sft_result import SFTResult


def train_sft(model, tokenizer, records: list[dict], config: SFTConfig) -> SFTResult:
    """Fine-tune `model` in place on the assistant tokens of `records`; save it to output_dir.
    With `config.deepspeed`, every torchrun rank calls this on the same records."""
    held_out_records: list[dict] = []
    if config.eval_fraction > 0:
        records, held_out_records = held_out_split(records, config.eval_fraction, config.seed)
    examples = sft_examples(records, tokenizer, config.max_seq_len)
    if not examples:
        raise ValueError("train_sft: no example with an assistant token (empty or all truncated)")
    held_out = _held_out(held_out_records, tokenizer, config)
    from components.policy.lora import add_adapters, without_adapters

    model = add_adapters(model, config.lora) if config.lora else without_adapters(model)
    if config.deepspeed is not None:
        import torch

        join_process_group()
        torch.manual_seed(config.seed)
    device = training_device(config.use_cpu)
    model.to(device).train()
    windows, total_steps = step_windows(len(examples), config)
    stepper = make_stepper(model, config.deepspeed, OptimizerSettings(
        learning_rate=config.learning_rate, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, micro_batch_size=config.batch_size,
        bf16=config.bf16, optimizer=adamw,
        scheduler=lambda opt: lr_schedule(opt, config.lr_scheduler, config.warmup_steps,
                                          total_steps),
    ))  # fmt: skip
    num_eval_examples = len(held_out.examples) if held_out else 0
    mlflow = (
        _start_tracking(config, len(examples), num_eval_examples) if stepper.rank == 0 else None
    )
    try:
        batches = _collated_windows(examples, windows, tokenizer.pad_token_id, config)
        curves, tokens, seconds = _train_steps(stepper, batches, total_steps, device, config,
                                               mlflow, held_out)  # fmt: skip
        if held_out is not None:
            held_out.restore_best(stepper.model)
        checkpoint = save_gathered(stepper, tokenizer, Path(config.output_dir) / "policy")
        if mlflow is not None:
            mlflow.log_metrics({"train_seconds": seconds, "train_tokens_per_s": tokens / seconds,
                                **(held_out.summary() if held_out else {})})  # fmt: skip
    finally:
        if mlflow is not None:
            mlflow.end_run()
    metrics = {"device": device.type, **trainable_parameters(stepper.model)}
    if config.deepspeed is not None:
        metrics = {"device": device.type, "world_size": stepper.world,
                   "zero_stage": config.deepspeed.zero_stage}  # fmt: skip
    return SFTResult(
        losses=curves["loss"],
        learning_rates=curves["learning_rate"],
        grad_norms=curves["grad_norm"],
        steps=len(curves["loss"]),
        tokens=tokens,
        train_seconds=seconds,
        tokens_per_second=tokens / max(seconds, 1e-9),
        checkpoint_dir=str(checkpoint),
        num_examples=len(examples),
        num_truncated=sum(e["truncated"] for e in examples),
        metrics=metrics,
        num_eval_examples=num_eval_examples,
        eval_steps=held_out.steps if held_out else [],
        eval_losses=held_out.losses if held_out else [],
        best_step=held_out.best_step if held_out else None,
        best_eval_loss=held_out.best_loss if held_out else None,
        stopped_early=bool(held_out and held_out.stopped_early),
    )


@dataclass
class HeldOut:
    """The held-out batches, the evaluations so far and the best weights: a CPU copy of the
    trainable parameters at the lowest held-out loss (see the module docstring)."""

    examples: list[dict]
    batches: list[dict]
    every: int
    patience: int
    min_delta: float
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    best_step: int | None = None
    best_loss: float | None = None
    best_weights: dict = field(default_factory=dict)
    stopped_early: bool = False

    def due(self, step: int, total_steps: int) -> bool:
        return step % self.every == 0 or step == total_steps

    def record(self, step: int, loss: float, model) -> bool:
        """Note the evaluation at `step`; keep the weights if it improved on the best by at
        least min_delta. Returns whether patience has run out."""
        self.steps.append(step)
        self.losses.append(loss)
        if self.best_loss is None or loss < self.best_loss - self.min_delta:
            self.best_step, self.best_loss = step, loss
            self.best_weights = {name: p.detach().to("cpu", copy=True)
                                 for name, p in model.named_parameters() if p.requires_grad}  # fmt: skip
            return False
        evaluations_since_best = len(self.steps) - 1 - self.steps.index(self.best_step)
        return evaluations_since_best >= self.patience

    def restore_best(self, model) -> None:
        """Put the best evaluation's weights back into `model`."""
        import torch

        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in self.best_weights:
                    p.copy_(self.best_weights[name])

    def summary(self) -> dict[str, float]:
        return {"best_step": float(self.best_step), "best_eval_loss": self.best_loss,
                "stopped_early": float(self.stopped_early)}  # fmt: skip


def _held_out(records: list[dict], tokenizer, config: SFTConfig) -> HeldOut | None:
    """The held-out examples in fixed batches of batch_size; None without a held-out split."""
    if not records:
        return None
    examples = sft_examples(records, tokenizer, config.max_seq_len)
    if not examples:
        raise ValueError("train_sft: no held-out example with an assistant token")
    batches = [collate(examples[i : i + config.batch_size], tokenizer.pad_token_id,
                       config.pad_to_multiple_of)
               for i in range(0, len(examples), config.batch_size)]  # fmt: skip
    return HeldOut(examples, batches, config.eval_every, config.early_stopping_patience,
                   config.early_stopping_min_delta)  # fmt: skip


def held_out_loss(model, batches: list[dict], device, bf16: bool) -> float:
    """Mean cross-entropy per assistant token over `batches`: the training loss
    (`sft_loss_sum`), in eval mode (no dropout) and without gradients."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss_sum, labelled = sft_loss_sum(model, batch, device, bf16)
            total += float(loss_sum)
            count += int(labelled)
    model.train()
    return total / max(count, 1)


def _collated_windows(examples: list[dict], windows, pad_id: int, config: SFTConfig):
    """Endless optimizer steps, each its micro-batches collated (`step_windows`' order)."""
    for window in windows:
        yield [collate([examples[i] for i in batch], pad_id, config.pad_to_multiple_of)
               for batch in window]  # fmt: skip


def _train_steps(stepper, batches, total_steps: int, device, config: SFTConfig, mlflow,
                 held_out: HeldOut | None) -> tuple[dict[str, list[float]], int, float]:  # fmt: skip
    """`total_steps` optimizer steps, fewer when `held_out`'s patience runs out: (per-step
    loss, learning rate and grad norm; non-padding tokens seen over all ranks; seconds)."""
    curves: dict[str, list[float]] = {"loss": [], "learning_rate": [], "grad_norm": []}
    tokens = 0
    started = time.perf_counter()
    for step in range(1, total_steps + 1):
        loss, seen = accumulate_sft(stepper, next(batches), device, config.bf16)
        curves["learning_rate"].append(stepper.learning_rate())  # this step's rate
        norm = stepper.step()
        totals = all_sum({"loss": loss.item(), "tokens": seen})  # the step's one device sync
        tokens += int(totals["tokens"])
        curves["loss"].append(totals["loss"])
        curves["grad_norm"].append(norm)
        if mlflow is not None and step % config.log_every == 0:
            rate = tokens / max(time.perf_counter() - started, 1e-9)
            row = {k: v[-1] for k, v in curves.items()}
            mlflow.log_metrics({**row, "tokens_per_s": rate, "tokens_seen": float(tokens)},
                               step=step)  # fmt: skip
        if held_out is not None and held_out.due(step, total_steps):
            eval_loss = held_out_loss(stepper.model, held_out.batches, device, config.bf16)
            if mlflow is not None:
                mlflow.log_metric("eval_loss", eval_loss, step=step)
            if held_out.record(step, eval_loss, stepper.model) and step < total_steps:
                held_out.stopped_early = True
                break
    return curves, tokens, time.perf_counter() - started


def step_windows(num_examples: int, config: SFTConfig):
    """(endless iterator of optimizer steps, each a list of micro-batches of example indices;
    the number of steps the run takes).

    Transformers' Trainer order: epoch e draws torch.randperm(n) from a generator seeded
    with seed + e, cuts it into batches of batch_size (the last one may be short), and
    groups grad_accum consecutive batches into one step (the last group of an epoch may be
    short). max_steps > 0 overrides epochs; epochs may be fractional. Under torchrun every
    rank draws the same windows and trains on its share of each (`accumulate_sft`).
    """
    import torch

    batches_per_epoch = math.ceil(num_examples / config.batch_size)
    steps_per_epoch = max(math.ceil(batches_per_epoch / config.grad_accum), 1)
    total = config.max_steps if config.max_steps > 0 else math.ceil(config.epochs * steps_per_epoch)

    def windows():
        epoch = 0
        while True:
            generator = torch.Generator().manual_seed(config.seed + epoch)
            order = torch.randperm(num_examples, generator=generator).tolist()
            batches = [order[i : i + config.batch_size]
                       for i in range(0, num_examples, config.batch_size)]  # fmt: skip
            for i in range(0, len(batches), config.grad_accum):
                yield batches[i : i + config.grad_accum]
            epoch += 1

    return windows(), total


# Model types whose causal-LM forward is decoder -> output head and nothing else (no logit
# soft-capping or scaling): their head can run on the labelled positions alone.
PLAIN_HEAD = ("qwen2", "qwen3", "llama", "mistral", "phi3", "starcoder2")


def label_logits_positions(labels):
    """Positions t whose logits predict a label (labels[:, t + 1] != -100 in any row): a
    sorted 1-D tensor, for the model's `logits_to_keep`."""
    import torch

    keep = (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero().squeeze(-1)  # [K]
    return keep if keep.numel() else torch.zeros(1, dtype=torch.long, device=labels.device)


def labelled_logits(model, ids, attention_mask, labels, forward=None):
    """(logits [N, V], targets [N]) of the N positions that predict a label. A plain-head
    model runs its head on exactly those rows of the decoder's output; any other model
    runs its own forward with `logits_to_keep` = the positions labelled in some row.
    `forward`: what runs that forward when not the model itself (a DeepSpeed engine, which
    then always runs it: see accumulate_sft)."""
    if forward is None and model.config.model_type in PLAIN_HEAD:
        select = labels[:, 1:] != IGNORE_INDEX  # [B, T-1]; position t predicts token t + 1
        hidden = model.get_decoder()(
            input_ids=ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
        return model.get_output_embeddings()(hidden[:, :-1][select]), labels[:, 1:][select]
    keep = label_logits_positions(labels)  # [K]
    logits = (forward or model)(input_ids=ids, attention_mask=attention_mask,
                                logits_to_keep=keep, use_cache=False).logits  # [B, K, V]  # fmt: skip
    return logits.flatten(0, 1), labels[:, keep + 1].flatten()  # [B*K, V], [B*K]


def sft_loss_sum(model, batch: dict, device, bf16: bool, forward=None):
    """(summed cross-entropy of the labelled tokens, number of labelled tokens) of one
    micro-batch. Logits are computed at the labelled positions only."""
    import torch
    import torch.nn.functional as F

    ids = batch["input_ids"].to(device)
    labels = batch["labels"].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, targets = labelled_logits(model, ids, batch["attention_mask"].to(device), labels,
                                          forward)  # fmt: skip
    loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (targets != IGNORE_INDEX).sum()


def accumulate_sft(stepper, batches: list[dict], device, bf16: bool):
    """Forward and backward of one optimizer step's micro-batches, this rank's share of them
    (`deal`): (the window's loss per labelled token over this rank's share, detached, on
    device; non-padding tokens this rank saw). Every micro-batch's loss is divided by the
    whole window's labelled tokens, so each token weighs the same wherever it lands."""
    import torch

    num_items = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
    mine = deal(batches, stepper.rank, stepper.world)
    total = torch.zeros((), device=device)
    seen = 0
    for k, (batch, weight) in enumerate(mine):
        # Under DeepSpeed the forward runs through the engine (`stepper.module`): ZeRO-3
        # gathers and releases parameters around the engine's forward, and the tied head
        # called on the inner model lost the embedding's share of the gradient.
        engine = stepper.module if stepper.engine is not None else None
        loss_sum, _ = sft_loss_sum(stepper.model, batch, device, bf16, engine)
        loss = loss_sum / max(num_items, 1)
        # The engines average gradients over the ranks: scale back up to the sum.
        stepper.backward(loss * (weight * stepper.world), last=k == len(mine) - 1)
        total += loss.detach() * weight
        seen += int(batch["attention_mask"].sum()) if weight else 0
    return total, seen


def _start_tracking(config: SFTConfig, num_examples: int, num_eval_examples: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    params = {k: v for k, v in vars(config).items() if k not in ("deepspeed", "lora")}
    return start_trainer_run(config.mlflow_tracking_uri, config.mlflow_experiment, "sft",
                             {**params, "num_examples": num_examples,
                              "num_eval_examples": num_eval_examples})  # fmt: skip
