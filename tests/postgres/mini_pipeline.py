"""The PostgreSQL tier's pipeline run: the retrain flow's own pieces (flows/stages.py: the
parent MLflow run, the cross-links to Prefect, a real stage run by the launcher and tracked
as its child run, the run closed with its metrics) in one Prefect flow, against the Prefect
API and MLflow server the environment names (PREFECT_API_URL, MLFLOW_TRACKING_URI).

    python tests/postgres/mini_pipeline.py OUT_DIR

Prints one JSON line: {"flow_run_id", "run_id", "tasks"}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(out: str) -> int:
    from prefect import flow
    from prefect.runtime import flow_run

    from flows import stages

    @flow(name="pg-tier-pipeline")
    def pipeline(out: str) -> dict:
        run_id = stages.open_run("pg-tier", {"preset": "pg-tier"}, {"tier": "postgres"})
        stages.link_runs(run_id)
        suite = Path(out) / "tasks"
        argv = ["tasks", "generate", "--out", str(suite), "--n", "2", "--overwrite"]
        result = stages.run("generate", argv, str(suite / "suite.json"))
        stages.track("generate", run_id, {"n": 2}, result, [str(suite / "suite.json")])
        stages.close_run(run_id, "FINISHED", {"approval": "none"}, {"tasks": len(result)})
        return {"flow_run_id": str(flow_run.id), "run_id": run_id, "tasks": len(result)}

    print(json.dumps(pipeline(out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
