"""Supervised fine-tuning on trajectories, through TRL's SFTTrainer.

Why TRL and not a loop of our own: TRL 1.16's SFTTrainer takes a pre-tokenized dataset
(`input_ids` + `labels`) as is: it neither re-renders nor re-tokenizes it, it uses our
`labels` (-100 off the assistant's tokens) verbatim, and its collator pads to
`pad_to_multiple_of`. So the exact, segment-wise masks of `chat.tokenize_trajectory` (and
the sampled token ids of rollouts) reach the loss unchanged, and we get the Trainer's
gradient accumulation (loss normalised by the tokens of the whole accumulation window),
mixed precision, device placement and distributed launch for free. (Its own
`assistant_only_loss` path would re-render `messages` through a Jinja template with
`{% generation %}` markers; ours has none, and would lose the sampled ids.)

The per-step loss, learning rate, grad norm and tokens/s are collected by a small callback
and, when a tracking URI is configured, logged to MLflow. The trained policy is written
with `save_policy` (weights + tokenizer with our chat template). Resuming is out of scope.

`config.deepspeed` set: the same examples go through `deepspeed_launch.train_sft_deepspeed`
(deepspeed.initialize with the shipped ZeRO JSON) instead.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from components.train.config import SFTConfig
from components.train.data import sft_examples
from components.train.deepspeed_launch import train_sft_deepspeed
from components.train.sft_result import SFTResult


def _metrics_callback(config: SFTConfig, sink: dict):
    """A TrainerCallback that records each logged step into `sink` and MLflow (if configured)."""
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            sink["t0"] = sink["t_last"] = time.perf_counter()
            sink["tokens_last"] = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return  # the end-of-training summary has train_loss, not loss
            now = time.perf_counter()
            tokens = state.num_input_tokens_seen
            tokens_per_s = (tokens - sink["tokens_last"]) / max(now - sink["t_last"], 1e-9)
            sink["t_last"], sink["tokens_last"] = now, tokens
            row = {
                "loss": float(logs["loss"]),
                "learning_rate": float(logs.get("learning_rate", 0.0)),
                "grad_norm": float(logs.get("grad_norm", float("nan"))),
                "tokens_per_s": tokens_per_s,
                "tokens_seen": float(tokens),
            }
            sink["rows"].append(row)
            if sink["mlflow"] is not None and state.global_step % config.log_every == 0:
                sink["mlflow"].log_metrics(row, step=state.global_step)

    return MetricsCallback()


def _trl_args(config: SFTConfig, trainer_dir: Path):
    from trl import SFTConfig as TRLSFTConfig

    return TRLSFTConfig(
        output_dir=str(trainer_dir),
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
        max_length=config.max_seq_len,  # examples are truncated already; TRL re-checks
        pad_to_multiple_of=config.pad_to_multiple_of or None,
        bf16=config.bf16,
        use_cpu=config.use_cpu,
        seed=config.seed,
        data_seed=config.seed,
        logging_steps=1,  # every step's loss comes back in SFTResult; MLflow gets log_every
        include_num_input_tokens_seen="non_padding",
        save_strategy="no",  # the final policy is written by save_policy, below
        report_to="none",  # MLflow is logged by our callback, to the configured URI only
        dataloader_num_workers=0,
        disable_tqdm=True,
        dataset_kwargs={"skip_prepare_dataset": True},  # see train_sft
    )


def train_sft(model, tokenizer, records: list[dict], config: SFTConfig) -> SFTResult:
    """Fine-tune `model` in place on the assistant tokens of `records`; save it to output_dir."""
    examples = sft_examples(records, tokenizer, config.max_seq_len)
    if not examples:
        raise ValueError("train_sft: no example with an assistant token (empty or all truncated)")
    if config.deepspeed is not None:
        return train_sft_deepspeed(model, tokenizer, examples, config)

    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import PrinterCallback
    from trl import SFTTrainer

    from components.policy.model import save_policy

    output_dir = Path(config.output_dir)
    columns = {key: [e[key] for e in examples] for key in ("input_ids", "labels")}
    # The examples are tokenized, masked and truncated already, so TRL does not prepare them
    # and the dataset gets a fingerprint of our own: `datasets` would otherwise hash the
    # table and TRL's map functions with dill, which disassembles functions into a captured
    # stdout that Prefect's log_prints (`make run`) sends to the log as lines of LOAD_FAST.
    fingerprint = hashlib.sha256(json.dumps(columns).encode()).hexdigest()[:16]
    dataset = Dataset(InMemoryTable.from_pydict(columns), fingerprint=fingerprint)
    sink: dict = {"rows": [], "mlflow": None}
    run = None
    if config.mlflow_tracking_uri:
        import mlflow

        mlflow.set_tracking_uri(config.mlflow_tracking_uri)
        mlflow.set_experiment(config.mlflow_experiment)
        run = mlflow.start_run(run_name="sft")
        mlflow.log_params({k: v for k, v in vars(config).items() if k != "deepspeed"})
        mlflow.log_params({"num_examples": len(examples)})
        sink["mlflow"] = mlflow
    try:
        trainer = SFTTrainer(
            model=model,
            args=_trl_args(config, output_dir / "trainer"),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[_metrics_callback(config, sink)],
        )
        trainer.remove_callback(PrinterCallback)  # our callback records every step instead
        out = trainer.train()
        checkpoint = save_policy(trainer.model, tokenizer, output_dir / "policy")
        rows = sink["rows"]
        seconds = float(out.metrics.get("train_runtime", time.perf_counter() - sink["t0"]))
        tokens = int(trainer.state.num_input_tokens_seen)
        result = SFTResult(
            losses=[r["loss"] for r in rows],
            learning_rates=[r["learning_rate"] for r in rows],
            grad_norms=[r["grad_norm"] for r in rows],
            steps=trainer.state.global_step,
            tokens=tokens,
            train_seconds=seconds,
            tokens_per_second=tokens / max(seconds, 1e-9),
            checkpoint_dir=str(checkpoint),
            num_examples=len(examples),
            num_truncated=sum(e["truncated"] for e in examples),
            metrics=dict(out.metrics),
        )
        if run is not None:
            sink["mlflow"].log_metrics(
                {"train_seconds": seconds, "train_tokens_per_s": result.tokens_per_second}
            )
        return result
    finally:
        if run is not None:
            sink["mlflow"].end_run()
