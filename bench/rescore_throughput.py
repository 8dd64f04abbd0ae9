"""`agentrl rescore` throughput beside the original verification, measured in one run.

A GRPO-like stored dataset: --group episodes per task over --tasks generated tasks, each
episode the oracle (a pass) or the no-op policy (a failure), alternating, so a group's
final trees coincide the way sampled completions of one prompt often do. It is recorded
once (the "original" run, verdict cache on, one episode at a time, as a sampler verifies
inline) and then rescored from its records:

- original verification: the episodes' own verify time (their recorded `timing.verify`),
  episodes / sum of it: what judging them cost when they were sampled;
- original episodes: the whole original run (tools and verification), episodes / wall s;
- rescore, 1 worker, no cache: every replayed tree verified afresh;
- rescore, 1 worker, cache: identical trees verified once;
- rescore, --workers workers, cache: what `agentrl rescore` does.

Rescoring replays the recorded actions (their tool calls run again in the sandbox) before
verifying, so it is compared with both original columns. The table goes to
bench/results/rescore-throughput-<date>.md.

    .venv/bin/python bench/rescore_throughput.py [--tasks 10] [--group 4] [--workers 2]
        [--no-uncached]

--no-uncached leaves out the 1-worker no-cache pass (the slowest, about a third of the
bench's time) to fit more episodes in a time budget. The table's footer gives the date and
the load average (1 min) before and after the run: on a shared machine every number
moves with it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_table  # noqa: E402
from components.env import episode as episode_module  # noqa: E402
from components.env.config import EnvConfig  # noqa: E402
from components.env.episode import run_episode  # noqa: E402
from components.evaluate.rescore import rescore_records  # noqa: E402
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.scripted.reference import NoopPolicy, OraclePolicy  # noqa: E402
from components.tasks.generate import GenerateConfig, generate_suite  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402
from components.verifier.cache import clear_verdict_cache, verdict_cache_info  # noqa: E402
from components.verifier.verdict import verify  # noqa: E402


def record_dataset(tasks, group: int, env, sandbox) -> tuple[list, float]:
    """The stored episodes (results) and the original run's wall seconds."""
    clear_verdict_cache()
    t0 = time.perf_counter()
    results = []
    for task in tasks:
        for i in range(group):
            policy = OraclePolicy() if i % 2 == 0 else NoopPolicy()
            results.append(run_episode(task, policy, env, sandbox, seed=i))
    return results, time.perf_counter() - t0


def rescore_pass(records, tasks, env, sandbox, workers: int, cache: bool) -> dict:
    clear_verdict_cache()
    original = episode_module.verify
    if not cache:  # the bench's own switch: rescore always runs with the cache
        episode_module.verify = functools.partial(verify, cache=False)
    try:
        t0 = time.perf_counter()
        rows = rescore_records(records, {t.id: t for t in tasks}, env, sandbox, workers=workers)
        seconds = time.perf_counter() - t0
    finally:
        episode_module.verify = original
    flips = sum(bool(r.flip) for r in rows)
    missing = sum(r.new is None for r in rows)
    return {
        "seconds": seconds,
        "hits": verdict_cache_info()["hits"],
        "flips": flips,
        "missing": missing,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", type=int, default=10, help="generated tasks")
    p.add_argument("--group", type=int, default=4, help="stored episodes per task")
    p.add_argument("--workers", type=int, default=2, help="rescore workers (threads)")
    p.add_argument(
        "--no-uncached", action="store_true", help="skip the 1-worker no-cache pass (the slowest)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    load_before, t_start = os.getloadavg()[0], time.perf_counter()
    env, sandbox = EnvConfig(), SandboxConfig()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-rescore-") as tmp:
        generate_suite(Path(tmp), GenerateConfig(n_tasks=max(args.tasks, 2), seed=11))
        tasks = load_tasks(tmp)[0][: args.tasks]
        results, original_s = record_dataset(tasks, args.group, env, sandbox)
        n = len(results)
        verify_s = sum(r.timing["verify"][1] - r.timing["verify"][0] for r in results)
        records = [r.record for r in results]
        passes = (
            []
            if args.no_uncached
            else [
                (
                    "rescore, 1 worker, no cache",
                    rescore_pass(records, tasks, env, sandbox, 1, False),
                )
            ]
        )
        passes += [
            ("rescore, 1 worker, cache", rescore_pass(records, tasks, env, sandbox, 1, True)),
            (
                f"rescore, {args.workers} workers, cache",
                rescore_pass(records, tasks, env, sandbox, args.workers, True),
            ),
        ]
    base = n / verify_s
    lines = [
        f"# rescore throughput ({n} stored episodes: {len(tasks)} tasks x {args.group}, "
        "oracle/no-op alternating)",
        "",
        "| setting | seconds | episodes/s | vs original verification | vs original episodes "
        "| cache hits | flips | no verdict |",
        "|---|---|---|---|---|---|---|---|",
        f"| original verification (inline, cache) | {verify_s:.2f} | {base:.2f} | 1.00x | "
        f"{base / (n / original_s):.2f}x | - | - | - |",
        f"| original episodes (tools + verification) | {original_s:.2f} | {n / original_s:.2f} "
        f"| {(n / original_s) / base:.2f}x | 1.00x | - | - | - |",
    ]
    for name, m in passes:
        eps = n / m["seconds"]
        lines.append(
            f"| {name} | {m['seconds']:.2f} | {eps:.2f} | {eps / base:.2f}x | "
            f"{eps / (n / original_s):.2f}x | {m['hits']} | {m['flips']} | "
            f"{m['missing']} |"
        )
    lines += [
        "",
        "Same verifier before and after: every flip or missing verdict would be a "
        "replay that does not reproduce its episode (0 expected).",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, `--tasks {args.tasks} "
        f"--group {args.group} --workers {args.workers}"
        f"{' --no-uncached' if args.no_uncached else ''}`, {os.cpu_count()} CPUs, "
        f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"{time.perf_counter() - t_start:.0f} s in all.",
    ]
    write_table("\n".join(lines) + "\n", args.out, "rescore-throughput")


if __name__ == "__main__":
    main()
