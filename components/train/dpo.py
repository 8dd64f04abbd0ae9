"""DPO on whole multi-turn trajectories: a plain torch loop, top to bottom.

Why not TRL's DPOTrainer: in TRL 1.16 a pre-tokenized example is `prompt_ids` + `chosen_ids`
+ `rejected_ids`, and its collator builds the loss mask as [0] * prompt + [1] * completion.
Our chosen and rejected transcripts share only the task prompt; after it, the assistant's
turns interleave with tool observations the model did not write. DPOTrainer would score
the observations as if the policy had generated them (a preference for the environment's
output), and has no per-token mask to say otherwise. So the log-probabilities here are
`losses.sequence_logprobs` summed over the assistant mask only, and the loss is
`losses.dpo_loss` (cross-checked against TRL on identical inputs in tests/train/test_losses.py).

The reference is frozen: its log-probs are computed once, up front, and reused every epoch.
With `config.lora` the policy trains adapters and the reference is the same model with its
adapters off (policy/lora.py): no second copy of the weights.
Note: the IPO variant gets summed (not length-normalised) log-probs here; see dpo_loss.

Only verdicts this pipeline's verifier signed pair (`verified_pairs`, components/verifier/
provenance.py): a record with a claimed, unsigned, tampered or stale verdict is on neither
side; the result counts them (`unverified`, `unverified_reasons`, a metric each in MLflow)
and lists each with its reason (`quarantine`).
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from components.tracking import start_trainer_run
from components.train.config import DPOConfig
from components.train.data import (
    collate,
    is_scored,
    preference_pairs,
    trajectory_tokens,
)
from components.train.devices import trainable_parameters, training_device, warmup_then_constant
from components.train.parallel import (
    OptimizerSettings,
    all_gather_list,
    all_sum,
    deal,
    make_stepper,
    save_gathered,
    score_shares,
)
from components.verifier.provenance import claims, split_verified


@dataclass
class DPOResult:
    losses: list[float]  # one per optimizer step
    chosen_rewards: list[float]  # mean beta * (log pi - log ref) of the chosen, per step
    rejected_rewards: list[float]
    margins: list[float]  # chosen - rejected reward, per step
    accuracies: list[float]  # share of pairs with chosen reward > rejected reward, per step
    steps: int
    num_pairs: int
    tokens_per_second: float
    train_seconds: float
    checkpoint_dir: str
    metrics: dict = field(default_factory=dict)
    unverified: int = 0  # records dropped: their verdict is not this verifier's (module doc)
    unverified_reasons: dict[str, int] = field(default_factory=dict)  # {"foreign": 1, ...}
    quarantine: list[dict] = field(default_factory=list)  # {"id", "task_id", "reason"}


def verified_pairs(
    records: Iterable[dict], pairs_per_task: int, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """(DPO's pairs: data.preference_pairs of the verified records, the records dropped as
    unverified: [{"id", "task_id", "reason"}] in input order). Infrastructure failures
    (no reward, no claim) are neither: they say nothing about the policy."""
    scored = [r for r in records if is_scored(r) or claims(r)]
    verified, quarantine = split_verified(scored, "dpo pairs")
    return preference_pairs(verified, pairs_per_task, seed), quarantine


def unverified_fields(quarantine: list[dict]) -> dict:
    """What a DPO result.json says of the records it dropped (also when it trained none)."""
    reasons = Counter(q["reason"].split(":")[0] for q in quarantine)
    return {
        "unverified": len(quarantine),
        "unverified_reasons": dict(sorted(reasons.items())),
        "quarantine": list(quarantine),
    }


def _pair_tokens(pair: dict, tokenizer, max_seq_len: int) -> dict | None:
    out = {}
    for side in ("chosen", "rejected"):
        tokens = trajectory_tokens(tokenizer, pair[side])
        ids, mask = tokens["input_ids"][:max_seq_len], tokens["assistant_mask"][:max_seq_len]
        if not any(mask):
            return None  # truncation left nothing of the assistant to compare
        out[side] = {"input_ids": ids, "assistant_mask": mask}
    return out


def _sequence_logps(model, examples: list[dict], pad_id: int, config: DPOConfig, device):
    """Summed assistant-token log-probs of each example: [len(examples)]."""
    import torch

    from components.train.losses import sequence_logprobs

    batch = {
        k: v.to(device) for k, v in collate(examples, pad_id, config.pad_to_multiple_of).items()
    }
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return sequence_logprobs(logits, batch["input_ids"], batch["assistant_mask"])  # [N]


def train_dpo(
    policy,
    reference,
    tokenizer,
    pairs: list[dict],
    config: DPOConfig,
    quarantine: list[dict] | None = None,
) -> DPOResult:
    """Train `policy` in place on (chosen, rejected) trajectory pairs; save it to output_dir.

    `pairs`, `quarantine`: from `verified_pairs` (the quarantine is only reported). `reference`:
    a frozen model, or None for a frozen copy of `policy` as it is now (config.reference_path,
    if set, is loaded instead; with `config.lora`, the base itself with its adapters off).
    Under torchrun every rank holds the pairs and trains on its share of each batch.
    """
    import torch
    from torch.optim.lr_scheduler import LambdaLR

    from components.policy.lora import add_adapters, reference_or_base, without_adapters
    from components.policy.model import load_policy

    device = training_device(config.use_cpu)
    torch.manual_seed(config.seed)
    policy = add_adapters(policy, config.lora) if config.lora else without_adapters(policy)
    if reference is None and config.reference_path:
        reference = load_policy(config.reference_path)[0]
    elif reference is None and not config.lora:
        reference = copy.deepcopy(policy)
    if reference is not None:
        reference.to(device).eval().requires_grad_(False)
    policy.to(device).train()
    pad_id = tokenizer.pad_token_id
    examples = [t for t in (_pair_tokens(p, tokenizer, config.max_seq_len) for p in pairs) if t]
    if not examples:
        raise ValueError("train_dpo: no usable pair (none given, or all truncated)")
    with reference_or_base(policy, reference) as frozen:
        _score_reference(frozen, examples, pad_id, config, device)
    stepper = make_stepper(policy, config.deepspeed, OptimizerSettings(
        learning_rate=config.learning_rate, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, micro_batch_size=config.batch_size,
        bf16=config.bf16,
        # Linear warmup, then constant: DPO runs are short and usually stopped by evaluation.
        scheduler=lambda opt: LambdaLR(opt, warmup_then_constant(config.warmup_steps)),
    ))  # fmt: skip
    mlflow = _start_tracking(config, len(examples)) if stepper.rank == 0 else None
    batches = _pair_batches(examples, config.batch_size, config.seed)
    history: dict[str, list[float]] = {k: [] for k in ("loss", "chosen", "rejected", "acc")}
    tokens_seen, started = 0, time.perf_counter()
    try:
        for step in range(1, config.max_steps + 1):
            rate = stepper.learning_rate()
            loss, chosen, rejected, tokens = _accumulate(stepper, batches, pad_id, config, device)
            stepper.step()
            tokens_seen += tokens
            history["loss"].append(loss)
            history["chosen"].append(chosen.mean().item())
            history["rejected"].append(rejected.mean().item())
            history["acc"].append((chosen > rejected).float().mean().item())
            if mlflow is not None and step % config.log_every == 0:
                speed = tokens_seen / max(time.perf_counter() - started, 1e-9)
                _log_step(mlflow, history, rate, speed, step)
        seconds = time.perf_counter() - started
        checkpoint = save_gathered(stepper, tokenizer, Path(config.output_dir) / "policy")
    finally:
        if mlflow is not None:
            mlflow.end_run()
    return DPOResult(
        losses=history["loss"],
        chosen_rewards=history["chosen"],
        rejected_rewards=history["rejected"],
        margins=[c - r for c, r in zip(history["chosen"], history["rejected"], strict=True)],
        accuracies=history["acc"],
        steps=config.max_steps,
        num_pairs=len(examples),
        tokens_per_second=tokens_seen / max(seconds, 1e-9),
        train_seconds=seconds,
        checkpoint_dir=str(checkpoint),
        metrics={"world_size": stepper.world, **trainable_parameters(policy)},
        **unverified_fields(quarantine or []),
    )


def _score_reference(reference, examples: list[dict], pad_id: int, config: DPOConfig, device):
    """Store each pair's reference log-probs in it (ref_chosen, ref_rejected): the reference
    never changes, so every pair is scored once (each rank scores its share; the ranks
    exchange them)."""

    def score(indices: list[int]) -> list[tuple]:
        seqs = [examples[i]["chosen"] for i in indices] + [examples[i]["rejected"] for i in indices]
        ref = _sequence_logps(reference, seqs, pad_id, config, device).float().cpu()
        return [(ref[k], ref[len(indices) + k]) for k in range(len(indices))]

    scored = score_shares(len(examples), config.batch_size, score)
    for ex, (chosen, rejected) in zip(examples, scored, strict=True):
        ex["ref_chosen"], ex["ref_rejected"] = chosen, rejected


def _pair_batches(examples: list[dict], batch_size: int, seed: int):
    """Endless batches of `batch_size` pairs from epochs of seeded permutations (a batch may
    straddle two epochs)."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        batch = []
        while len(batch) < batch_size:
            if not order:  # next epoch: a fresh seeded permutation
                order = list(range(len(examples)))
                rng.shuffle(order)
            batch.append(examples[order.pop()])
        yield batch


def _accumulate(stepper, batches, pad_id: int, config: DPOConfig, device):
    """Forward and backward of one optimizer step's grad_accum micro-batches, this rank's
    share of each: (mean loss, chosen rewards, rejected rewards, tokens processed), all
    over every rank's pairs."""
    import torch

    from components.train.losses import dpo_loss

    step_loss, chosen, rejected, tokens = 0.0, [], [], 0
    for k in range(config.grad_accum):
        batch = next(batches)  # the same on every rank
        mine = deal(batch, stepper.rank, stepper.world)
        real = [ex for ex, weight in mine if weight]
        pairs = real or [mine[0][0]]  # a zero-weight pass keeps the ranks' forwards in step
        seqs = [ex["chosen"] for ex in pairs] + [ex["rejected"] for ex in pairs]
        tokens += sum(len(s["input_ids"]) for s in seqs) if real else 0
        # Chosen and rejected in one forward: one [2B, T] batch.
        logps = _sequence_logps(stepper.module, seqs, pad_id, config, device).float()  # [2B]
        n = len(pairs)
        loss, c_rewards, r_rewards = dpo_loss(
            logps[:n],
            logps[n:],
            torch.stack([ex["ref_chosen"] for ex in pairs]).to(device),
            torch.stack([ex["ref_rejected"] for ex in pairs]).to(device),
            beta=config.beta,
            label_smoothing=config.label_smoothing,
            loss_type=config.loss_type,
        )
        share = len(real) / len(batch) / config.grad_accum
        # The engines average gradients over the ranks: scale back up to the sum.
        stepper.backward(loss * share * stepper.world, last=k == config.grad_accum - 1)
        step_loss += loss.item() * share
        chosen.append(c_rewards.cpu()[: len(real)])
        rejected.append(r_rewards.cpu()[: len(real)])
    totals = all_sum({"loss": step_loss, "tokens": tokens})
    chosen = torch.cat([t for part in all_gather_list(chosen) for t in part])
    rejected = torch.cat([t for part in all_gather_list(rejected) for t in part])
    return totals["loss"], chosen, rejected, int(totals["tokens"])


def _start_tracking(config: DPOConfig, num_pairs: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    params = {k: v for k, v in vars(config).items() if k not in ("lora", "deepspeed")}
    return start_trainer_run(config.mlflow_tracking_uri, config.mlflow_experiment, "dpo",
                             {**params, "lora": config.lora is not None, "num_pairs": num_pairs})  # fmt: skip


def _log_step(mlflow, history: dict[str, list[float]], lr: float, tokens_per_s: float, step: int):
    chosen, rejected = history["chosen"][-1], history["rejected"][-1]
    mlflow.log_metrics(
        {
            "loss": history["loss"][-1],
            "rewards/chosen": chosen,
            "rewards/rejected": rejected,
            "rewards/margin": chosen - rejected,
            "rewards/accuracy": history["acc"][-1],
            "learning_rate": lr,
            "tokens_per_s": tokens_per_s,
        },
        step=step,
    )
