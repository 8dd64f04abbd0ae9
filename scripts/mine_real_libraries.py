"""Mine tasks from real pure-Python libraries downloaded from PyPI now, then check them end
to end, and time mining and preparing (issues 21, 35).

Per library: its sdist fetched the way pip builds it (components/tasks/sdist.py: build
isolation, so setuptools, setuptools_scm, flit_core, hatchling and poetry-core sdists all
come; a version that resolves to 0.0.0 or to another release is refused), extracted, `mine_repository` (components/mining/mine.py) with the library's own
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
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.config import EnvConfig  # noqa: E402
from components.mining.config import MineConfig  # noqa: E402
from components.mining.mine import RepoSource, mine_repository  # noqa: E402
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.tasks.environments import (  # noqa: E402
    PrepareConfig,
    prepare_environments,
    task_python_env,
)
from components.tasks.sdist import SdistError, fetch_sdist  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402
from components.verifier.gate_runner import sandboxed_test_runner  # noqa: E402

# name, version, Python of its environment, split ("auto": by module; else the whole
# library), what its tests need from the registry (installed as wheels by `prepare`);
# the comment names the sdist's build back-end (humanize's pytest configuration names a
# coverage warning class, so its tests need coverage).
_HUMANIZE_TESTS = (
    "freezegun==1.5.1",
    "python-dateutil==2.9.0.post0",
    "six==1.16.0",
    "coverage==7.6.1",
)
LIBRARIES = (
    ("inflection", "0.5.1", "3.11", "train", ()),  # setuptools
    ("parse", "1.20.2", "3.12", "auto", ()),  # setuptools
    ("toolz", "1.0.0", "3.11", "auto", ()),  # setuptools
    ("cachetools", "5.5.0", "3.13", "test", ()),  # setuptools; src/ layout, held out whole
    ("bleach", "6.1.0", "3.12", "auto", ("six==1.16.0", "webencodings==0.5.1", "tinycss2==1.2.1")),
    ("more-itertools", "10.5.0", "3.11", "auto", ()),  # flit_core
    ("pathspec", "0.12.1", "3.12", "auto", ()),  # flit_core
    ("tomlkit", "0.13.2", "3.11", "auto", ("PyYAML==6.0.2",)),  # poetry-core
    ("tabulate", "0.9.0", "3.11", "auto", ()),  # setuptools + setuptools_scm
    ("humanize", "4.10.0", "3.12", "auto", _HUMANIZE_TESTS),  # hatchling + hatch-vcs
)
POLICIES = ("oracle", "noop", "scripted-baseline")


def download(name: str, version: str, dest: Path) -> tuple[Path | None, dict]:
    """The sdist, extracted: (its root folder, where it came from); (None, {"error": ...})
    when it is refused (components/tasks/sdist.py says why)."""
    try:
        sdist = fetch_sdist(f"{name}=={version}", dest)
    except SdistError as e:
        return None, {"name": name, "version": version, "error": str(e)}
    return sdist.root, sdist.upstream


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
            results += run_policy(
                group, policy, rollout=RolloutConfig(), env=EnvConfig(), sandbox=cfg, workers=2
            )
        ok = [r for r in results if r.status == "ok"]
        out[policy] = {
            "episodes": len(results),
            "success": sum(r.success for r in ok),
            "infra": len(results) - len(ok),
            "forged": sum(r.verdict_forged for r in results),
            "seconds": round(time.monotonic() - start, 1),
        }
    return out


def mine_library(lib: tuple, root: Path | None, upstream: dict, out: Path, args, sandbox) -> dict:
    name, version, python, split, requirements = lib
    config = MineConfig(
        seed=args.seed,
        max_candidates=args.max_candidates,
        max_tasks=args.max_tasks,
        python=python,
        split=split,
        budget_s=args.budget_s,
    )
    if root is None:  # the sdist was refused: the library's own reason, nothing mined
        print(f"MINE ERROR {name}-{version}: {upstream['error']}", flush=True)
        return {
            "library": f"{name} {version}",
            "python": python,
            "ok": False,
            "error": upstream["error"],
            "requirements": list(requirements),
            "kept": [],
            "eval": {},
            "seconds": 0.0,
            "build_backend": "",
        }
    source = RepoSource(
        root,
        name=f"{name}-{version}" if version else name,
        requirements=requirements,
        upstream=upstream,
    )
    report = mine_repository(
        source,
        out / name,
        config=config,
        sandbox=sandbox,
        run_tests=sandboxed_test_runner(EnvConfig(), sandbox),
    )
    print(report.line(), flush=True)
    row = dataclasses.asdict(report)
    row.pop("drops")
    row["library"], row["python"] = f"{name} {version}".strip(), python
    row["requirements"] = list(requirements)
    row["build_backend"] = upstream.get("build_backend", "")
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
        result[state] = {
            "seconds": round(seconds, 2),
            "environments": len(prepared),
            "built": sum(p.built for p in prepared),
            "errors": [p.error for p in prepared if p.error],
            "tasks_per_min": round(60 * len(tasks) / max(seconds, 1e-9), 1),
        }
    return result


def table(rows: list[dict], prep: dict, args) -> str:
    needs = [f"{r['library']}: {', '.join(r['requirements'])}" for r in rows if r["requirements"]]
    needs = "; ".join(needs) or "none"
    lines = [
        f"# Mining real libraries (issues 21, 35), {time.strftime('%Y-%m-%d', time.gmtime())}",
        "",
        f"`.venv/bin/python scripts/mine_real_libraries.py --max-candidates "
        f"{args.max_candidates} --max-tasks {args.max_tasks} --seed {args.seed}` on "
        f"{os.cpu_count()} cores (shared with other work), bubblewrap sandbox.",
        "",
        f"Requirements: {needs} (from PyPI as wheels; the others need none).",
        "",
        "| library | back-end | python | tests kept | deselected | candidates | tried | kept | "
        "dropped | setup s | mutant tests s | gate s | mined tasks/min | splits | oracle | "
        "noop | scripted-baseline |",
        "|" + "---|" * 17,
    ]
    for r in rows:
        if not r["ok"]:
            lines.append(
                f"| {r['library']} | {r['build_backend'] or '-'} | {r['python']} | "
                f"refused: {r['error']} |" + " |" * 13
            )
            continue
        ev = r["eval"]
        cell = {p: f"{ev[p]['success']}/{ev[p]['episodes']}" if p in ev else "-" for p in POLICIES}
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(r["dropped"].items())) or "-"
        splits = " ".join(f"{k}={v}" for k, v in r["splits"].items() if v)
        why = "; ".join(sorted({v.split(" (")[0].split(":")[0] for v in r["deselected"].values()}))
        deselected = f"{len(r['deselected'])} ({why})" if r["deselected"] else "0"
        lines.append(
            f"| {r['library']} | {r['build_backend'] or '-'} | {r['python']} | {r['tests']} | "
            f"{deselected} | {r['candidates']} | "
            f"{r['tried']} | {len(r['kept'])} | {dropped} | {r['setup_s']:.1f} | "
            f"{r['mutant_tests_s']:.1f} | {r['gate_s']:.1f} | {r['tasks_per_min']} | "
            f"{splits} | {cell['oracle']} | {cell['noop']} | "
            f"{cell['scripted-baseline']} |"
        )
    kept = sum(len(r["kept"]) for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    mined = sum(bool(r["ok"] and r["kept"]) for r in rows)
    lines += [
        "",
        f"Libraries mined: {mined} of {len(rows)}; refused: "
        + ("; ".join(f"{r['library']} ({r['error']})" for r in rows if not r["ok"]) or "none")
        + ".",
    ]
    lines += [
        "",
        f"Mining overall: {kept} tasks in {seconds:.0f} s = "
        f"{60 * kept / max(seconds, 1e-9):.1f} tasks/min (setup + mutant tests + gate).",
        "",
        f"Preparing the {prep['tasks']} mined tasks' environments: cold cache "
        f"{prep['cold']['seconds']} s ({prep['cold']['built']} built of "
        f"{prep['cold']['environments']}) = {prep['cold']['tasks_per_min']} tasks/min; "
        f"warm cache {prep['warm']['seconds']} s = {prep['warm']['tasks_per_min']} "
        "tasks/min.",
    ]
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
    p.add_argument(
        "--local",
        action="append",
        default=[],
        help="NAME=PATH: mine this folder instead of downloading (repeatable)",
    )
    p.add_argument("--results", type=Path, default=None, help="write the markdown table here")
    p.add_argument(
        "--library", action="append", default=[], help="only this library of LIBRARIES (repeatable)"
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentrl-mine-libs-") as tmp:
        work = Path(tmp)
        out = args.out or work / "tasks"
        sandbox = SandboxConfig(environments_dir=str(work / "envs"))
        sources = [
            ((n, "", "3.11", "auto", ()), Path(path), {"name": n, "local": True})
            for n, path in (s.split("=", 1) for s in args.local)
        ]
        if not sources:
            chosen = [lib for lib in LIBRARIES if not args.library or lib[0] in args.library]
            if not chosen:
                p.error(f"--library: none of {args.library} is in LIBRARIES")
            sources = [(lib, *download(lib[0], lib[1], work / "sdists" / lib[0])) for lib in chosen]
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
    # A refused library is reported, not a failure; every mined one must be sound.
    ok = any(r["ok"] for r in rows) and all(
        r["eval"]["oracle"]["success"] == len(r["kept"]) and r["eval"]["noop"]["success"] == 0
        for r in rows
        if r["ok"] and r["kept"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
