"""Supervised fine-tuning on trajectories: a plain torch loop, top to bottom.

The loss is the cross-entropy of the assistant's own tokens (labels -100 everywhere else,
`data.sft_examples`), summed over a whole gradient-accumulation window and divided by that
window's label tokens, so long and short transcripts weigh per token whichever micro-batch
they land in. Only the positions that predict a label go through the output head
(`logits_to_keep`, the model's own forward): on agent transcripts most tokens are prompt and
tool output, and the head is a large share of a small model's forward (and of a real
model's memory: [T, 150k] logits). For Qwen/Llama-style models the head runs on exactly
those rows (`labelled_logits`); other models get their own forward with `logits_to_keep`.

Why not TRL's SFTTrainer any more (it was used through TRL 1.16 until this change):
- its compute_loss runs a fused head that also computes the entropy and top-1 accuracy of
  every token, and gathers both with a device sync, on every micro-batch; TRL has no switch
  to turn that off. Measured on the CPU preset, the TRL path ran at 0.42x a bare torch loop
  on the same data (bench/train_throughput.py; bench/results/ for this loop's ratio);
- the GPU machine the project targets has no TRL and no `datasets` (with pyarrow, too
  large to carry), so SFT must run without them (scripts/gpu_check.sh);
- everything else it gave us is a few lines here: the data order, schedule, optimizer and
  per-token loss normalisation are those of transformers' Trainer (a seeded permutation per
  epoch, data_seed + epoch as accelerate's seedable sampler draws it; AdamW without decay on
  biases and norms; the learning rate of each step logged before the scheduler steps), so
  the golden losses of tests/train/test_sft.py did not change.

`config.lora` set: the model is wrapped with PEFT adapters first (policy/lora.py) and the
saved policy is the adapter folder. `config.deepspeed` set: the same examples go through
`deepspeed_launch.train_sft_deepspeed` (deepspeed.initialize with the shipped ZeRO JSON).
Per-step loss, learning rate, grad norm and tokens/s are returned in SFTResult and, when a
tracking URI is configured, logged to MLflow. Resuming is out of scope.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from components.train.config import SFTConfig
from components.train.data import IGNORE_INDEX, collate, sft_examples
from components.train.sft_result import SFTResult


def train_sft(model, tokenizer, records: list[dict], config: SFTConfig) -> SFTResult:
    """Fine-tune `model` in place on the assistant tokens of `records`; save it to output_dir."""
    examples = sft_examples(records, tokenizer, config.max_seq_len)
    if not examples:
        raise ValueError("train_sft: no example with an assistant token (empty or all truncated)")
    from components.policy.lora import add_adapters, without_adapters

    model = add_adapters(model, config.lora) if config.lora else without_adapters(model)
    if config.deepspeed is not None:
        from components.train.deepspeed_launch import train_sft_deepspeed

        return train_sft_deepspeed(model, tokenizer, examples, config)

    import torch

    from components.policy.model import save_policy

    device = training_device(config.use_cpu)
    model.to(device).train()
    windows, total_steps = step_windows(len(examples), config)
    optimizer = adamw(model, config.learning_rate, config.weight_decay)
    scheduler = lr_schedule(optimizer, config.lr_scheduler, config.warmup_steps, total_steps)
    mlflow = _start_tracking(config, len(examples))
    curves: dict[str, list[float]] = {"loss": [], "learning_rate": [], "grad_norm": []}
    tokens = 0
    started = time.perf_counter()
    try:
        for step in range(1, total_steps + 1):
            batches = [collate([examples[i] for i in batch], tokenizer.pad_token_id,
                               config.pad_to_multiple_of) for batch in next(windows)]  # fmt: skip
            loss, seen = accumulate_sft(model, batches, device, config.bf16)
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad],
                config.max_grad_norm or float("inf"),
            )
            curves["learning_rate"].append(scheduler.get_last_lr()[0])  # this step's rate
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += seen
            curves["loss"].append(loss.item())  # the step's one device sync
            curves["grad_norm"].append(float(norm))
            if mlflow is not None and step % config.log_every == 0:
                rate = tokens / max(time.perf_counter() - started, 1e-9)
                row = {k: v[-1] for k, v in curves.items()}
                mlflow.log_metrics({**row, "tokens_per_s": rate, "tokens_seen": float(tokens)},
                                   step=step)  # fmt: skip
        seconds = time.perf_counter() - started
        checkpoint = save_policy(model, tokenizer, Path(config.output_dir) / "policy")
        if mlflow is not None:
            mlflow.log_metrics({"train_seconds": seconds, "train_tokens_per_s": tokens / seconds})
    finally:
        if mlflow is not None:
            mlflow.end_run()
    return SFTResult(
        losses=curves["loss"],
        learning_rates=curves["learning_rate"],
        grad_norms=curves["grad_norm"],
        steps=total_steps,
        tokens=tokens,
        train_seconds=seconds,
        tokens_per_second=tokens / max(seconds, 1e-9),
        checkpoint_dir=str(checkpoint),
        num_examples=len(examples),
        num_truncated=sum(e["truncated"] for e in examples),
        metrics={"device": device.type, **trainable_parameters(model)},
    )


# ---------------------------------------------------------------------------------------
# Shared pieces (also used by DPO, GRPO and the DeepSpeed path): plain functions.


def training_device(use_cpu: bool):
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not use_cpu else "cpu")


def step_windows(num_examples: int, config: SFTConfig):
    """(endless iterator of optimizer steps, each a list of micro-batches of example indices;
    the number of steps the run takes).

    Transformers' Trainer order: epoch e draws torch.randperm(n) from a generator seeded
    with seed + e, cuts it into batches of batch_size (the last one may be short), and
    groups grad_accum consecutive batches into one step (the last group of an epoch may be
    short). max_steps > 0 overrides epochs; epochs may be fractional.
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


def adamw(model, learning_rate: float, weight_decay: float):
    """AdamW as transformers' Trainer builds it: no decay on biases and norm weights (the
    1-D parameters), fused kernels; only trainable parameters (LoRA: the adapters)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.999), eps=1e-8,
                             fused=fused)  # fmt: skip


def lr_schedule(optimizer, name: str, warmup_steps: int, total_steps: int):
    """transformers' named schedule: linear / cosine after a linear warmup; "constant" is
    constant from the first step (as the Trainer has always run it: no warmup)."""
    from transformers import get_scheduler

    return get_scheduler(name, optimizer, warmup_steps, total_steps)


# Model types whose causal-LM forward is decoder -> output head and nothing else (no logit
# soft-capping or scaling): their head can run on the labelled positions alone.
PLAIN_HEAD = ("qwen2", "qwen3", "llama", "mistral", "phi3", "starcoder2")


def label_logits_positions(labels):
    """Positions t whose logits predict a label (labels[:, t + 1] != -100 in any row): a
    sorted 1-D tensor, for the model's `logits_to_keep`."""
    import torch

    keep = (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero().squeeze(-1)  # [K]
    return keep if keep.numel() else torch.zeros(1, dtype=torch.long, device=labels.device)


def labelled_logits(model, ids, attention_mask, labels):
    """(logits [N, V], targets [N]) of the N positions that predict a label. A plain-head
    model runs its head on exactly those rows of the decoder's output; any other model
    runs its own forward with `logits_to_keep` = the positions labelled in some row."""
    if model.config.model_type in PLAIN_HEAD:
        select = labels[:, 1:] != IGNORE_INDEX  # [B, T-1]; position t predicts token t + 1
        hidden = model.get_decoder()(
            input_ids=ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
        return model.get_output_embeddings()(hidden[:, :-1][select]), labels[:, 1:][select]
    keep = label_logits_positions(labels)  # [K]
    logits = model(input_ids=ids, attention_mask=attention_mask, logits_to_keep=keep,
                   use_cache=False).logits  # [B, K, V]  # fmt: skip
    return logits.flatten(0, 1), labels[:, keep + 1].flatten()  # [B*K, V], [B*K]


def sft_loss_sum(model, batch: dict, device, bf16: bool):
    """(summed cross-entropy of the labelled tokens, number of labelled tokens) of one
    micro-batch. Logits are computed at the labelled positions only."""
    import torch
    import torch.nn.functional as F

    ids = batch["input_ids"].to(device)
    labels = batch["labels"].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, targets = labelled_logits(model, ids, batch["attention_mask"].to(device), labels)
    loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (targets != IGNORE_INDEX).sum()


def accumulate_sft(model, batches: list[dict], device, bf16: bool, backward=None):
    """Forward and backward of one optimizer step's micro-batches: (the window's mean loss
    per labelled token, detached, on device; non-padding tokens seen). `backward` replaces
    `loss.backward()` (DeepSpeed's engine.backward)."""
    import torch

    num_items = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
    total = torch.zeros((), device=device)
    seen = 0
    for batch in batches:
        loss_sum, _ = sft_loss_sum(model, batch, device, bf16)
        loss = loss_sum / max(num_items, 1)
        (backward or torch.Tensor.backward)(loss)
        total += loss.detach()
        seen += int(batch["attention_mask"].sum())
    return total, seen


def trainable_parameters(model) -> dict:
    """{"trainable_parameters", "total_parameters"} of a model (LoRA: adapters vs all)."""
    params = list(model.parameters())
    return {
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "total_parameters": sum(p.numel() for p in params),
    }


def _start_tracking(config: SFTConfig, num_examples: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    if not config.mlflow_tracking_uri:
        return None
    import mlflow

    mlflow.set_tracking_uri(config.mlflow_tracking_uri)
    mlflow.set_experiment(config.mlflow_experiment)
    mlflow.start_run(run_name="sft")
    params = {k: v for k, v in vars(config).items() if k not in ("deepspeed", "lora")}
    mlflow.log_params({**params, "num_examples": num_examples})
    return mlflow
