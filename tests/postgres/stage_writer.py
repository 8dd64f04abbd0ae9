"""One stage process of the PostgreSQL tier: what a pipeline stage writes to MLflow at the
end of its work, all at once with seven others: a run with its params, a metric curve,
a trace, and a version of the shared registered model.

    python tests/postgres/stage_writer.py TRACKING_URI EXPERIMENT_ID MODEL INDEX STEPS

Prints one JSON line: {"run_id", "version", "errors"}; exit 1 on any error."""

from __future__ import annotations

import json
import sys
import traceback


def main(uri: str, experiment_id: str, model: str, index: int, steps: int) -> int:
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    out: dict = {"run_id": None, "version": None, "errors": []}
    try:
        with mlflow.start_run(experiment_id=experiment_id, run_name=f"stage-{index}") as run:
            out["run_id"] = run.info.run_id
            mlflow.log_params({"stage": index, "steps": steps})
            for step in range(steps):
                mlflow.log_metric("loss", round(1.0 / (step + 1) + index, 6), step=step)
            mlflow.log_metrics({"reward": index / 10, "episodes": steps})
            with mlflow.start_span(name=f"stage-{index}") as span:
                span.set_inputs({"stage": index})
                span.set_outputs({"episodes": steps})
            mlflow.log_text(f"stage {index}\n", "model/README.txt")
            version = client.create_model_version(
                model, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
            )
            out["version"] = int(version.version)
    except Exception as e:  # noqa: BLE001 - reported as data: the test names every error
        out["errors"].append(f"{type(e).__name__}: {e}"[:500])
        traceback.print_exc()
    print(json.dumps(out), flush=True)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    uri, experiment_id, model, index, steps = sys.argv[1:6]
    sys.exit(main(uri, experiment_id, model, int(index), int(steps)))
