"""Mine tasks from real pure-Python libraries downloaded from PyPI now, then check them end
to end, and time mining and preparing (issue 21).

Per library: `pip download --no-binary :all: --no-deps NAME==VERSION` (the sdist, with its
tests), extract it, `mine_repository` (components/tasks/mine.py) with the library's own
environment (a Python version per library, so the tasks really run with different
interpreters; a library whose tests need packages gets them installed from PyPI as
wheels), then the oracle, noop and scripted-baseline policies on the mined tasks
through components/evaluate/episodes.run_policy (what `agentrl env eval` runs), each episode
in the sandbox with the task's environment, verified by the verifier with it. Then every
environment is prepared again from a cold cache (`prepare_environments`) and from a warm one.

    .venv/bin/python scripts/mine_real_libraries.py [--max-candidates 12] [--max-tasks 6]
        [--out DIR] [--results bench/results/mine-real-libraries.md]
    .venv/bin/python scripts/mine_real_libraries.py --local minilib=tests/fixtures/mine_repo
        (no download: the smoke test's offline form)

Writes a markdown table (and the JSON next to it) with, per library: mutants tried, kept,
why the others were dropped, setup / mutant-test / gate seconds, tasks per minute, and
oracle / noop / scripted-baseline success; then prepare times (cold and warm).
"""

from __future__ import annotations

import argparse
import dataclasses
import email.parser
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.config import EnvConfig  # noqa: E402
from components.env.sandbox import SandboxConfig  # noqa: E402
from components.env.verifier import sandboxed_test_runner  # noqa: E402
from components.tasks.environments import (  # noqa: E402
    PrepareConfig,
    prepare_environments,
    task_python_env,
)
from components.tasks.mine import MineConfig, mine_repository  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402

# name, version, Python of its environment, split ("auto": by module; else the whole
# library), what its tests need from the registry (installed as wheels by `prepare`)
LIBRARIES = (
    ("inflection", "0.5.1", "3.11", "train", ()),
    ("parse", "1.20.2", "3.12", "auto", ()),
    ("toolz", "1.0.0", "3.11", "auto", ()),
    ("cachetools", "5.5.0", "3.13", "test", ()),  # src/ layout; a library held out whole
    ("bleach", "6.1.0", "3.12", "auto", ("six==1.16.0", "webencodings==0.5.1", "tinycss2==1.2.1")),
)
POLICIES = ("oracle", "noop", "scripted-baseline")


def download(name: str, version: str, dest: Path) -> tuple[Path, dict]:
    """The sdist, extracted: (its root folder, where it came from)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-q", "-d", str(dest),
                    f"{name}=={version}"], check=True, timeout=300)  # fmt: skip
    (sdist,) = [p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip"))]
    with tarfile.open(sdist) as tar:
        tar.extractall(dest / "src", filter="data")  # no links or paths out of dest
    (root,) = [p for p in (dest / "src").iterdir() if p.is_dir()]
    info = email.parser.Parser().parsestr((root / "PKG-INFO").read_text(errors="replace"))
    upstream = {"name": name, "version": version, "sdist": sdist.name,
                "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
                "url": f"https://pypi.org/project/{name}/{version}/",
                "license": info.get("License") or info.get("License-Expression") or ""}  # fmt: skip
    return root, upstream


def evaluate(tasks, sandbox: SandboxConfig) -> dict[str, dict]:
    """Success per policy over `tasks`, each episode with its task's environment."""
    from components.evaluate.episodes import run_policy
    from components.rollout.config import RolloutConfig

    groups: dict[str, list] = {}
    for task in tasks:
        groups.setdefault(task_python_env(task, sandbox.environments_dir), []).append(task)
    out = {}
    for policy in POLICIES:
        start, results = time.monotonic(), []
        for python_env, group in sorted(groups.items()):
            # EpisodeEnv takes the sandbox as given: the group's environment is set here.
            cfg = dataclasses.replace(sandbox, python_env=python_env)
            results += run_policy(group, policy, rollout=RolloutConfig(), env=EnvConfig(),
                                  sandbox=cfg, workers=2)  # fmt: skip
        ok = [r for r in results if r.status == "ok"]
        out[policy] = {"episodes": len(results), "success": sum(r.success for r in ok),
                       "infra": len(results) - len(ok),
                       "forged": sum(r.verdict_forged for r in results),
                       "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
    return out


def mine_library(lib: tuple, root: Path, upstream: dict, out: Path, args, sandbox) -> dict:
    name, version, python, split, requirements = lib
    config = MineConfig(seed=args.seed, max_candidates=args.max_candidates,
                        max_tasks=args.max_tasks, python=python, split=split,
                        budget_s=args.budget_s)  # fmt: skip
    report = mine_repository(root, out / name, config=config, sandbox=sandbox,
                             run_tests=sandboxed_test_runner(EnvConfig(), sandbox),
                             name=f"{name}-{version}" if version else name,
                             upstream=upstream, requirements=requirements)  # fmt: skip
    print(report.line(), flush=True)
    row = dataclasses.asdict(report)
    row.pop("drops")
    row["library"], row["python"] = f"{name} {version}".strip(), python
    row["requirements"] = list(requirements)
    row["tasks_per_min"] = round(60 * len(report.kept) / max(report.seconds, 1e-9), 2)
    tasks = [t for t in load_tasks(out / name)[0]] if report.kept else []
    row["splits"] = {s: sum(t.metadata.split == s for t in tasks) for s in ("train", "val", "test")}
    row["eval"] = evaluate(tasks, sandbox) if tasks else {}
    return row


def prepare_bench(out: Path, cache: Path) -> dict:
    tasks, _ = load_tasks(out)
    result = {"tasks": len(tasks)}
    for state in ("cold", "warm"):
        start = time.monotonic()
        prepared = prepare_environments(tasks, PrepareConfig(cache_dir=str(cache)))
        seconds = time.monotonic() - start
        result[state] = {"seconds": round(seconds, 2), "environments": len(prepared),
                         "built": sum(p.built for p in prepared),
                         "errors": [p.error for p in prepared if p.error],
                         "tasks_per_min": round(60 * len(tasks) / max(seconds, 1e-9), 1)}  # fmt: skip
    return result


def table(rows: list[dict], prep: dict, args) -> str:
    lines = [f"# Mining real libraries (issue 21), {time.strftime('%Y-%m-%d', time.gmtime())}", "",
             f"`.venv/bin/python scripts/mine_real_libraries.py --max-candidates "
             f"{args.max_candidates} --max-tasks {args.max_tasks} --seed {args.seed}` on "
             f"{os.cpu_count()} cores (shared with other work), bubblewrap sandbox.", "",
             "Requirements: " + ("; ".join(f"{r['library']}: {', '.join(r['requirements'])}"
                                           for r in rows if r["requirements"]) or "none")
             + " (from PyPI as wheels; the others need none).", "",
             "| library | python | tests | candidates | tried | kept | dropped | setup s | "
             "mutant tests s | gate s | mined tasks/min | splits | oracle | noop | "
             "scripted-baseline |", "|" + "---|" * 15]  # fmt: skip
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['library']} | {r['python']} | error: {r['error']} |" + " |" * 12)
            continue
        ev = r["eval"]
        cell = {p: f"{ev[p]['success']}/{ev[p]['episodes']}" if p in ev else "-" for p in POLICIES}
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(r["dropped"].items())) or "-"
        splits = " ".join(f"{k}={v}" for k, v in r["splits"].items() if v)
        lines.append(f"| {r['library']} | {r['python']} | {r['tests']} | {r['candidates']} | "
                     f"{r['tried']} | {len(r['kept'])} | {dropped} | {r['setup_s']:.1f} | "
                     f"{r['mutant_tests_s']:.1f} | {r['gate_s']:.1f} | {r['tasks_per_min']} | "
                     f"{splits} | {cell['oracle']} | {cell['noop']} | "
                     f"{cell['scripted-baseline']} |")  # fmt: skip
    kept = sum(len(r["kept"]) for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    lines += ["", f"Mining overall: {kept} tasks in {seconds:.0f} s = "
              f"{60 * kept / max(seconds, 1e-9):.1f} tasks/min (setup + mutant tests + gate).", "",
              f"Preparing the {prep['tasks']} mined tasks' environments: cold cache "
              f"{prep['cold']['seconds']} s ({prep['cold']['built']} built of "
              f"{prep['cold']['environments']}) = {prep['cold']['tasks_per_min']} tasks/min; "
              f"warm cache {prep['warm']['seconds']} s = {prep['warm']['tasks_per_min']} "
              "tasks/min."]  # fmt: skip
    forged = sum(r["eval"][p]["forged"] for r in rows if r.get("eval") for p in r["eval"])
    lines.append(f"Verdicts flagged forged across all episodes: {forged}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-candidates", type=int, default=12)
    p.add_argument("--max-tasks", type=int, default=6)
    p.add_argument("--budget-s", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="keep the mined tasks here")
    p.add_argument("--local", action="append", default=[],
                   help="NAME=PATH: mine this folder instead of downloading (repeatable)")  # fmt: skip
    p.add_argument("--results", type=Path, default=None, help="write the markdown table here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentrl-mine-libs-") as tmp:
        work = Path(tmp)
        out = args.out or work / "tasks"
        sandbox = SandboxConfig(environments_dir=str(work / "envs"))
        sources = [((n, "", "3.11", "auto", ()), Path(path), {"name": n, "local": True})
                   for n, path in (s.split("=", 1) for s in args.local)]  # fmt: skip
        if not sources:
            sources = [(lib, *download(lib[0], lib[1], work / "sdists" / lib[0]))
                       for lib in LIBRARIES]  # fmt: skip
        rows = [mine_library(lib, root, up, out, args, sandbox) for lib, root, up in sources]
        prep = prepare_bench(out, work / "cold-cache")
    text = table(rows, prep, args)
    print(text)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(text)
        args.results.with_suffix(".json").write_text(
            json.dumps({"libraries": rows, "prepare": prep}, indent=2, default=str) + "\n"
        )
    ok = all(r["ok"] and r["eval"] and r["eval"]["oracle"]["success"] == len(r["kept"])
             and r["eval"]["noop"]["success"] == 0 for r in rows)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
