"""Cross-links between Prefect and MLflow (issue 37): a flow run that calls
`stages.link_runs` leaves its id and URL on the MLflow run and the MLflow run's id in its
own tags, and is named like the retrain flow's (`retrain <preset> <UTC time>`), against
a temporary Prefect server and a real MLflow SQLite store."""

import re

import pytest
from prefect import flow

from components import tracking
from components.preset import DEFAULT_PRESET, load_preset
from flows import stages
from flows.retrain import flow_run_name

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@flow(name="link-test", flow_run_name=flow_run_name)
def linked(run_id: str, preset: str = DEFAULT_PRESET, reproduction_of: dict | None = None) -> dict:
    from prefect.runtime import flow_run

    return {"flow_run_id": str(flow_run.id), "links": stages.link_runs(run_id)}


@pytest.mark.timeout(600)
def test_a_flow_run_and_its_mlflow_run_link_each_other(mlflow_store, prefect_harness):
    from prefect import get_client

    parent = tracking.start_pipeline_run("retrain test", {}, {})
    out = linked(parent)
    flow_run_id = out["flow_run_id"]
    tags = mlflow_store.MlflowClient().get_run(parent).data.tags
    assert tags["prefect.flow_run_id"] == flow_run_id
    assert re.fullmatch(rf"https?://\S+/runs/flow-run/{flow_run_id}", tags["prefect.flow_run_url"])
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    assert f"mlflow_run_id:{parent}" in run.tags
    name = load_preset(DEFAULT_PRESET).name
    assert re.fullmatch(rf"retrain {re.escape(name)} {TIME}", run.name), run.name
    assert tags["prefect.flow_run_name"] == run.name
    assert out["links"]["mlflow_run_url"] == tracking.run_url(parent)
    assert out["links"]["mlflow_run_url"].endswith(f"/runs/{parent}")
    # A reproduction's flow run says so.
    again = linked(tracking.start_pipeline_run("reproduce test", {}, {}),
                   reproduction_of={"version": "1"})  # fmt: skip
    with get_client(sync_client=True) as client:
        name2 = client.read_flow_run(again["flow_run_id"]).name
    assert re.fullmatch(rf"reproduce {re.escape(name)} {TIME}", name2), name2
