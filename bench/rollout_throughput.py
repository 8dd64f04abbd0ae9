"""Rollout engine sampling throughput vs bare batched `model.generate`, side by side.

The engine runs K episodes per task; every generate call it makes (the batched prompts and
their caps) is recorded and then replayed through a bare `model.generate` (same batches,
same seeds, no log-prob bookkeeping, no tools). Printed: generated tokens per second of

- the engine's generation calls (sampling + log-probs + bookkeeping),
- the same calls through bare `model.generate`, and their ratio,
- the engine end to end (including tool execution and verification).

    .venv/bin/python bench/rollout_throughput.py [--tasks 4] [--k 4] [--batch 8] [--steps 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from components.env.config import EnvConfig
from components.env.sandbox import SandboxConfig
from components.policy.chat import IM_END
from components.policy.config import PolicyConfig
from components.policy.model import build_policy
from components.rollout.config import RolloutConfig
from components.rollout.engine import generate_transformers, sample_episodes
from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks


def bare_generate(model, tokenizer, prompts, caps, seed, temperature) -> int:
    """model.generate on left-padded prompts; returns the real generated tokens (as the engine
    counts them: up to the first <|im_end|>, at most the row's cap)."""
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max(caps), do_sample=True,
            temperature=temperature, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=pad,
        )  # fmt: skip
    total = 0
    for row, cap in zip(out[:, width:].tolist(), caps, strict=True):
        n = row.index(eos) + 1 if eos in row else len(row)
        total += min(n, cap)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    config = PolicyConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=352, vocab_size=1024,
                          tokenizer_stdlib_bytes=200_000)  # fmt: skip
    model, tokenizer = build_policy(config)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        generate_suite(Path(tmp) / "tasks", max(args.tasks, 3), 0)
        tasks = load_tasks(Path(tmp) / "tasks")[0][: args.tasks]
        rollout = RolloutConfig(
            temperature=1.0, max_new_tokens=args.max_new_tokens, max_episode_tokens=2048,
            batch_size=args.batch, samples_per_task=args.k, workers=2,
        )  # fmt: skip
        calls, gen_time = [], [0.0]

        def timed(prompts, caps, seed):
            t0 = time.perf_counter()
            out = generate_transformers(model, tokenizer, prompts, caps, temperature=1.0,
                                        top_p=1.0, seed=seed)  # fmt: skip
            gen_time[0] += time.perf_counter() - t0
            calls.append((prompts, caps, seed))
            return out

        t0 = time.perf_counter()
        rollouts = sample_episodes(tasks, model, tokenizer, rollout, EnvConfig(max_steps=args.steps), SandboxConfig(),
                                   generate_fn=timed)  # fmt: skip
        wall = time.perf_counter() - t0
    engine_tokens = sum(r.num_generated_tokens for r in rollouts)
    t0 = time.perf_counter()
    bare_tokens = sum(bare_generate(model, tokenizer, *c, 1.0) for c in calls)
    bare_time = time.perf_counter() - t0
    engine_tps, bare_tps = engine_tokens / gen_time[0], bare_tokens / bare_time
    print(f"{len(rollouts)} episodes, {len(calls)} batched generate calls, "
          f"{engine_tokens} sampled tokens (bare replay: {bare_tokens})")  # fmt: skip
    print(f"{'':32}{'tokens/s':>10}")
    print(f"{'bare model.generate':32}{bare_tps:>10.0f}")
    print(f"{'engine generation calls':32}{engine_tps:>10.0f}   ratio {engine_tps / bare_tps:.2f}")
    print(f"{'engine end to end (+tools+verify)':32}{engine_tokens / wall:>10.0f}"
          f"   ratio {engine_tokens / wall / bare_tps:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
