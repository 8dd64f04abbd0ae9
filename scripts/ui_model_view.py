"""MLflow's model-centric view after a pipeline run (issue 46), for scripts/ui_check.py:
the facts through the tracking API (`model_view_facts`, which the default test tier also
calls) and the same facts on the pages a user opens (`browse_model_view`).

- the registered version's logged model names the version (its page does not say "Not
  registered") and carries the evaluation's metrics;
- no link on the parent run's page is dead (a Prefect flow-run URL on a temporary
  server's port was: connection refused once the run ended);
- every column of an artifact table shows values (a dotted column name showed blank);
- the version's report URIs resolve (runs:/ URIs, not paths into a folder the next run
  overwrites), checked after the reproduction ran;
- fewer than MAX_METRIC_COLUMNS metric columns over the experiment's runs (545 when
  configuration and counts were metrics);
- the parent run has a description, its reports and the version, gate and approval tags.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

MAX_METRIC_COLUMNS = 100
PARENT_TAGS = ("registered_version", "gate_decision", "approval")
REPORT_TAGS = ("eval_report_uri", "safety_report_uri")


def live(url: str) -> bool:
    """Does `url` answer (any status below 400) within 10 s?"""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status < 400
    except (OSError, ValueError):
        return False


def tables_of(client, run_id: str) -> dict[str, dict]:
    """The run's `tables/*.json` artifacts (log_table's {columns, data}), by path."""
    out = {}
    for entry in client.list_artifacts(run_id, "tables"):
        if entry.path.endswith(".json"):
            out[entry.path] = json.loads(
                Path(client.download_artifacts(run_id, entry.path)).read_text()
            )
    return out


def blank_columns(table: dict) -> list[str]:
    """The columns the UI's table view shows blank: a dotted name (read as a path into the
    row) or no value in any row."""
    columns, rows = table["columns"], table["data"]
    return [
        c
        for i, c in enumerate(columns)
        if "." in c or all(r[i] is None or r[i] == "" for r in rows)
    ]


def model_view_facts(client, uri: str, runs: dict, experiment_id: str, model_name: str) -> dict:
    """The facts above through the tracking API; raises AssertionError naming the broken
    one. Returns what the pages are checked against."""
    import mlflow

    mv = client.get_model_version(model_name, runs["version"])
    model_id = mv.tags.get("model_uri", "").removeprefix("models:/")
    assert model_id, f"version {runs['version']}: no model_uri tag (its logged model)"
    model = client.get_logged_model(model_id)
    linked = json.loads(model.tags.get("mlflow.modelVersions") or "[]")
    assert {"name": model_name, "version": str(runs["version"])} in linked, (
        f"logged model {model_id}: not linked to version {runs['version']} ({linked})"
    )
    metrics = {m.key: m.value for m in model.metrics}
    assert "success_rate" in metrics, f"logged model {model_id}: no evaluation metrics"
    for key in REPORT_TAGS:
        target = mv.tags.get(key, "")
        assert target.startswith(("runs:/", "models:/")), f"version {key}: {target!r}"
        local = mlflow.artifacts.download_artifacts(artifact_uri=target, tracking_uri=uri)
        assert Path(local).stat().st_size > 0, f"version {key}: {target} is empty"
    parent = client.get_run(runs["original"])
    assert parent.data.tags.get("mlflow.note.content"), "parent run: no description"
    missing = [t for t in PARENT_TAGS if not parent.data.tags.get(t)]
    assert not missing, f"parent run: no {missing} tags"
    assert client.list_artifacts(runs["original"], "reports"), "parent run: no reports/"
    links = {k: v for k, v in parent.data.tags.items() if v.startswith(("http://", "https://"))}
    dead = sorted(k for k, v in links.items() if not live(v))
    assert not dead, f"parent run: dead links {[(k, links[k]) for k in dead]}"
    columns = set()
    for run in client.search_runs([experiment_id], max_results=1000):
        columns |= set(run.data.metrics)
    assert len(columns) < MAX_METRIC_COLUMNS, (
        f"{len(columns)} metric columns in the runs table: {sorted(columns)}"
    )
    children = client.search_runs(
        [experiment_id], f"tags.mlflow.parentRunId = '{runs['original']}'"
    )
    tables = {}
    for child in children:
        for path, table in tables_of(client, child.info.run_id).items():
            blank = blank_columns(table)
            assert not blank, f"{child.info.run_name} {path}: blank columns {blank}"
            assert table["columns"][0] == "group", f"{child.info.run_name} {path}: group not first"
            tables[f"{child.info.run_id}/{path}"] = table
    return {
        "model_id": model_id,
        "model_metrics": sorted(metrics),
        "parent_links": links,
        "metric_columns": len(columns),
        "tables": sorted(tables),
    }


def _cells(page) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table the page shows (MLflow's design-system table: ARIA
    roles, not <table>)."""
    return page.evaluate("""() => {
      const text = e => e.textContent.trim();
      const head = [...document.querySelectorAll('[role="columnheader"]')].map(text);
      const rows = [...document.querySelectorAll('[role="row"]')]
        .map(r => [...r.querySelectorAll('[role="cell"]')].map(text)).filter(r => r.length);
      return [head, rows];
    }""")


def _dead(page, url: str) -> bool:
    """Does the browser get no page (refused, or a status of 400 or more) at `url`?"""
    try:
        return page.request.get(url, timeout=20_000).status >= 400
    except Exception:  # noqa: BLE001 - Playwright raises its own error for a refused connection
        return True


def _mlflow_site(url: str) -> bool:
    """Is `url` on MLflow's own site (mlflow.org and its subdomains)?"""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    return host == "mlflow.org" or host.endswith(".mlflow.org")


def browse_model_view(page, base: str, runs: dict, known: dict, shot) -> list[str]:
    """The facts on the pages; returns the failures. `shot(name)` takes a screenshot."""
    failures: list[str] = []
    exp, view = known["experiment"], known["model_view"]
    # The logged model: linked to its version, its metrics listed.
    page.goto(f"{base}/#/experiments/{exp}/models/{view['model_id']}")
    page.get_by_text("success_rate").first.wait_for(timeout=120_000)
    shot("logged-model")
    text = page.inner_text("body")
    if "Not registered" in text:
        failures.append("logged model page: 'Not registered'")
    if f"v{runs['version']}" not in text and f"Version {runs['version']}" not in text:
        failures.append(f"logged model page: no link to version {runs['version']}")
    # The parent run: its description shown, and no link on it dead.
    page.goto(f"{base}/#/experiments/{exp}/runs/{runs['original']}")
    page.get_by_text("gate_decision").first.wait_for(timeout=120_000)
    shot("parent-run")
    hrefs = page.evaluate(
        "() => [...document.querySelectorAll('a[href^=\"http\"]')].map(a => a.href)"
    )
    # MLflow's own pages (its documentation, in the page's chrome) are not the run's links:
    # a machine without the internet finds them dead, which says nothing about the run.
    ours = [h for h in hrefs if not h.startswith(base) and not _mlflow_site(h)]
    dead = [h for h in ours if _dead(page, h)]
    if dead:
        failures.append(f"parent run page: dead links {dead}")
    # An artifact table: every column shows a value in some row.
    # The evaluation's breakdown (its columns had dots: `cost.*`, ...), else the first.
    shown = next(
        (t for t in view["tables"] if "/tables/candidate.by_family" in t), view["tables"][0]
    )
    run_id, _, path = shown.partition("/")
    page.goto(f"{base}/#/experiments/{exp}/runs/{run_id}/artifacts/{path}")
    page.locator('[role="columnheader"]').first.wait_for(timeout=120_000)
    page.wait_for_timeout(3000)
    shot("artifact-table")
    head, rows = _cells(page)
    blank = [h for i, h in enumerate(head) if not any(i < len(r) and r[i] for r in rows)]
    if not head or blank:
        failures.append(f"artifact table {path}: columns {head}, blank {blank}")
    elif head[0] != "group":
        failures.append(f"artifact table {path}: first column {head[0]!r}, not group")
    return failures
