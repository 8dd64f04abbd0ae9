"""evaluate: held-out metrics + safety suite for a checkpoint or a registered model alias.

.venv/bin/python -m flows.evaluate --model champion [--split test] [--limit 24]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefect import flow

from flows import stages


@flow(name="evaluate", log_prints=True)
def evaluate(model: str = "champion", tasks: str = "runs/pipeline/tasks", split: str = "test",
             limit: int = 0, out: str = "runs/evaluate") -> dict:  # fmt: skip
    """`model` is a checkpoint folder or an alias/version of the registered model."""
    from components.promote.config import load_config
    from components.promote.registry import download_version

    policy = model if Path(model).is_dir() else str(download_version(model, load_config()))
    w = Path(out)
    parent = stages.open_run(f"evaluate {model}", {"model": model, "split": split}, {})
    evaluation = stages.run.with_options(refresh_cache=True)("evaluate", ["evaluate", "run", "--tasks", tasks, "--split", split,
                            "--model", policy, *(["--limit", str(limit)] if limit else []),
                            "--out", str(w / "eval")], str(w / "eval" / "metrics.json"))  # fmt: skip
    stages.track("evaluate", parent, {"model": model}, evaluation,
                 [str(w / "eval" / "report.md")])  # fmt: skip
    safety = stages.run.with_options(refresh_cache=True)("safety", ["evaluate", "safety", "--out", str(w / "safety"),
                        "--model", policy], str(w / "safety" / "safety.json"))  # fmt: skip
    stages.track("safety", parent, {"model": model}, safety, [str(w / "safety" / "safety.md")])
    stages.close_run(parent, "FINISHED", {})
    return {"evaluation": evaluation["candidate"]["overall"], "safety": safety}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.evaluate", description=__doc__)
    p.add_argument("--model", default="champion")
    p.add_argument("--tasks", default="runs/pipeline/tasks")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--out", default="runs/evaluate")
    a = p.parse_args(argv)
    result = evaluate(a.model, a.tasks, a.split, a.limit, a.out)
    print(f"success {result['evaluation']['success_rate']:.1%}; report {a.out}/eval/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
