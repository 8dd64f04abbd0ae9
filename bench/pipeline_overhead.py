"""Orchestration + tracking overhead of the retrain flow, measured side by side in one run.

1. The same stage command lines run back to back through `components.cli.main`, with no
   Prefect and no MLflow: the components' own compute.
2. The `retrain` flow (Prefect tasks, result caching, MLflow parent + nested runs, traces)
   on an identical preset in a fresh work folder, so nothing is served from cache.

Prints both wall times and overhead = flow / bare - 1 (aim: under 10%).

With `--make-run`: what a new user waits for. A fresh clone of this checkout, `make install`
(the virtual environment from the lock file) then `make run` (the retrain flow on
configs/cpu-demo.yaml), each timed; prints the install's and every stage's wall time with
its share of the run, the flow's own time (run minus its stages) and the total, and writes
the table to bench/results/, with the 1-minute load average sampled during each (min, mean,
max). Run it on a quiet machine: other work inflates every row; on a shared one, compare
presets or commits by ratio, run back to back, never by the absolute seconds.

    .venv/bin/python bench/pipeline_overhead.py [--n-tasks 60] [--sft-steps 60]
    .venv/bin/python bench/pipeline_overhead.py --make-run
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bench_preset(tmp: Path, name: str, n_tasks: int, sft_steps: int) -> Path:
    preset = yaml.safe_load((ROOT / "configs" / "cpu-demo.yaml").read_text())
    preset["name"] = name
    preset["pipeline"].update(workdir=str(tmp / name))
    preset["evaluate"].update(limit=8, safety_n_tasks=1)
    preset["tasks"]["n_tasks"] = n_tasks
    preset["sft"]["max_steps"] = sft_steps
    preset["grpo"].update(iterations=1, tasks_per_iteration=2)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(preset))
    return path


def bare_run(preset_path: Path) -> float:
    """The flow's stages in order, called directly (mirrors flows/retrain.py)."""
    from components.cli import main
    from components.preset import load_preset

    p = load_preset(preset_path)
    w = Path(p.section("pipeline").workdir)
    steps = [
        ["tasks", "generate", "--out", w / "tasks"],
        ["tasks", "check", "--tasks", w / "tasks", "--report", w / "gate.json"],
        [
            "env",
            "eval",
            "--tasks",
            w / "tasks",
            "--split",
            "train",
            "--policy",
            p.section("pipeline").expert_policy,
            "--out",
            w / "expert" / "results.json",
            "--trajectories-out",
            w / "expert" / "expert.jsonl",
            "--quiet",
        ],
        ["data", "ingest", w / "expert" / "expert.jsonl", "--overwrite"],
        ["data", "validate", "--eval-tasks", w / "tasks"],
        ["data", "snapshot", "-m", "bench"],
        ["policy", "init", "--records", w / "expert" / "expert.jsonl", "--out", w / "policy0"],
        [
            "train",
            "sft",
            "--policy",
            w / "policy0" / "policy",
            "--records",
            "data/validated",
            "--out",
            w / "sft",
        ],
        [
            "train",
            "grpo",
            "--policy",
            w / "sft" / "policy",
            "--tasks",
            w / "tasks",
            "--out",
            w / "grpo",
        ],
        [
            "evaluate",
            "run",
            "--tasks",
            w / "tasks",
            "--model",
            w / "grpo" / "policy",
            "--out",
            w / "eval",
        ],
        ["evaluate", "safety", "--out", w / "safety", "--model", w / "grpo" / "policy"],
    ]
    steps = [[*argv, "--preset", preset_path] for argv in steps]
    t0 = time.perf_counter()
    for argv in steps:
        code = main([str(a) for a in argv])
        if code:
            raise SystemExit(f"bare stage failed ({code}): {argv}")
    return time.perf_counter() - t0


def flow_run(preset_path: Path) -> float:
    """The flow as `make run` runs it: on the health-waited Prefect server (its start
    counted, as Prefect's own ephemeral start was)."""
    from components.preset import load_preset
    from flows.retrain import retrain
    from flows.retrain_main import prefect_api

    budget = load_preset(preset_path).section("runtime").startup_timeout_s
    t0 = time.perf_counter()
    with prefect_api(budget):
        retrain(str(preset_path))
    return time.perf_counter() - t0


# What flows/retrain.py prints when a stage ends: "    gate: done in 380s".
_STAGE_LINE = re.compile(r"^    ([\w-]+): (done|cached) in (\d+)s$", re.M)
# The run's closing summary (stdout, after the flow): "  gate 102  expert 58  | total 451";
# the per-stage lines above may go to Prefect's log (stderr) instead of stdout.
_SUMMARY = re.compile(r"^=== Stage timings .*===\n  (.*)  \| total \d+$", re.M)


def _stages(log: str) -> list[tuple[str, float, str]]:
    """(name, seconds, "done" | "cached") of every stage, from the per-stage lines or else
    the closing summary (whole seconds, no cache mark: a stage under 0.5 s shows 0)."""
    found = [(m.group(1), float(m.group(3)), m.group(2)) for m in _STAGE_LINE.finditer(log)]
    summary = _SUMMARY.search(log)
    if found or not summary:
        return found
    pairs = re.findall(r"([\w-]+) (\d+)", summary.group(1))
    return [(name, float(s), "done") for name, s in pairs]


def stage_table(log: str, install_s: float, run_s: float) -> str:
    """The table of a `make run` log: install, each stage (seconds, share of the run), the
    flow's own time and the total."""
    stages = _stages(log)
    lines = [
        "| step | seconds | share of `make run` |",
        "|---|---:|---:|",
        f"| install (make install) | {install_s:.0f} | |",
    ]
    for name, seconds, how in stages:
        shown = f"{seconds:.0f}" + (" (cached)" if how == "cached" else "")
        lines.append(f"| {name} | {shown} | {seconds / run_s:.0%} |")
    rest = run_s - sum(s for _, s, _ in stages)
    lines.append(f"| flow (Prefect, MLflow, start-up) | {rest:.0f} | {rest / run_s:.0%} |")
    lines.append(f"| **total, install included** | **{install_s + run_s:.0f}** | |")
    return "\n".join(lines)


class LoadSampler:
    """The 1-minute load average every `every_s` seconds while in a `with` block."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        """`load min-mean-max a-b-c` of the samples taken (at least one: the first is at entry)."""
        s = self.samples
        return f"load min-mean-max {min(s):.1f}-{sum(s) / len(s):.1f}-{max(s):.1f}"


def make_run(out: Path, keep: Path | None = None) -> Path:
    """Time `make install` and `make run` in a fresh clone of this checkout's HEAD; with
    `keep`, the clone is made there and kept (its run can then be reproduced)."""
    from bench.report import write_table

    with tempfile.TemporaryDirectory(prefix="agentrl-make-run-") as tmp:
        clone = keep or Path(tmp) / "agentrl"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        t0 = time.perf_counter()
        with LoadSampler() as install_load:
            subprocess.run(["make", "install"], cwd=clone, env=env, check=True)
        install_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with LoadSampler() as run_load:
            proc = subprocess.run(
                ["make", "run"], cwd=clone, env=env, capture_output=True, text=True, check=False
            )
        run_s = time.perf_counter() - t0
    sys.stdout.write(proc.stdout[-4000:])
    if proc.returncode != 0:
        raise SystemExit(f"make run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    table = stage_table(proc.stdout, install_s, run_s)
    text = (
        f"# `make run` in a fresh clone ({os.cpu_count()} cores)\n\n"
        f"install: {install_load.summary()}; run: {run_load.summary()}\n\n"
    )
    return write_table(text + table + "\n", out, "make-run")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n-tasks", type=int, default=60)
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--make-run", action="store_true", help="time install + make run instead")
    p.add_argument("--keep", type=Path, help="with --make-run: clone into this new folder, keep it")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.chdir(ROOT)
    if args.make_run:
        make_run(args.out, args.keep)
        return
    with tempfile.TemporaryDirectory(prefix="agentrl-overhead-") as tmp:
        tmp = Path(tmp)
        bare = bare_run(bench_preset(tmp, "bench-bare", args.n_tasks, args.sft_steps))
        flow = flow_run(bench_preset(tmp, "bench-flow", args.n_tasks, args.sft_steps))
    print("\npipeline overhead (same stages, same preset, no cache):")
    print(f"  stages called directly:     {bare:7.1f} s")
    print(f"  retrain flow (Prefect+MLflow): {flow:7.1f} s")
    print(f"  overhead:                   {flow / bare - 1:+.1%}  (aim < 10%)")
    print("note: the flow also registers the candidate and requests approval (one extra stage)")


if __name__ == "__main__":
    main()
