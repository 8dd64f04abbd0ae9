"""evaluate: held-out metrics + safety suite for a checkpoint or a registered model alias,
with the preset's env, sandbox, rollout and evaluate sections (the settings it was trained
with; the preset's `evaluate` section says which splits and how many tasks).

.venv/bin/python -m flows.evaluate --model champion [--preset configs/cpu-demo.yaml]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefect import flow

from components.preset import DEFAULT_PRESET
from flows import stages


@flow(name="evaluate", log_prints=True)
def evaluate(model: str = "champion", tasks: str = "runs/pipeline/tasks",
             preset: str = DEFAULT_PRESET, out: str = "runs/evaluate") -> dict:  # fmt: skip
    """`model` is a checkpoint folder or an alias/version of the registered model."""
    from components.preset import load_preset
    from components.promote.registry import download_version

    p = load_preset(preset)
    policy = model if Path(model).is_dir() else str(download_version(model, p.section("promote")))
    w = Path(out)
    parent = stages.open_run(f"evaluate {model}", {"model": model, "preset": preset}, {})
    run = stages.run.with_options(refresh_cache=True)
    common = ["--model", policy, "--preset", preset]
    eval_argv = ["evaluate", "run", "--tasks", tasks, "--out", str(w / "eval"), *common]
    safety_argv = ["evaluate", "safety", "--out", str(w / "safety"), *common]
    status = "FAILED"  # the parent run says how it ended, not RUNNING for ever
    try:
        evaluation = run("evaluate", eval_argv, str(w / "eval" / "metrics.json"))
        stages.track("evaluate", parent, {"model": model}, evaluation, [str(w / "eval/report.md")])
        safety = run("safety", safety_argv, str(w / "safety" / "safety.json"))
        stages.track("safety", parent, {"model": model}, safety, [str(w / "safety/safety.md")])
        status = "FINISHED"
    finally:
        stages.close_run(parent, status, {})
    return {"evaluation": evaluation["candidate"]["overall"], "safety": safety}


PROG = "python -m flows.evaluate"


def run(a: argparse.Namespace) -> int:
    """The flow with Prefect's API as every entry point gets it (flows/retrain_main.py
    `prefect_api`: health-waited with the preset's `runtime.startup_timeout_s`), in a
    thread of its own so Ctrl-C and SIGTERM stay with components/shutdown.py's handler."""
    from components.preset import load_preset
    from components.shutdown import in_worker_thread
    from flows.retrain_main import RunScope, prefect_api

    preset = load_preset(a.preset)
    if not Path(a.model).is_dir():  # an alias or version the registry lacks: before anything
        from components.cli_args import UsageError
        from flows.reproduce import resolve_version

        try:
            resolve_version(a.model, preset.section("promote"))
        except ValueError as e:
            raise UsageError(f"{PROG}: --model: {e}") from None
    budget = preset.section("runtime").startup_timeout_s
    scope = RunScope()
    try:
        with prefect_api(budget):
            result = in_worker_thread(lambda: evaluate(a.model, a.tasks, a.preset, a.out))
    finally:
        scope.close()
    print(f"success {result['evaluation']['success_rate']:.1%}; report {a.out}/eval/report.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    from components.cli import boundary, cpu_accelerator_default
    from components.cli_args import ArgumentParser, preset_file

    cpu_accelerator_default()
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--model", default="champion")
    p.add_argument("--tasks", default="runs/pipeline/tasks")
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    p.add_argument("--out", default="runs/evaluate")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    argv = list(sys.argv[1:] if argv is None else argv)
    return boundary(lambda: run(p.parse_args(argv)), PROG, debug="--debug" in argv)


if __name__ == "__main__":
    sys.exit(main())
