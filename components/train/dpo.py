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
Note: the IPO variant gets summed (not length-normalised) log-probs here; see dpo_loss.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from components.train.config import DPOConfig
from components.train.data import collate, trajectory_tokens


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


def train_dpo(policy, reference, tokenizer, pairs: list[dict], config: DPOConfig) -> DPOResult:
    """Train `policy` in place on (chosen, rejected) trajectory pairs; save it to output_dir.

    `pairs` come from `data.preference_pairs`. `reference`: a frozen model, or None for a
    frozen copy of `policy` as it is now (config.reference_path, if set, is loaded instead).
    """
    import torch

    from components.policy.model import load_policy, save_policy

    use_cuda = torch.cuda.is_available() and not config.use_cpu
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(config.seed)
    if reference is None:
        reference = (
            load_policy(config.reference_path)[0]
            if config.reference_path
            else copy.deepcopy(policy)
        )
    policy.to(device).train()
    reference.to(device).eval().requires_grad_(False)
    pad_id = tokenizer.pad_token_id

    examples = [t for t in (_pair_tokens(p, tokenizer, config.max_seq_len) for p in pairs) if t]
    if not examples:
        raise ValueError("train_dpo: no usable pair (none given, or all truncated)")
    _score_reference(reference, examples, pad_id, config, device)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    # Linear warmup, then constant: DPO runs are short and usually stopped by evaluation.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / (config.warmup_steps + 1))
    )
    mlflow = _start_tracking(config, len(examples))

    batches = _pair_batches(examples, config.batch_size, config.seed)
    history: dict[str, list[float]] = {k: [] for k in ("loss", "chosen", "rejected", "acc")}
    tokens_seen, started = 0, time.perf_counter()
    try:
        for step in range(1, config.max_steps + 1):
            loss, chosen, rejected, tokens = _accumulate(policy, batches, pad_id, config, device)
            if config.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += tokens
            history["loss"].append(loss)
            history["chosen"].append(chosen.mean().item())
            history["rejected"].append(rejected.mean().item())
            history["acc"].append((chosen > rejected).float().mean().item())
            if mlflow is not None and step % config.log_every == 0:
                rate = tokens_seen / max(time.perf_counter() - started, 1e-9)
                _log_step(mlflow, history, scheduler.get_last_lr()[0], rate, step)
        seconds = time.perf_counter() - started
        checkpoint = save_policy(policy, tokenizer, Path(config.output_dir) / "policy")
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
    )


def _score_reference(reference, examples: list[dict], pad_id: int, config: DPOConfig, device):
    """Store each pair's reference log-probs in it (ref_chosen, ref_rejected): the reference
    never changes, so every pair is scored once."""
    import torch

    with torch.no_grad():
        for start in range(0, len(examples), config.batch_size):
            chunk = examples[start : start + config.batch_size]
            seqs = [ex["chosen"] for ex in chunk] + [ex["rejected"] for ex in chunk]
            ref = _sequence_logps(reference, seqs, pad_id, config, device).float().cpu()
            for i, ex in enumerate(chunk):
                ex["ref_chosen"], ex["ref_rejected"] = ref[i], ref[len(chunk) + i]


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


def _accumulate(policy, batches, pad_id: int, config: DPOConfig, device):
    """Forward and backward of one optimizer step's grad_accum micro-batches: (mean loss,
    chosen rewards, rejected rewards, tokens processed)."""
    import torch

    from components.train.losses import dpo_loss

    step_loss, chosen, rejected, tokens = 0.0, [], [], 0
    for _ in range(config.grad_accum):
        batch = next(batches)
        seqs = [ex["chosen"] for ex in batch] + [ex["rejected"] for ex in batch]
        tokens += sum(len(s["input_ids"]) for s in seqs)
        # Chosen and rejected in one forward: one [2B, T] batch.
        logps = _sequence_logps(policy, seqs, pad_id, config, device).float()  # [2B]
        n = len(batch)
        loss, c_rewards, r_rewards = dpo_loss(
            logps[:n],
            logps[n:],
            torch.stack([ex["ref_chosen"] for ex in batch]).to(device),
            torch.stack([ex["ref_rejected"] for ex in batch]).to(device),
            beta=config.beta,
            label_smoothing=config.label_smoothing,
            loss_type=config.loss_type,
        )
        (loss / config.grad_accum).backward()
        step_loss += loss.item() / config.grad_accum
        chosen.append(c_rewards.cpu())
        rejected.append(r_rewards.cpu())
    return step_loss, torch.cat(chosen), torch.cat(rejected), tokens


def _start_tracking(config: DPOConfig, num_pairs: int):
    """The mlflow module with a started run, or None when no tracking URI is configured."""
    if not config.mlflow_tracking_uri:
        return None
    import mlflow

    mlflow.set_tracking_uri(config.mlflow_tracking_uri)
    mlflow.set_experiment(config.mlflow_experiment)
    mlflow.start_run(run_name="dpo")
    mlflow.log_params({**vars(config), "num_pairs": num_pairs})
    return mlflow


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
