"""Rollout engine sampling throughput vs bare batched `model.generate`, side by side in one run.

The engine runs K episodes per task; every generate call it makes (the batched prompts and
their caps) is replayed through a bare `model.generate` right next to it (same batch, same
seed, no log-prob bookkeeping, no tools), alternating which of the two goes first, so drift
in the machine's load hits both sides. Printed and written to
bench/results/rollout-throughput-<date>.md: generated tokens per second of

- the same calls through bare `model.generate`,
- the engine's generation calls (sampling + log-probs + bookkeeping), and the ratio,
- the engine end to end (including tool execution and verification; the bare replays'
  time is taken out of its wall), and the ratio.

    .venv/bin/python bench/rollout_throughput.py [--tasks 4] [--k 4] [--batch 8] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LogitsProcessorList

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_table  # noqa: E402
from components.env.config import EnvConfig  # noqa: E402
from components.policy.chat import IM_END  # noqa: E402
from components.policy.config import PolicyConfig  # noqa: E402
from components.policy.model import build_policy  # noqa: E402
from components.rollout.config import RolloutConfig  # noqa: E402
from components.rollout.engine import (  # noqa: E402
    RowSampler,
    generate_transformers,
    sample_episodes,
)
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.tasks.generate import generate_suite  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402


def bare_generate(model, tokenizer, prompts, caps, seed, temperature) -> int:
    """model.generate on left-padded prompts; returns the real generated tokens (as the engine
    counts them: up to the first <|im_end|>, at most the row's cap)."""
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    # The engine seeds each row (one int per prompt): the same per-row draw here, else
    # generate's own sampling from one seeded stream.
    per_row = not isinstance(seed, int)
    sampling = (
        {
            "do_sample": False,
            "logits_processor": LogitsProcessorList([RowSampler(seed, temperature, 1.0)]),
        }
        if per_row
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if per_row else seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(caps),
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling,
        )
    total = 0
    for row, cap in zip(out[:, width:].tolist(), caps, strict=True):
        n = row.index(eos) + 1 if eos in row else len(row)
        total += min(n, cap)
    return total


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=4, help="generated tasks sampled")
    p.add_argument("--k", type=int, default=4, help="episodes per task")
    p.add_argument("--batch", type=int, default=8, help="episodes per batched generate call")
    p.add_argument("--steps", type=int, default=4, help="agent steps per episode")
    p.add_argument("--max-new-tokens", type=int, default=64, help="cap per assistant turn")
    p.add_argument(
        "--tokenizer-bytes",
        type=int,
        default=200_000,
        help="standard-library bytes the tokenizer is trained on",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    return p


def _timed(fn) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def sample_side_by_side(model, tokenizer, tasks, args) -> dict:
    """Samples the episodes, each engine generate call paired with its bare replay: token
    counts and seconds of both sides, and the engine's wall without the replays."""
    rollout = RolloutConfig(
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        max_episode_tokens=2048,
        batch_size=args.batch,
        samples_per_task=args.k,
        workers=2,
        constrain_fix_ids=False,  # the bare replay has no fix-id constraint to apply
    )
    calls: list[tuple[float, int, float]] = []  # (engine s, bare tokens, bare s) per call

    def paired(prompts, caps, seed):
        def bare():
            return _timed(lambda: bare_generate(model, tokenizer, prompts, caps, seed, 1.0))

        bare_first = len(calls) % 2 == 1
        replay = bare() if bare_first else None
        out, seconds = _timed(
            lambda: generate_transformers(
                model, tokenizer, prompts, caps, temperature=1.0, top_p=1.0, seed=seed
            )
        )
        if replay is None:
            replay = bare()
        calls.append((seconds, *replay))
        return out

    bare_generate(model, tokenizer, [[tokenizer.pad_token_id]], [1], 0, 1.0)  # warm-up
    rollouts, wall = _timed(
        lambda: sample_episodes(
            tasks,
            model,
            tokenizer,
            rollout,
            EnvConfig(max_steps=args.steps),
            SandboxConfig(),
            generate_fn=paired,
        )
    )
    bare_seconds = sum(c[2] for c in calls)
    return {
        "episodes": len(rollouts),
        "calls": len(calls),
        "engine_tokens": sum(r.num_generated_tokens for r in rollouts),
        "engine_seconds": sum(c[0] for c in calls),
        "bare_tokens": sum(c[1] for c in calls),
        "bare_seconds": bare_seconds,
        "engine_wall": wall - bare_seconds,
    }


def table(m: dict) -> list[str]:
    """The markdown table: tokens/s of each side and the engine's ratios to bare."""
    bare = m["bare_tokens"] / m["bare_seconds"]
    calls = m["engine_tokens"] / m["engine_seconds"]
    whole = m["engine_tokens"] / m["engine_wall"]
    return [
        "| what | tokens/s | / bare |",
        "|---|---|---|",
        f"| bare model.generate (same calls replayed) | {bare:,.0f} | 1.00 |",
        f"| engine generate calls (sampling + log-probs) | {calls:,.0f} | {calls / bare:.2f} |",
        f"| engine end to end (+tools, verify) | {whole:,.0f} | {whole / bare:.2f} |",
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[1]  # other work on the machine competes for the cores
    config = PolicyConfig(
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=352,
        vocab_size=1024,
        tokenizer_stdlib_bytes=args.tokenizer_bytes,
    )
    model, tokenizer = build_policy(config)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        generate_suite(Path(tmp) / "tasks", max(args.tasks, 3), 0)
        tasks = load_tasks(Path(tmp) / "tasks")[0][: args.tasks]
        m = sample_side_by_side(model, tokenizer, tasks, args)
    settings = (
        f"{m['episodes']} episodes ({args.tasks} tasks x K={args.k}, {args.steps} "
        f"steps x {args.max_new_tokens} tokens), {m['calls']} batched generate calls "
        f"of up to {args.batch}, {m['engine_tokens']} sampled tokens (bare replay: "
        f"{m['bare_tokens']}), {args.threads} torch threads, {os.cpu_count()} cores, "
        f"5-min load average {load_before:.1f} before and {os.getloadavg()[1]:.1f} after"
    )
    text = "\n".join([f"# Rollout engine vs bare model.generate ({settings})", "", *table(m), ""])
    write_table(text, args.out, "rollout-throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
