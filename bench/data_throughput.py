"""Benchmark: ingest + validate throughput on synthetic trajectories.

    python bench/data_throughput.py [--n 10000] [--out /tmp/agentrl-bench] [--json]

Writes N canonical-format trajectories (a realistic mix of lengths: run tests, search,
read, edit, rerun, finish; a few percent with problems so quarantine paths run too), then
times `ingest` and `validate` and reports trajectories/s for each, total validation
seconds, and the share of validation time spent in Great Expectations. Ingest runs twice,
side by side: in one process, and with the default worker processes (the input is forced
onto the worker path); both publish the same bytes (checked), the second is the one counted.
Locks and atomic publishing are included in every timing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.data.config import IngestConfig, ValidationConfig  # noqa: E402
from components.data.ingest import ingest  # noqa: E402
from components.data.validate import validate_dataset  # noqa: E402

TEST_OUTPUT = (
    "============================= test session starts ==============================\n"
    "collected 12 items\n\ntests/test_core.py ........F...                        [100%]\n\n"
    "=================================== FAILURES ===================================\n"
    "_________________________________ test_edge __________________________________\n\n"
    "    def test_edge():\n>       assert clamp(5, 0, 5) == 5\nE       assert 4 == 5\n"
    "tests/test_core.py:31: AssertionError\n1 failed, 11 passed in 0.08s\n"
)
FILE_TEXT = "".join(f"{i:4d}  def f{i}(x):\n      return x + {i}\n" for i in range(1, 40))


def synthetic_record(i: int, rng: random.Random) -> dict:
    """One canonical record; about 3% carry a defect (unknown tool, key, bad reward)."""
    task = f"tests/test_core.py::test_edge fails in repo {i % 97}. Fix clamp() in core.py."
    events = [{"role": "user", "content": task}]
    reads = rng.randint(1, 6)
    plan = [("run_command", {"cmd": "python -m pytest -q"}, TEST_OUTPUT)]
    plan += [
        ("search", {"pattern": "def clamp", "path": "core.py"}, "core.py:12: def clamp(x, lo, hi):")
    ]
    plan += [("read_file", {"path": "core.py", "start_line": 1, "end_line": 80}, FILE_TEXT)] * reads
    plan += [
        (
            "edit_file",
            {"path": "core.py", "old": "hi - 1", "new": "hi"},
            "edited core.py (1 replacement)",
        )
    ]
    plan += [("run_command", {"cmd": "python -m pytest -q"}, "............\n12 passed in 0.07s")]
    plan += [("finish", {"summary": "clamp now includes the upper bound"}, "episode finished")]
    for action, args, obs in plan:
        events.append(
            {"role": "assistant", "action": action, "arguments": args, "content": "Next step."}
        )
        events.append({"role": "environment", "observation": obs, "truncated": False})
    reward = 1.0
    defect = rng.random()
    if defect < 0.01:
        events[1]["action"] = "rm_rf"
    elif defect < 0.02:
        events[2]["observation"] += "\nOPENAI_API_KEY=sk-proj-" + "a1B2" * 8
    elif defect < 0.03:
        reward = 7.0
    return {
        "schema_version": 1,
        "id": f"bench-{i:06d}",
        "task_id": f"train-{i % 500:04d}",
        "source": "policy",
        "task": task,
        "trajectory": events,
        "reward": reward,
        "reward_terms": {"tests_pass": 1.0, "lint": 0.0, "tests_never_run": 0.0},
        "metadata": {
            "policy": "grpo",
            "model_version": "tiny@1",
            "created_at": "2026-11-30T12:00:00Z",
            "num_tool_calls": len(plan),
            "num_tokens": 900 + 40 * reads,
            "split": "train",
        },
    }


def write_inputs(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps(synthetic_record(i, rng)) + "\n")


def run(n: int, out: Path, secret_policy: str = "redact") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    src = out / "input.jsonl"
    write_inputs(src, n)
    t = time.perf_counter()
    one = IngestConfig(out_dir=str(out / "ingested-1"), workers=1)
    single = ingest([str(src)], one, overwrite=True)
    ingest_1_s = time.perf_counter() - t
    t = time.perf_counter()
    cfg = IngestConfig(out_dir=str(out / "ingested"), parallel_min_bytes=1)
    result = ingest([str(src)], cfg, overwrite=True)
    ingest_s = time.perf_counter() - t
    if single.manifest["files"] != result.manifest["files"]:
        raise SystemExit("ingest with workers published different files than one process")
    t = time.perf_counter()
    report = validate_dataset(
        ValidationConfig(
            in_dir=str(out / "ingested"),
            out_dir=str(out / "validated"),
            report_dir=str(out / "report"),
            secret_policy=secret_policy,
        )
    )
    validate_s = time.perf_counter() - t
    gx_s = report["timings_s"]["great_expectations_s"]
    return {
        "trajectories": n,
        "steps": sum(
            f["rows"] for k, f in result.manifest["files"].items() if k.startswith("steps-")
        ),
        "ingest_s": round(ingest_s, 3),
        "ingest_traj_per_s": round(n / ingest_s, 1),
        "ingest_workers": cfg.workers,
        "ingest_one_process_s": round(ingest_1_s, 3),
        "ingest_speedup_vs_one_process": round(ingest_1_s / ingest_s, 2),
        "ingest_plus_validate_s": round(ingest_s + validate_s, 3),
        "validate_s": round(validate_s, 3),
        "validate_traj_per_s": round(n / validate_s, 1),
        "great_expectations_s": gx_s,
        "great_expectations_share": round(gx_s / validate_s, 3),
        "validate_timings_s": report["timings_s"],
        "counts": report["counts"],
        "quarantined_by_check": report["quarantined_by_check"],
        "redactions": report["redactions"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000, help="number of synthetic trajectories")
    p.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--secret-policy", choices=["redact", "reject"], default="redact")
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument(
        "--results",
        default=None,
        help="also write the table here (e.g. bench/results/data-throughput-DATE.md)",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = run(args.n, Path(args.out or tmp), args.secret_policy)
    if not args.json:
        print(
            f"ingest   {res['ingest_traj_per_s']:>9.1f} traj/s  ({res['ingest_s']} s, "
            f"{res['ingest_speedup_vs_one_process']}x one process's "
            f"{res['ingest_one_process_s']} s)\n"
            f"validate {res['validate_traj_per_s']:>9.1f} traj/s  ({res['validate_s']} s, "
            f"GX share {res['great_expectations_share']:.0%})\n"
            f"ingest + validate {res['ingest_plus_validate_s']} s"
        )
    print(json.dumps(res, indent=2))
    if args.results:
        Path(args.results).write_text(results_table(res, args.n))
    return 0


def results_table(res: dict, n: int) -> str:
    """The run as a markdown table, for bench/results/."""
    cores = os.cpu_count()
    return (
        f"# bench/data_throughput.py --n {n} ({cores} cores)\n\n"
        "| step | seconds | trajectories/s |\n|---|---|---|\n"
        f"| ingest, one process | {res['ingest_one_process_s']} | "
        f"{round(n / res['ingest_one_process_s'], 1)} |\n"
        f"| ingest, {res['ingest_workers']} workers | {res['ingest_s']} | "
        f"{res['ingest_traj_per_s']} |\n"
        f"| validate (Great Expectations {res['great_expectations_share']:.0%}) | "
        f"{res['validate_s']} | {res['validate_traj_per_s']} |\n"
        f"| **ingest + validate** | **{res['ingest_plus_validate_s']}** | |\n\n"
        f"Ingest with workers vs one process: {res['ingest_speedup_vs_one_process']}x "
        "(same bytes published). Locks and atomic publishing included.\n"
        f"Validation timings: {json.dumps(res['validate_timings_s'])}\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
