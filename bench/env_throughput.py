"""Environment throughput, measured side by side in one run.

1. Verified oracle episodes per second with 1 and with 2 workers.
2. One sandboxed test run vs a bare `python -m pytest` of the same repo (interleaved, so
   both see the same machine load), as a ratio of medians.

    .venv/bin/python bench/env_throughput.py [--tasks 40] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from components.env.config import EnvConfig
from components.env.evaluate import EvalConfig, evaluate_policy
from components.env.scripted import make_policy
from components.env.sandbox import SandboxConfig, isolation_report, run_sandboxed
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.task import load_tasks


def episodes_per_second(tasks, workers: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    results = evaluate_policy(
        tasks, lambda: make_policy("oracle"), EnvConfig(), SandboxConfig(),
        EvalConfig(workers=workers),
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    return len(results) / elapsed, sum(r.success for r in results)


def sandbox_vs_bare(tasks, repeats: int) -> tuple[float, float]:
    sandboxed, bare = [], []
    cfg = SandboxConfig()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            task = tasks[i % len(tasks)]
            repo = Path(tmp) / f"r{i}"
            shutil.copytree(task.repo_dir, repo)
            argv = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
            t0 = time.perf_counter()
            run_sandboxed(argv, repo, cfg)
            sandboxed.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            # Same pytest set-up as inside the sandbox (no plugin autoload), so the ratio
            # measures isolation alone.
            env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                   "PYTEST_PLUGINS": "pytest_timeout", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
            subprocess.run([sys.executable, *argv[1:]], cwd=repo, capture_output=True,
                           check=False, env=env)  # fmt: skip
            bare.append(time.perf_counter() - t0)
    return statistics.median(sandboxed), statistics.median(bare)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", type=int, default=40, help="episodes per worker setting")
    p.add_argument("--repeats", type=int, default=20, help="paired test runs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        generate_suite(Path(tmp), GenerateConfig(n_tasks=max(args.tasks, 30), seed=123))
        tasks, _ = load_tasks(tmp)
        tasks = tasks[: args.tasks]
        print(f"isolation: {isolation_report(SandboxConfig()).get('summary', '')}")
        print(f"{len(tasks)} oracle episodes per setting (each: tests run 2x + verification)\n")
        rows = []
        for workers in (1, 2):
            eps, ok = episodes_per_second(tasks, workers)
            rows.append((workers, eps, ok))
            print(
                f"  workers={workers}: {eps:6.2f} verified episodes/s  ({ok}/{len(tasks)} success)"
            )
        print(f"  scaling 2 vs 1 workers: {rows[1][1] / rows[0][1]:.2f}x\n")
        sb, bare = sandbox_vs_bare(tasks, args.repeats)
        print(f"  median sandboxed pytest run: {sb * 1000:7.1f} ms")
        print(f"  median bare pytest run:      {bare * 1000:7.1f} ms")
        print(f"  sandbox overhead ratio:      {sb / bare:.2f}x  (aim < 1.5x)")


if __name__ == "__main__":
    main()
