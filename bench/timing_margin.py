"""How far normal test run times are from the time limits that decide rewards, quiet vs
with every core kept busy by a CPU burner, side by side in one run.

For each built-in task: the task's tests (visible + hidden, on the buggy repo) run in the
sandbox as the agent's test command would. Prints the slowest single test phase (pytest
--durations, 10 ms resolution) against the per-test timeouts (EnvConfig.fix_test_timeout_s,
per_test_timeout_s) and the slowest whole sandboxed pytest run against the command wall
limit (SandboxConfig.wall_time_s), with the margin (limit / slowest) for each.

    .venv/bin/python bench/timing_margin.py [--tasks 20] [--burners 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.config import EnvConfig  # noqa: E402
from components.sandbox.config import SandboxConfig  # noqa: E402
from components.sandbox.process import run_sandboxed  # noqa: E402
from components.tasks.generate import generate_suite  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402

PHASE = re.compile(r"^([\d.]+)s (?:call|setup|teardown)", re.M)


def slowest(tasks, sandbox: SandboxConfig) -> tuple[float, float]:
    """(slowest test phase, slowest whole pytest run), seconds, over `tasks`."""
    phase, run = 0.0, 0.0
    argv = ["python", "-m", "pytest", "-q", "--durations=0", "--durations-min=0"]
    for task in tasks:
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp) / "repo"
            shutil.copytree(task.repo_dir, repo)
            shutil.copytree(task.hidden_tests_dir, repo, dirs_exist_ok=True)
            t0 = time.monotonic()
            cmd = run_sandboxed(argv, repo, sandbox, workspace=repo)
            run = max(run, time.monotonic() - t0)
            phase = max([phase, *(float(m.group(1)) for m in PHASE.finditer(cmd.output))])
    return phase, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20)
    p.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    env, sandbox = EnvConfig(), SandboxConfig()
    with tempfile.TemporaryDirectory() as tmp:
        generate_suite(Path(tmp) / "tasks", max(args.tasks, 3), 0)
        tasks = load_tasks(Path(tmp) / "tasks")[0][: args.tasks]
        quiet = slowest(tasks, sandbox)
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.burners)
        ]
        try:
            loaded = slowest(tasks, sandbox)
        finally:
            for b in burners:
                b.kill()
    floor = 0.01  # pytest prints durations in 10 ms steps
    rows = [
        ("slowest test phase vs fix-tool timeout", quiet[0], loaded[0], env.fix_test_timeout_s),
        ("slowest test phase vs hidden-test timeout", quiet[0], loaded[0], env.per_test_timeout_s),
        ("slowest pytest run vs command wall limit", quiet[1], loaded[1], sandbox.wall_time_s),
    ]
    print(f"{len(tasks)} tasks, {args.burners} CPU burners in the loaded column")
    print(f"{'':44} {'quiet s':>8} {'loaded s':>9} {'limit s':>8} {'margin':>8}")
    for name, q, lo, limit in rows:
        print(f"{name:44} {q:8.2f} {lo:9.2f} {limit:8.1f} {limit / max(lo, floor):7.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
