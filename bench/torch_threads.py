"""What the fixed intra-op thread count costs: one SFT-sized training step (forward + backward
of the cpu-demo policy's shape) at 1 and 2 threads, on every core and pinned to one core
(as `taskset -c 0`), with OpenMP's waiting threads spinning (ACTIVE, libgomp's default) or
sleeping (PASSIVE, what components/cli.py sets). Each policy runs in its own process:
OpenMP reads it when torch loads. The work is split by the thread count alone, so every
row computes the same numbers; only the time differs. Run it on the machine you care about,
quiet and loaded: the table prints the load.

    .venv/bin/python bench/torch_threads.py [--steps 3] [--seq 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_table  # noqa: E402

_CHILD = r"""
import json, os, sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

steps, seq, hidden = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
config = Qwen2Config(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=352, vocab_size=2048)
model = Qwen2ForCausalLM(config)
x = torch.randint(0, 2048, (4, seq))
rows = []
for one_core in (False, True):
    if one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for threads in (1, 2):
        torch.set_num_threads(threads)
        model(input_ids=x, labels=x).loss.backward()
        t = time.perf_counter()
        for _ in range(steps):
            model(input_ids=x, labels=x).loss.backward()
        rows.append([one_core, threads, (time.perf_counter() - t) / steps])
print(json.dumps(rows))
"""


def measure(policy: str, steps: int, seq: int, hidden: int) -> list:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(steps), str(seq), str(hidden)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: dict[str, list], load: str) -> str:
    lines = [
        f"# One training step, seconds ({os.cpu_count()} cores, load {load})",
        "",
        "| cores | threads | ACTIVE (spin) | PASSIVE (sleep) | ACTIVE / PASSIVE |",
        "|---|---:|---:|---:|---:|",
    ]
    for (one_core, threads, active), (_, _, passive) in zip(*results.values(), strict=True):
        cores = "one (pinned)" if one_core else "all"
        lines.append(
            f"| {cores} | {threads} | {active:.2f} | {passive:.2f} | {active / passive:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    results = {
        policy: measure(policy, args.steps, args.seq, args.hidden)
        for policy in ("ACTIVE", "PASSIVE")
    }
    load = Path("/proc/loadavg").read_text().split()[0]
    write_table(table(results, load), args.out, "threads")


if __name__ == "__main__":
    main()
