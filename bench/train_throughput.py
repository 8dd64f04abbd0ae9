"""Training and sampling throughput of our stages vs bare torch, side by side in one run.

Same tiny model (configs/cpu-demo.yaml's policy section, tokenizer trained on the oracle
transcripts), same data, same batch, same optimizer (AdamW, same learning rate), each run
starting from the same initial weights:

- SFT: `train.sft.train_sft` vs a bare loop over the same micro-batches (right padding to
  the same multiple, HF's loss on labels, AdamW step), interleaved and repeated (--repeats):
  the median ratio with its min and max;
- DPO: `train.dpo.train_dpo` vs a bare loop (chosen + rejected in one forward, summed
  assistant-token log-probs, the sigmoid DPO loss against precomputed reference log-probs);
- GRPO update: `train.grpo._update` (one iteration's update on stored rollouts) vs a bare
  clipped-ratio loop on the same rollouts, advantages and micro-batches;
- sampling: the rollout engine's generate calls vs the same calls replayed through bare
  batched `model.generate` (bench/rollout_throughput.py's `bare_generate`).

Tokens counted the same way on both sides: non-padding tokens of the sequences a step
processed (the forward pass), per wall second of the training steps only (reference
scoring and data preparation are outside the clock on both sides).

Then two tables from bench/train_scale.py (fresh processes): DPO and GRPO update tokens/s
with 1 vs 2 processes (`distributed`), and full vs LoRA SFT: trainable parameters and peak
memory (`lora`). `--only ROW ...` runs some of them.

    .venv/bin/python bench/train_throughput.py [--tasks 4 --k 4 --sft-steps 8 --dpo-steps 6]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_table  # noqa: E402
from bench.rollout_throughput import bare_generate  # noqa: E402
from components.env.batch_eval import EvalConfig, evaluate_policy  # noqa: E402
from components.env.config import EnvConfig  # noqa: E402
from components.policy.model import build_policy  # noqa: E402
from components.preset import load_preset  # noqa: E402
from components.rollout.engine import generate_transformers, sample_episodes  # noqa: E402
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.scripted.registry import make_policy  # noqa: E402
from components.tasks.generate import generate_suite  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402
from components.train.config import GRPOConfig  # noqa: E402
from components.train.data import collate, sft_examples, trajectory_tokens  # noqa: E402
from components.train.grpo.update import collate_rollouts  # noqa: E402
from components.train.grpo.update import update_with as _update  # noqa: E402
from components.train.losses import token_logprobs  # noqa: E402
from components.train.parallel import Stepper  # noqa: E402


def _timed(fn) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def shuffled_batches(items: list, batch: int, seed: int):
    """Endless batches of `batch` items: epochs of a seeded shuffle, batches may straddle two."""
    rng, order = random.Random(seed), []
    while True:
        chunk = []
        while len(chunk) < batch:
            if not order:
                order = list(range(len(items)))
                rng.shuffle(order)
            chunk.append(items[order.pop()])
        yield chunk


# ------------------------------------------------------------------------------ SFT


def bare_sft(
    model,
    examples: list[dict],
    windows: list[list[list[int]]],
    lr: float,
    pad_id: int,
    multiple: int,
) -> tuple[int, float]:
    """(non-padding tokens, seconds) of plain AdamW steps on the same micro-batches as ours
    (`windows`: per step, its micro-batches of example indices), HF's own loss on labels."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    tokens = 0
    t0 = time.perf_counter()
    for window in windows:
        for indices in window:
            b = collate([examples[i] for i in indices], pad_id, multiple)
            tokens += int(b["attention_mask"].sum())
            loss = model(
                input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]
            ).loss
            (loss / len(window)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return tokens, time.perf_counter() - t0


def interleaved(ours, bare, repeats: int) -> dict:
    """Run `ours()` and `bare()` (each returning (tokens, seconds)) `repeats` times each,
    alternating which goes first; per repeat the ratio of their tokens/s. Returns the
    median ratio, its min and max, and the median tokens/s of each side."""
    import statistics

    ratios, rates = [], {"ours": [], "bare": []}
    for r in range(repeats):
        pair = [("ours", ours), ("bare", bare)]
        got = dict((name, fn()) for name, fn in (pair if r % 2 == 0 else pair[::-1]))
        for name, (tokens, seconds) in got.items():
            rates[name].append(tokens / seconds)
        ratios.append(rates["ours"][-1] / rates["bare"][-1])
    return {
        "ratio": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "ours": statistics.median(rates["ours"]),
        "bare": statistics.median(rates["bare"]),
        "repeats": repeats,
    }


def _spread_row(name: str, m: dict) -> str:
    return (
        f"| {name} | {m['ours']:,.0f} | {m['bare']:,.0f} | {m['ratio']:.2f} "
        f"(min {m['min']:.2f}, max {m['max']:.2f}, {m['repeats']} interleaved runs) | |"
    )


# ------------------------------------------------------------------------------ DPO


def _seq_logps(model, seqs: list[dict], pad_id: int) -> torch.Tensor:
    b = collate(seqs, pad_id)
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    picked = logp.gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    return (picked * b["assistant_mask"][:, 1:]).sum(-1)


def bare_dpo(
    model, pairs: list[dict], steps: int, batch: int, lr: float, beta: float, pad_id: int, seed: int
) -> tuple[int, float]:
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():  # outside the clock, as in train_dpo
        for p in pairs:
            ref = _seq_logps(reference, [p["chosen"], p["rejected"]], pad_id)
            p["ref"] = ref
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    draw, tokens = shuffled_batches(pairs, batch, seed), 0
    t0 = time.perf_counter()
    for _ in range(steps):
        chunk = next(draw)
        seqs = [p["chosen"] for p in chunk] + [p["rejected"] for p in chunk]
        tokens += sum(len(s["input_ids"]) for s in seqs)
        logps = _seq_logps(model, seqs, pad_id)
        n = len(chunk)
        ref = torch.stack([p["ref"] for p in chunk])  # [n, 2]
        margin = (logps[:n] - ref[:, 0]) - (logps[n:] - ref[:, 1])
        loss = -torch.nn.functional.logsigmoid(beta * margin).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return tokens, time.perf_counter() - t0


# ------------------------------------------------------------------------------ GRPO


def bare_grpo(
    model, rollouts, advantages: torch.Tensor, lr: float, micro: int, pad_id: int, eps: float = 0.2
) -> tuple[int, float]:
    """One optimizer step over all rollouts (micro-batched), the clipped-ratio loss."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.perf_counter()
    n = len(rollouts)
    for start in range(0, n, micro):
        chunk = rollouts[start : start + micro]
        b = collate_rollouts(chunk, pad_id)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        logps = token_logprobs(logits, b["input_ids"])  # [b, T-1]
        mask = b["assistant_mask"][:, 1:].float()
        ratio = torch.exp(logps - b["sampling_logprobs"][:, 1:])
        adv = advantages[start : start + micro, None]
        per_token = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        (per_seq.sum() / n).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sum(len(r.input_ids) for r in rollouts), time.perf_counter() - t0


# ------------------------------------------------------------------------------ main


def _row(name: str, ours: tuple[int, float], bare: tuple[int, float]) -> str:
    o, b = ours[0] / ours[1], bare[0] / bare[1]
    return f"| {name} | {o:,.0f} | {b:,.0f} | {o / b:.2f} | {ours[0]:,} / {bare[0]:,} |"


ROWS = ("sampling", "sft", "dpo", "grpo", "distributed", "lora")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="configs/cpu-demo.yaml", help="policy section source")
    p.add_argument("--tasks", type=int, default=4, help="train tasks (oracle data, rollouts)")
    p.add_argument("--k", type=int, default=4, help="rollouts per task")
    p.add_argument("--steps", type=int, default=4, help="assistant turns per rollout")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sft-tasks", type=int, default=12, help="oracle transcripts for SFT")
    p.add_argument("--sft-steps", type=int, default=16)
    p.add_argument("--dpo-steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=4, help="SFT sequences / DPO pairs per step")
    p.add_argument("--repeats", type=int, default=5, help="interleaved runs of each SFT side")
    p.add_argument("--update-steps", type=int, default=3, help="steps per 1-vs-2-process run")
    p.add_argument(
        "--memory-hidden", type=int, default=1024, help="width of the LoRA-vs-full model"
    )
    p.add_argument("--memory-layers", type=int, default=4, help="its layers")
    p.add_argument("--memory-seq", type=int, default=256, help="its longest training sequence")
    p.add_argument("--memory-steps", type=int, default=4, help="SFT steps of each memory run")
    p.add_argument("--only", nargs="*", default=[], choices=ROWS, help="these rows only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder the table is written to (train-throughput-run-<date>.md)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rows = args.only or ROWS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    preset = load_preset(args.preset)
    lines, notes = [], []
    with tempfile.TemporaryDirectory(prefix="agentrl-train-bench-") as tmp:
        root = Path(tmp)
        generate_suite(root / "tasks", 30, args.seed)
        train = load_tasks(root / "tasks", split="train")[0]
        tasks = train[: args.tasks]
        # SFT data: enough transcripts that every SFT batch is full on both sides.
        expert = evaluate_policy(
            train[: max(args.tasks, args.sft_tasks)],
            lambda: make_policy("oracle", seed=args.seed),
            EnvConfig(),
            SandboxConfig(),
            EvalConfig(workers=2),
        )
        records = [r.record for r in expert]
        model, tokenizer = build_policy(preset.section("policy"), records=records)
        initial = copy.deepcopy(model.state_dict())

        def fresh():
            model.load_state_dict(initial)
            return model

        # Unconstrained sampling: the bare replay has no try_fix-id constraint to apply.
        rollout_cfg = dataclasses.replace(
            preset.section("rollout"),
            temperature=1.0,
            max_new_tokens=args.max_new_tokens,
            samples_per_task=args.k,
            batch_size=args.tasks * args.k,
            workers=2,
            seed=args.seed,
            constrain_fix_ids=False,
        )
        rollouts = []
        if {"sampling", "dpo", "grpo", "distributed"} & set(rows):
            env = EnvConfig(max_steps=args.steps)
            rollouts, sampled = bench_sampling(fresh().eval(), tokenizer, tasks, rollout_cfg, env)
            lines += sampled if "sampling" in rows else []
        if "sft" in rows:
            lines.append(bench_sft(fresh, tokenizer, records, preset.section("sft"), args, root))
        pairs = dpo_pairs(records, rollouts)
        if "dpo" in rows:
            lines.append(bench_dpo(fresh, tokenizer, pairs, preset.section("dpo"), args, root))
        if "grpo" in rows:
            lines.append(bench_grpo_update(fresh, tokenizer, rollouts, rollout_cfg, root))
        if "distributed" in rows:
            notes += bench_distributed(fresh(), tokenizer, rollouts, pairs, args, root)
        if "lora" in rows:
            notes += bench_lora(tokenizer, records, args, root)

    params = sum(t.numel() for t in model.parameters())
    text = [
        f"model: {params:,} parameters, vocab {len(tokenizer)}; {args.threads} torch "
        f"threads; {len(rollouts)} rollouts ({args.tasks} tasks x {args.k}), "
        f"{len(records)} oracle transcripts, {len(pairs)} DPO pairs",
        "",
    ]
    if lines:
        text += [
            "| what | ours tokens/s | bare tokens/s | ours / bare | tokens (ours / bare) |",
            "|---|---|---|---|---|",
            *lines,
        ]
    text += notes
    command = " ".join(["bench/train_throughput.py", *(argv if argv is not None else sys.argv[1:])])
    write_table(f"<!-- {command} -->\n" + "\n".join(text) + "\n", args.out, "train-throughput-run")
    return 0


def bench_sampling(model, tokenizer, tasks, rollout_cfg, env) -> tuple[list, list[str]]:
    """The engine samples with its generate calls recorded, then they are replayed bare:
    (rollouts, two table rows)."""
    calls, gen_time = [], [0.0]

    def recorded(prompts, caps, seed):
        out, dt = _timed(
            lambda: generate_transformers(
                model, tokenizer, prompts, caps, temperature=1.0, top_p=1.0, seed=seed
            )
        )
        gen_time[0] += dt
        calls.append((prompts, caps, seed))
        return out

    rollouts, wall = _timed(
        lambda: sample_episodes(
            tasks, model, tokenizer, rollout_cfg, env, SandboxConfig(), generate_fn=recorded
        )
    )
    engine_tokens = sum(r.num_generated_tokens for r in rollouts)
    bare_tokens, bare_time = _timed(
        lambda: sum(bare_generate(model, tokenizer, *c, 1.0) for c in calls)
    )
    return rollouts, [
        _row(
            "sampling: engine generate calls vs bare model.generate",
            (engine_tokens, gen_time[0]),
            (bare_tokens, bare_time),
        ),
        _row(
            "sampling: engine end to end (+tools, verify) vs bare generate",
            (engine_tokens, wall),
            (bare_tokens, bare_time),
        ),
    ]


def bench_sft(fresh, tokenizer, records: list[dict], sft_cfg, args, root: Path) -> str:
    """train_sft vs the bare loop on the same micro-batches, each from the initial weights,
    interleaved and repeated: a table row with the ratio's spread."""
    from components.train.sft import step_windows, train_sft

    sft_cfg = dataclasses.replace(
        sft_cfg, max_steps=args.sft_steps, batch_size=args.batch, warmup_steps=0, seed=args.seed
    )
    examples = sft_examples(records, tokenizer, sft_cfg.max_seq_len)
    stream, steps = step_windows(len(examples), sft_cfg)
    windows = [next(stream) for _ in range(steps)]
    runs = iter(range(10**6))

    def ours():
        out = dataclasses.replace(sft_cfg, output_dir=str(root / f"sft-{next(runs)}"))
        result = train_sft(fresh(), tokenizer, records, out)
        return result.tokens, result.train_seconds

    def bare():
        return bare_sft(
            fresh(),
            examples,
            windows,
            sft_cfg.learning_rate,
            tokenizer.pad_token_id,
            sft_cfg.pad_to_multiple_of,
        )

    return _spread_row("SFT step: train_sft vs bare loop", interleaved(ours, bare, args.repeats))


def dpo_pairs(records: list[dict], rollouts) -> list[dict]:
    """Oracle success (chosen) vs the untrained model's failed rollout (rejected)."""
    failed = {r.group_id: r.result.record for r in rollouts if not r.result.success}
    return [
        {"task_id": r["task_id"], "chosen": r, "rejected": failed[r["task_id"]]}
        for r in records
        if r["task_id"] in failed
    ]


def bench_dpo(fresh, tokenizer, pairs: list[dict], dpo_cfg, args, root: Path) -> str:
    """train_dpo vs bare loop, each from the initial weights: a table row."""
    from components.train.dpo import train_dpo

    dpo_cfg = dataclasses.replace(
        dpo_cfg,
        max_steps=args.dpo_steps,
        batch_size=args.batch,
        warmup_steps=0,
        output_dir=str(root / "dpo"),
        seed=args.seed,
    )
    result = train_dpo(fresh(), None, tokenizer, pairs, dpo_cfg)
    ours_tokens = int(result.tokens_per_second * result.train_seconds)
    tok = [
        {
            side: {
                k: v[: dpo_cfg.max_seq_len]
                for k, v in trajectory_tokens(tokenizer, pr[side]).items()
            }
            for side in ("chosen", "rejected")
        }
        for pr in pairs
    ]
    bare = bare_dpo(
        fresh(),
        tok,
        args.dpo_steps,
        args.batch,
        dpo_cfg.learning_rate,
        dpo_cfg.beta,
        tokenizer.pad_token_id,
        args.seed,
    )
    return _row("DPO step: train_dpo vs bare loop", (ours_tokens, result.train_seconds), bare)


def bench_grpo_update(fresh, tokenizer, rollouts, rollout_cfg, root: Path) -> str:
    """One update on the sampled rollouts, fixed +-1 advantages so gradients flow: a row."""
    grpo_cfg = GRPOConfig(learning_rate=2e-5, micro_batch_size=4, output_dir=str(root))
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(rollouts))])
    m = fresh().train()
    optimizer = torch.optim.AdamW(m.parameters(), lr=grpo_cfg.learning_rate, weight_decay=0)
    stepper = Stepper(m, m, optimizer, max_grad_norm=grpo_cfg.max_grad_norm)
    out, dt = _timed(
        lambda: _update(
            stepper,
            None,
            rollouts,
            advantages,
            grpo_cfg,
            rollout_cfg,
            tokenizer.pad_token_id,
            torch.device("cpu"),
            1,
        )
    )
    bare = bare_grpo(
        fresh(),
        rollouts,
        advantages,
        grpo_cfg.learning_rate,
        grpo_cfg.micro_batch_size,
        tokenizer.pad_token_id,
    )
    return _row("GRPO update: grpo._update vs bare loop", (out["update_tokens"], dt), bare)


def bench_distributed(model, tokenizer, rollouts, pairs, args, root: Path) -> list[str]:
    """GRPO and DPO update tokens/s, 1 vs 2 processes (bench/train_scale.py)."""
    from bench.train_scale import distributed_rows
    from components.policy.model import save_policy
    from components.train.dpo import _pair_tokens

    policy_dir = save_policy(model, tokenizer, root / "distributed-policy")
    examples = [e for e in (_pair_tokens(p, tokenizer, 2048) for p in pairs) if e]
    rows = distributed_rows(policy_dir, rollouts, examples, args.update_steps, root)
    return [
        "",
        "Data-parallel updates (train/parallel.py: plain AdamW, gradients all-reduced "
        "over gloo; 1 torch thread per process):",
        "",
        *rows,
    ]


def bench_lora(tokenizer, records: list[dict], args, root: Path) -> list[str]:
    """Full vs LoRA SFT on a wider model: trainable parameters, peak memory, tokens/s."""
    import json

    from bench.train_scale import lora_rows

    tokenizer.save_pretrained(root / "memory-tokenizer")
    records_file = root / "memory-records.jsonl"
    records_file.write_text("\n".join(json.dumps(r) for r in records))
    heads = max(args.memory_hidden // 64, 1)
    policy = {
        "hidden_size": args.memory_hidden,
        "num_layers": args.memory_layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "max_position_embeddings": 4096,
        "intermediate_size": args.memory_hidden * 11 // 4,
    }
    rows = lora_rows(
        root / "memory-tokenizer", records_file, policy, args.memory_seq, args.memory_steps, root
    )
    return [
        "",
        f"Full vs LoRA SFT (r=16 on every attention and MLP projection; "
        f"{args.memory_hidden} wide, {args.memory_layers} layers, batch 2 x "
        f"{args.memory_seq} tokens, {args.memory_steps} steps, AdamW):",
        "",
        *rows,
    ]


if __name__ == "__main__":
    raise SystemExit(main())
