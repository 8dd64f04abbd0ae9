"""Environment throughput, measured side by side in one run.

1. Verified oracle episodes per second with 1 and with 2 workers.
2. One sandboxed test run vs a bare `python -m pytest` of the same repo (interleaved, so
   both see the same machine load), as a ratio of medians.
3. Verification per episode, interleaved on the same oracle trees: "plain" runs the
   processes verification ran before issue 17 (hidden tests by `python -m pytest` in one
   copy, the hidden-case run in another, lint) vs `verify` (snapshot, fresh trees, cases
   first, harness + recorder + canary, derived cases), with the verdict cache off. The
   issue's bar: at most 15% slower.
4. A GRPO-like workload: groups of --group episodes per task whose final trees are drawn
   from a few outcomes (the reference fix, the untouched repo, listed one-edit fixes), as
   sampled completions of one prompt often coincide: seconds per verification and the
   verdict cache's hit rate.

    .venv/bin/python bench/env_throughput.py [--tasks 40] [--repeats 20] [--group 8]

With --vs REF (a git revision) it measures only verified oracle episodes per second, the
code at REF ("before") against this checkout ("after"): each measurement a fresh process
over the same generated tasks, the two interleaved for --rounds rounds (alternating which
goes first) so both see the same machine load; the medians and their ratio are printed
side by side and written to --out (issue 31's bar: after/before >= 0.95).

    .venv/bin/python bench/env_throughput.py --vs 3704343 [--tasks 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from components.env.batch_eval import EvalConfig, evaluate_policy
from components.env.config import EnvConfig
from components.env.tool_sets.fix_search.fixes import candidate_fixes
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import isolation_report
from components.sandbox.process import run_sandboxed
from components.scripted.registry import make_policy
from components.tasks.generate import GenerateConfig, generate_suite
from components.tasks.patching import apply_unified_diff
from components.tasks.task import Task, load_tasks
from components.verifier.cache import clear_verdict_cache, verdict_cache_info
from components.verifier.hidden_cases import CASE_RUNNER, hidden_cases
from components.verifier.lint import introduced_findings
from components.verifier.verdict import verify

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_table  # noqa: E402


def episodes_per_second(tasks, workers: int) -> tuple[float, int]:
    clear_verdict_cache()  # each setting verifies every tree itself
    t0 = time.perf_counter()
    results = evaluate_policy(
        tasks,
        lambda: make_policy("oracle"),
        EnvConfig(),
        SandboxConfig(),
        EvalConfig(workers=workers),
    )
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
            env = {
                **os.environ,
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTEST_PLUGINS": "pytest_timeout",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
            subprocess.run(
                [sys.executable, *argv[1:]], cwd=repo, capture_output=True, check=False, env=env
            )
            bare.append(time.perf_counter() - t0)
    return statistics.median(sandboxed), statistics.median(bare)


def fixed_repo(task: Task, dest: Path) -> Path:
    shutil.copytree(task.repo_dir, dest)
    apply_unified_diff(dest, task.reference_patch() or "")
    return dest


def plain_verify(task: Task, repo: Path, env: EnvConfig, sandbox: SandboxConfig) -> None:
    """The processes verification ran before issue 17, for the same tree: one copy with the
    hidden tests run by `python -m pytest`, lint, and when they pass a copy without them for
    the hidden cases."""
    cfg = dataclasses.replace(sandbox, wall_time_s=env.verify_timeout_s)
    with tempfile.TemporaryDirectory(prefix="agentrl-plain-") as tmp:
        tree = Path(tmp) / "repo"
        shutil.copytree(repo, tree)
        for rel in task.hidden_test_files():
            shutil.copyfile(task.hidden_tests_dir / rel, tree / rel)
        introduced_findings(task.repo_dir, tree, [task.metadata.extra.get("module", "")])
        pytest = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        timeout = f"--timeout={env.per_test_timeout_s:g}"
        tests = run_sandboxed([*pytest, timeout, *task.hidden_test_files()], tree, cfg)
        cases, _ = hidden_cases(task)
        if cases and tests.exit_code == 0:
            cases_tree = Path(tmp) / "cases"
            shutil.copytree(repo, cases_tree)
            token = secrets.token_hex(4)
            (cases_tree / "runner.py").write_text(CASE_RUNNER)
            (cases_tree / "args.json").write_text(
                json.dumps([[c["module"], c["function"], c["args"]] for c in cases])
            )
            run_sandboxed(
                ["python", "runner.py", token, "args.json", f"{env.per_test_timeout_s:g}"],
                cases_tree,
                cfg,
            )


def verification_overhead(tasks, repeats: int) -> tuple[float, float]:
    """Median seconds per verification (plain, hardened), interleaved on oracle trees."""
    env, sandbox = EnvConfig(), SandboxConfig()
    plain, hardened = [], []
    with tempfile.TemporaryDirectory() as tmp:
        trees = [fixed_repo(t, Path(tmp) / t.id) for t in tasks]
        for i in range(repeats):
            task, tree = tasks[i % len(tasks)], trees[i % len(tasks)]
            t0 = time.perf_counter()
            plain_verify(task, tree, env, sandbox)
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            v = verify(task, tree, env, sandbox, cache=False)
            hardened.append(time.perf_counter() - t0)
            if not v.tests_passed:
                raise RuntimeError(f"{task.id}: the oracle tree did not verify: {v.detail}")
    return statistics.median(plain), statistics.median(hardened)


def grpo_workload(tasks, group: int, seed: int = 0) -> tuple[float, float, int]:
    """(seconds per verification, cache hit rate, verifications) over groups of `group`
    final trees per task, each drawn from the task's few likely outcomes."""
    rng = random.Random(seed)
    env, sandbox = EnvConfig(), SandboxConfig()
    clear_verdict_cache()
    n = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            module = task.metadata.extra["module"]
            text = (task.repo_dir / module).read_text()
            outcomes = ["fix", "untouched", *[c.source for c in candidate_fixes(text, 3)]]
            for g in range(group):
                tree = Path(tmp) / f"{task.id}-{g}"
                pick = rng.choice(outcomes)
                if pick == "fix":
                    fixed_repo(task, tree)
                else:
                    shutil.copytree(task.repo_dir, tree)
                    if pick != "untouched":
                        (tree / module).write_text(pick)
                verify(task, tree, env, sandbox)
                n += 1
    info = verdict_cache_info()
    return (time.perf_counter() - t0) / n, info["hits"] / max(1, info["hits"] + info["misses"]), n


# One measurement in a fresh interpreter, with only the APIs the reference code has too.
_MEASURE = """
import sys, time
from components.env.config import EnvConfig
from components.env.batch_eval import EvalConfig, evaluate_policy
from components.sandbox.config import SandboxConfig
from components.scripted.registry import make_policy
from components.tasks.task import load_tasks
tasks = load_tasks(sys.argv[1])[0][: int(sys.argv[2])]
t0 = time.perf_counter()
results = evaluate_policy(tasks, lambda: make_policy("oracle"), EnvConfig(), SandboxConfig(),
                          EvalConfig(workers=int(sys.argv[3])))
elapsed = time.perf_counter() - t0
print(len(results) / elapsed, sum(r.success for r in results))
"""


def _measure(code_root: Path, tasks_dir: Path, n: int, workers: int) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tasks_dir), str(n), str(workers)],
        cwd=code_root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"measurement at {code_root} failed: {out.stderr[-2000:]}")
    eps, ok = out.stdout.split()[-2:]
    return float(eps), int(ok)


def vs_reference(ref: str, n: int, rounds: int, workers: int, out_dir: Path) -> float:
    """Episodes/s of the code at `ref` vs this checkout, interleaved; returns after/before."""
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-vs-") as tmp:
        before_root = Path(tmp) / "before"
        before_root.mkdir()
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before_root)], input=archive.stdout, check=True)
        tasks_dir = Path(tmp) / "tasks"
        generate_suite(tasks_dir, GenerateConfig(n_tasks=max(n, 30), seed=123))
        roots = {"before": before_root, "after": ROOT}
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(rounds):
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                eps, ok = _measure(roots[side], tasks_dir, n, workers)
                if ok != n:
                    raise RuntimeError(f"{side}: the oracle solved {ok}/{n}")
                runs[side].append(eps)
                print(f"  round {r + 1} {side:>6}: {eps:6.2f} verified episodes/s", flush=True)
    before, after = statistics.median(runs["before"]), statistics.median(runs["after"])
    ratio = after / before
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    text = "\n".join(
        [
            f"# env throughput: {ref} (before) vs {head} + working tree (after)",
            "",
            f"isolation: {isolation_report(SandboxConfig()).get('summary', '')}",
            f"{n} oracle episodes per measurement, workers={workers}, {rounds} interleaved "
            "rounds, each a fresh process (medians)",
            "",
            "| code | verified episodes/s (median) | runs |",
            "|---|---|---|",
            f"| before ({ref}) | {before:.2f} | {', '.join(f'{x:.2f}' for x in runs['before'])} |",
            f"| after ({head}) | {after:.2f} | {', '.join(f'{x:.2f}' for x in runs['after'])} |",
            "",
            f"after/before: {ratio:.3f} (bar: >= 0.95)",
            "",
        ]
    )
    write_table(text, out_dir, "env-throughput-vs")
    return ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", type=int, default=40, help="episodes per worker setting")
    p.add_argument("--repeats", type=int, default=20, help="paired test runs / verifications")
    p.add_argument("--group", type=int, default=8, help="episodes per task in the GRPO workload")
    p.add_argument("--vs", default="", help="git revision to compare episodes/s with")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds with --vs")
    p.add_argument("--workers", type=int, default=1, help="episode workers with --vs")
    p.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="where --vs writes its table"
    )
    args = p.parse_args()
    if args.vs:
        vs_reference(args.vs, args.tasks, args.rounds, args.workers, args.out)
        return
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
        print(f"  sandbox overhead ratio:      {sb / bare:.2f}x  (aim < 1.5x)\n")
        plain, hardened = verification_overhead(tasks, args.repeats)
        print(f"  median verification, plain (before issue 17): {plain * 1000:7.1f} ms")
        print(f"  median verification, hardened (verify):        {hardened * 1000:7.1f} ms")
        print(f"  verification overhead ratio: {hardened / plain:.2f}x  (bar: <= 1.15x)\n")
        per, hit_rate, n = grpo_workload(tasks, args.group)
        print(
            f"  GRPO-like workload ({n} verifications, groups of {args.group}): "
            f"{per * 1000:.1f} ms per verification, cache hit rate {hit_rate:.0%}"
        )


if __name__ == "__main__":
    main()
