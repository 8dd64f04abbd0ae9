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
    evaluation = run("evaluate", ["evaluate", "run", "--tasks", tasks, "--model", policy,
                     "--out", str(w / "eval"), "--preset", preset],
                     str(w / "eval" / "metrics.json"))  # fmt: skip
    stages.track("evaluate", parent, {"model": model}, evaluation,
                 [str(w / "eval" / "report.md")])  # fmt: skip
    safety = run("safety", ["evaluate", "safety", "--out", str(w / "safety"), "--model", policy,
                 "--preset", preset], str(w / "safety" / "safety.json"))  # fmt: skip
    stages.track("safety", parent, {"model": model}, safety, [str(w / "safety" / "safety.md")])
    stages.close_run(parent, "FINISHED", {})
    return {"evaluation": evaluation["candidate"]["overall"], "safety": safety}


def main(argv: list[str] | None = None) -> int:
    from components.cli import cpu_accelerator_default

    cpu_accelerator_default()
    p = argparse.ArgumentParser(prog="python -m flows.evaluate", description=__doc__)
    p.add_argument("--model", default="champion")
    p.add_argument("--tasks", default="runs/pipeline/tasks")
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--out", default="runs/evaluate")
    a = p.parse_args(argv)
    result = evaluate(a.model, a.tasks, a.preset, a.out)
    print(f"success {result['evaluation']['success_rate']:.1%}; report {a.out}/eval/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
