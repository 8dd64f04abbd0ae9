"""Does list_fixes hold the reference fix? The earlier listing (the bug generator's operator
inverses, `operator_fixes`) against the generic grammar neighbourhood (`candidate_fixes`,
components/env/tool_sets/fix_search/neighbourhood.py), with and without the failing tests' output, side by side
in one run, on the generated suite (per split) and on the converted QuixBugs tasks.

Per (suite, listing): coverage = share of tasks (one-file reference patch) whose reference
fix is a listed candidate, with a 95% Wilson interval; listing size p50 / p90; the median
rank of the fix where listed; for the grammar neighbourhood, the uncut size too. "Listed"
means a candidate's canonical text equals the reference's: a different edit that fixes the
bug as well (`1 + f(x)` -> `0 + f(x)` for `f(x)`) does not count, so this is a lower bound
on the fixes a listing holds. The cut is `--limit` (EnvConfig.max_fixes, 64 by default);
"grammar, uncut" is the whole neighbourhood. "localised" runs each task's visible tests once
in the sandbox (its own test command without -x, in a temporary copy of the repository) and
passes their output, as list_fixes does, so the score's traceback and blamed-function terms
count.

    .venv/bin/python bench/fix_coverage.py                      # 200 generated + QuixBugs
    .venv/bin/python bench/fix_coverage.py --n-tasks 600 --quixbugs DIR

QuixBugs by default is what the repository holds: the converted task folders under
tests/fixtures/external_quixbugs (6 real programs); pass `--quixbugs` a folder of all 40
converted ones (`agentrl tasks import --from quixbugs CHECKOUT --out DIR`) to measure those.

Writes OUT/fix-coverage.md and .json (default bench/results/fix-coverage-<date>.*); prints
the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.batch_eval import wilson_interval  # noqa: E402
from components.env.tool_sets.fix_search.fixes import candidate_fixes, operator_fixes  # noqa: E402
from components.env.tool_sets.fix_search.neighbourhood import neighbourhood  # noqa: E402
from components.scripted.reference import fixed_files  # noqa: E402
from components.tasks.mutations import normalize  # noqa: E402
from components.tasks.task import Task, load_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# "grammar, uncut": the whole one-edit neighbourhood (no limit): is a fix missed by the
# neighbourhood itself or by the cut at --limit?
LISTINGS = ("operators", "grammar", "grammar localised", "grammar, uncut")


def test_output(task: Task, timeout_s: float = 60.0) -> str:
    """The visible tests' output on the buggy repository (a temporary copy), run in the
    sandbox as list_fixes runs them: imported benchmark code never runs on the host."""
    import dataclasses

    from components.env.config import EnvConfig
    from components.env.tool_sets.fix_search.tools import fix_test_argv
    from components.sandbox.config import SandboxConfig, SandboxError
    from components.sandbox.process import run_sandboxed

    with tempfile.TemporaryDirectory(prefix="fix-coverage-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, repo)
        # as list_fixes runs them: every failure, a per-test timeout
        argv = fix_test_argv(task.test_command, EnvConfig().fix_test_timeout_s, every_failure=True)
        limits = dataclasses.replace(
            SandboxConfig(), wall_time_s=timeout_s, cpu_time_s=int(timeout_s) + 1
        )
        try:
            return run_sandboxed(argv, repo, limits).output
        except SandboxError:
            return ""


def measure_task(task: Task, limit: int, localise: bool) -> dict | None:
    """Per listing: (listed size, rank of the fix or None); None if not a one-file fix."""
    files = fixed_files(task)
    if len(files) != 1:
        return None
    path, (before, after) = next(iter(files.items()))
    target = normalize(after) + "\n"
    try:
        listings = {
            "operators": operator_fixes(before, limit),
            "grammar": candidate_fixes(before, limit),
        }
        if localise:
            output = test_output(task)
            listings["grammar localised"] = candidate_fixes(before, limit, output, path)
        listings["grammar, uncut"] = neighbourhood(before)
        full = len(listings["grammar, uncut"])
    except SyntaxError:
        return None
    row: dict = {"task": task.id, "bug_class": task.metadata.bug_class, "full": full}
    for name, candidates in listings.items():
        rank = next((i for i, c in enumerate(candidates) if c.source == target), None)
        row[name] = {"size": len(candidates), "rank": rank}
    return row


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


def summarize(rows: list[dict], suite: str) -> list[dict]:
    out = []
    for name in LISTINGS:
        got = [r[name] for r in rows if name in r]
        if not got:
            continue
        hit = [g["rank"] for g in got if g["rank"] is not None]
        sizes = [g["size"] for g in got]
        full = [r["full"] for r in rows] if name != "operators" else None
        out.append(
            {
                "suite": suite,
                "listing": name,
                "n": len(got),
                "covered": len(hit),
                "coverage": len(hit) / len(got),
                "ci": wilson_interval(len(hit), len(got)),
                "size_p50": statistics.median(sizes),
                "size_p90": _quantile(sizes, 0.9),
                "rank_p50": statistics.median(hit) + 1 if hit else None,
                "full_p50": statistics.median(full) if full is not None else None,
                "full_p90": _quantile(full, 0.9) if full is not None else None,
            }
        )
    return out


def table(summary: list[dict]) -> str:
    lines = [
        "| suite | listing | n | fix listed [95% CI] | listing size p50 / p90 | "
        "rank of the fix p50 | uncut neighbourhood p50 / p90 |",
        "|" + "---|" * 7,
    ]
    for s in summary:
        full = f"{s['full_p50']:g} / {s['full_p90']:g}" if s["full_p50"] is not None else ""
        rank = f"{s['rank_p50']:g}" if s["rank_p50"] is not None else ""
        lines.append(
            f"| {s['suite']} | {s['listing']} | {s['n']} | {s['covered']}/{s['n']} = "
            f"{s['coverage']:.0%} [{s['ci'][0]:.0%}, {s['ci'][1]:.0%}] | "
            f"{s['size_p50']:g} / {s['size_p90']:g} | {rank} | {full} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-tasks", type=int, default=200, help="generated suite size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=64, help="listing cut (EnvConfig.max_fixes)")
    p.add_argument(
        "--quixbugs",
        type=Path,
        default=ROOT / "tests/fixtures/external_quixbugs",
        help="folder of converted QuixBugs task folders",
    )
    p.add_argument(
        "--no-localise",
        dest="localise",
        action="store_false",
        help="skip the test runs (no 'grammar localised' rows)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench/results")
    p.add_argument("--name", default=f"fix-coverage-{time.strftime('%Y-%m-%d')}")
    args = p.parse_args(argv)
    from components.tasks.generate import generate_suite

    started = time.monotonic()
    summary, rows_out = [], {}
    with tempfile.TemporaryDirectory(prefix="fix-coverage-suite-") as tmp:
        generate_suite(Path(tmp) / "suite", args.n_tasks, args.seed)
        for split in ("train", "val", "test"):
            tasks, _ = load_tasks(Path(tmp) / "suite", split=split)
            rows = [r for t in tasks if (r := measure_task(t, args.limit, args.localise))]
            summary += summarize(rows, f"generated {split}")
            rows_out[f"generated {split}"] = rows
    quix, errors = load_tasks(args.quixbugs)
    rows = [r for t in quix if (r := measure_task(t, args.limit, args.localise))]
    summary += summarize(rows, f"QuixBugs ({len(rows)} programs)")
    rows_out["quixbugs"] = rows
    md = table(summary)
    quixbugs = args.quixbugs
    if quixbugs.is_relative_to(ROOT):
        quixbugs = quixbugs.relative_to(ROOT)
    per_program = ", ".join(
        f"{r['task']} "
        + "/".join(
            "-" if r[n]["rank"] is None else str(r[n]["rank"] + 1) for n in LISTINGS if n in r
        )
        for r in rows
    )
    report = (
        f"# bench/fix_coverage.py\n\nsettings: n_tasks={args.n_tasks}, seed={args.seed}, "
        f"limit={args.limit}, quixbugs={quixbugs}, "
        f"localise={args.localise}\n\n{md}\n\nQuixBugs per program (rank of the fix, 1 = "
        f"first; - = not listed): {per_program}"
        f" ({' / '.join(n for n in LISTINGS if not rows or n in rows[0])})"
        f"\n\nwall {time.monotonic() - started:.0f} s\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(report)
    (args.out / f"{args.name}.json").write_text(
        json.dumps(
            {"summary": summary, "rows": rows_out, "load_errors": errors}, indent=1, default=str
        )
    )
    print(report)
    print(f"written: {args.out / args.name}.md, .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
