"""What a user must see in the MLflow UI after a pipeline run and its reproduction, checked
in a real browser (headless Chromium driven by Playwright), with screenshots.

    make ui-deps                                   # Playwright (pip) + Debian's chromium
    .venv/bin/python scripts/ui_check.py --build   # tiny retrain + `reproduce 1`, then check
    .venv/bin/python scripts/ui_check.py           # check the stores an earlier --build left

`--build` runs the shipped CPU preset shrunk to a tiny budget (tests/tiny_pipeline.py) in
its own folder (`--workdir`, default runs/ui-check): MLflow store, registry, audit log and
data all inside it. The check starts `mlflow ui` on that store and asserts, through the
tracking API first (`facts`, what the default test tier also checks on logged runs) and
then on the pages a user opens:

- the two parent runs compared side by side (scripts/ui_compare.py) at the URL `agentrl
  reproduce` prints: the
  compare page's metrics grid (virtualised: scrolled through, row by row) shows
  success_rate, _lo and _hi for both runs as logged, its tags table the weights hash of
  both, and "show diff only" leaves exactly the metrics that differ;
- the runs table at the URL the flow prints (filter `tags.stage = 'pipeline'`) lists the
  parents and no stage run;
- every stage run of the original lasts at least its recorded compute time (a floor:
  stage runs used to be opened after the work and lasted milliseconds), and the SFT run's
  page shows that duration;
- a trace of the evaluate run lasts the episode's recorded wall time and its status is
  the episode's outcome, as its header shows;
- the registered version's page loads its MLmodel (200, no 404), links its source run
  (the training stage's) and shows a schema; the model loads with `pyfunc.load_model`;
- MLflow's model-centric view (scripts/ui_model_view.py): the logged model linked to its
  version with the evaluation's metrics, no dead link on the parent run, every column of
  an artifact table with values, report URIs that resolve after the reproduction ran,
  fewer than 100 metric columns, the parent's description, reports and promotion tags.

Screenshots go to `<workdir>/screenshots/`. Exit status 0 when every check holds, 1 with
the failed checks listed otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.ui_compare import SIDE_BY_SIDE_METRICS  # noqa: E402
from scripts.ui_model_view import browse_model_view, model_view_facts  # noqa: E402

# The stages a candidate can come from (SFT, or the last of `pipeline.algorithms`).
TRAINING_STAGES = ("sft", "rs", "dpo", "grpo")


def store_uri(workdir: Path) -> str:
    return f"sqlite:///{workdir.resolve() / 'mlruns' / 'mlflow.db'}"


def build(workdir: Path) -> dict:
    """A tiny retrain and `agentrl reproduce` of the version it registered, in `workdir`."""
    import yaml

    from components import tracking
    from components.promote import config as promote_config
    from tests.tiny_pipeline import tiny_preset

    workdir = workdir.resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "mlruns").mkdir(parents=True)
    os.environ["MLFLOW_TRACKING_URI"] = store_uri(workdir)
    # Registry, audit log and artefacts beside the store, not in the repository's mlruns/.
    promote_config.REPO_ROOT = workdir
    import mlflow

    mlflow.set_tracking_uri(store_uri(workdir))
    mlflow.create_experiment(
        tracking.EXPERIMENT, artifact_location=(workdir / "mlruns" / "artifacts").as_uri()
    )
    preset = tiny_preset({"mode": "in-process"})
    preset["name"] = "ui-check"
    # The UI tier runs on whatever machine it is given: a loaded one starts Prefect's
    # server (a fresh database's migrations) in minutes, not the shipped preset's 180 s.
    preset["runtime"] = {**(preset.get("runtime") or {}), "startup_timeout_s": 1200}
    (workdir / "preset.yaml").write_text(yaml.safe_dump(preset))
    os.chdir(workdir)
    from components.preset import load_preset
    from flows.reproduce import reproduce
    from flows.retrain import retrain
    from flows.retrain_main import prefect_api

    # One health-waited Prefect server for both, as every entry point starts it.
    with prefect_api(load_preset("preset.yaml").section("runtime").startup_timeout_s):
        original = retrain("preset.yaml")
        version = str(original["promotion"]["version"])
        report = reproduce(version, preset="preset.yaml")
    out = {
        "original": original["run_id"],
        "reproduction": report.get("run_id"),
        "version": version,
        "verdict": report["verdict"],
    }
    (workdir / "ui-check-runs.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def facts(uri: str, runs: dict) -> dict:
    """What the pages must show, read through the tracking API (the default test tier calls
    this on runs the flow's own tasks logged); raises AssertionError on a broken fact.

    `runs`: the two parent run ids (`original`, `reproduction`), the registered `version`
    and `workdir_original`, the original's pipeline folder (its eval/results.json)."""
    from mlflow import MlflowClient

    from components import tracking
    from components.promote.config import PromotionConfig

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name(tracking.EXPERIMENT)
    parents, (a, b), differing = _parent_facts(client, exp.experiment_id, runs)
    stages = _stage_facts(client, exp.experiment_id, runs)
    trace, row = _trace_facts(client, exp.experiment_id, runs, stages["evaluate"]["run_id"])
    model = PromotionConfig().model_name
    mv, trained_by = _version_facts(client, uri, runs, stages, model)
    view = model_view_facts(client, uri, runs, exp.experiment_id, model)
    return {
        "experiment": exp.experiment_id,
        "model_view": view,
        "differing": differing,
        "stages": stages,
        "trace": {
            "id": trace.info.trace_id,
            "wall_s": row["wall_s"],
            "duration_ms": trace.info.execution_duration,
            "success": row["success"],
        },
        "version_run": mv.run_id,
        "version_stage": trained_by,
        "parents": len(parents),
        "names": {r.info.run_id: r.info.run_name for r in (a, b)},
        "values": {
            r.info.run_id: {
                **{k: r.data.metrics[k] for k in SIDE_BY_SIDE_METRICS},
                "weights_sha256": r.data.tags["weights_sha256"],
            }
            for r in (a, b)
        },
    }


def _parent_facts(client, experiment_id: str, runs: dict) -> tuple[list, tuple, list[str]]:
    """The pipeline filter's parent runs, the two compared ones (their side-by-side metrics
    and weights digest checked) and the metrics in which they differ."""
    from components import tracking

    parents = client.search_runs([experiment_id], tracking.pipeline_search_filter())
    ids = {r.info.run_id for r in parents}
    assert {runs["original"], runs["reproduction"]} <= ids, "parent runs missing from the filter"
    assert all(r.data.tags.get("stage") == "pipeline" for r in parents), "a stage run listed"
    a, b = (client.get_run(runs[k]) for k in ("original", "reproduction"))
    for run in (a, b):
        for key in SIDE_BY_SIDE_METRICS:
            assert key in run.data.metrics, f"{run.info.run_name}: no {key}"
        rate, lo, hi = (run.data.metrics[k] for k in SIDE_BY_SIDE_METRICS)
        assert lo <= rate <= hi, f"{run.info.run_name}: success_rate {rate} outside [{lo}, {hi}]"
        assert run.data.tags.get("weights_sha256"), f"{run.info.run_name}: no weights_sha256"
    # As the compare page's "show diff only" has it: a metric only one run has differs too.
    ma, mb = a.data.metrics, b.data.metrics
    differing = sorted(k for k in ma.keys() | mb.keys() if ma.get(k) != mb.get(k))
    assert any(k in ma and k in mb for k in differing), "no metric of both parents differs"
    return parents, (a, b), differing


def _stage_facts(client, experiment_id: str, runs: dict) -> dict:
    """The original parent's stage runs by name: id, spanned and recorded seconds."""
    children = client.search_runs(
        [experiment_id], f"tags.mlflow.parentRunId = '{runs['original']}'"
    )
    stages = {}
    for child in children:
        seconds = (child.info.end_time - child.info.start_time) / 1000
        assert "stage_seconds" in child.data.metrics, f"{child.info.run_name}: no stage_seconds"
        recorded = child.data.metrics["stage_seconds"]
        if child.data.tags.get("cached") != "True":
            # The floor: the run spans at least the stage's own measured time.
            assert seconds >= recorded - 0.5, f"{child.info.run_name}: {seconds}s < {recorded}s"
        stages[child.info.run_name] = {
            "run_id": child.info.run_id,
            "seconds": seconds,
            "recorded": recorded,
        }
    return stages


def _trace_facts(client, experiment_id: str, runs: dict, evaluate: str) -> tuple:
    """Every trace on the evaluate run matches its episode's row (duration, status, pipeline
    run); the first trace and its row, the ones the pages show."""
    rows = json.loads(Path(runs["workdir_original"], "eval", "results.json").read_text())
    by_episode = {r["episode_id"]: r for r in rows["results"]}
    traces = client.search_traces(locations=[experiment_id], run_id=evaluate)
    assert traces, "no trace on the evaluate run"
    for trace in traces:  # every one; the pages show the first
        root = next(s for s in trace.data.spans if s.parent_id is None)
        row = by_episode[root.attributes["episode_id"]]
        where = f"trace of {row['episode_id']}"
        assert abs(trace.info.execution_duration - row["wall_s"] * 1000) <= 1, f"{where}: duration"
        assert trace.info.state.value == ("OK" if row["success"] else "ERROR"), f"{where}: status"
        assert trace.info.tags.get("pipeline_run_id") == runs["original"], f"{where}: pipeline run"
    trace = traces[0]
    root = next(s for s in trace.data.spans if s.parent_id is None)
    return trace, by_episode[root.attributes["episode_id"]]


def _version_facts(client, uri: str, runs: dict, stages: dict, model: str) -> tuple:
    """The registered version, trained by a training stage; its MLmodel loads."""
    import mlflow
    from mlflow.models import Model

    mv = client.get_model_version(model, runs["version"])
    trained_by = next((k for k, v in stages.items() if v["run_id"] == mv.run_id), None)
    assert trained_by in TRAINING_STAGES, f"source run is {trained_by}, not a training stage"
    # What the version page requests: the MLmodel under the version's source; and it loads.
    local = mlflow.artifacts.download_artifacts(
        client.get_model_version_download_uri(model, runs["version"]), tracking_uri=uri
    )
    meta = Model.load(f"{local}/MLmodel")
    assert meta.signature is not None and meta.run_id == mv.run_id, "MLmodel"
    mlflow.pyfunc.load_model(local)
    return mv, trained_by


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(uri: str, port: int, log: Path):
    """`mlflow ui` on the store, as the README starts it (its output in `log`); stopped on
    exit. It can take minutes to answer on a busy 2-core machine."""
    import urllib.request

    out = log.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("mlflow ui did not start") from None
                time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        # `mlflow ui` leaves its uvicorn workers and job runner behind when it alone is
        # stopped: stop the whole tree.
        import psutil

        from components.runtime import descendants

        procs = []
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
                procs[-1].terminate()
        _, alive = psutil.wait_procs(procs, timeout=30)
        for left in alive:
            with contextlib.suppress(psutil.Error):
                left.kill()
        proc.wait()
        out.close()


def chromium() -> str:
    """Debian's chromium (Playwright's own browser download needs a host we cannot reach)."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    raise RuntimeError("no chromium on PATH: run `make ui-deps`")


def run_page_duration(text: str) -> float | None:
    """The duration a run page shows after "Duration" (MLflow writes `8.1s`, `2.5min`, `1.2h`)."""
    import re

    m = re.search(r"Duration\s*([\d.]+)\s*(ms|s|min|h)\b", text)
    if not m:
        return None
    return float(m[1]) * {"ms": 0.001, "s": 1, "min": 60, "h": 3600}[m[2]]


def browse(base: str, runs: dict, known: dict, shots: Path) -> list[str]:
    """The checks on the pages; returns the failures (empty: all hold)."""
    from playwright.sync_api import sync_playwright

    from scripts.ui_compare import compare_page

    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        # A loaded 2-core machine serves the UI's first pages in tens of seconds.
        page.set_default_navigation_timeout(180_000)
        page.set_default_timeout(120_000)
        responses: list[tuple[str, int]] = []
        page.on("response", lambda r: responses.append((r.url, r.status)))

        def shot(name: str, settle: int = 8000) -> None:
            page.wait_for_timeout(settle)  # the tables fill in after the page's first paint
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        failures = compare_page(page, shot, base, runs, known)
        failures += runs_table_page(page, shot, base, runs, known)
        failures += stage_run_page(page, shot, base, known)
        failures += trace_page(page, shot, base, known)
        failures += version_page(page, shot, base, runs, known, responses)
        failures += browse_model_view(page, base, runs, known, shot)
        browser.close()
    return failures


def runs_table_page(page, shot, base: str, runs: dict, known: dict) -> list[str]:
    """The runs table at the URL the flow prints: parents only, no stage runs."""
    from components import tracking

    failures: list[str] = []
    exp = known["experiment"]
    page.goto(tracking.pipeline_runs_url(exp, base))
    page.get_by_text(known["names"][runs["original"]]).first.wait_for(timeout=120_000)
    shot("runs-parents")
    listed = page.inner_text("body")
    for key in ("original", "reproduction"):
        if known["names"][runs[key]] not in listed:
            failures.append(f"runs table (pipeline filter): no {known['names'][runs[key]]}")
    if f"{known['parents']} matching runs" not in listed:
        failures.append(f"runs table (pipeline filter): not {known['parents']} matching runs")
    stage_names = [s for s in known["stages"] if "-" in s]  # distinctive: policy-init, ...
    if any(s in listed for s in stage_names):
        failures.append(f"runs table (pipeline filter) lists stage runs {stage_names}")
    return failures


def stage_run_page(page, shot, base: str, known: dict) -> list[str]:
    """A stage run's page shows a duration at least its recorded time (the SFT run's)."""
    failures: list[str] = []
    exp = known["experiment"]
    sft = known["stages"]["sft"]
    page.goto(f"{base}/#/experiments/{exp}/runs/{sft['run_id']}")
    page.get_by_text("Duration").first.wait_for(timeout=120_000)
    shot("stage-run-sft")
    text = page.inner_text("body")
    duration = run_page_duration(text)
    # MLflow shows one decimal (`4.9s`, `2.5min`): a floor below the recorded time by
    # at most that rounding.
    if duration is None or duration < sft["recorded"] - max(0.1, 0.02 * sft["recorded"]):
        failures.append(f"sft run page: duration {duration}s, recorded {sft['recorded']}s")
    return failures


def trace_page(page, shot, base: str, known: dict) -> list[str]:
    """The trace: its header shows the episode's recorded wall time and its outcome."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    failures: list[str] = []
    exp = known["experiment"]
    trace = known["trace"]
    page.goto(f"{base}/#/experiments/{exp}/traces?selectedEvaluationId={trace['id']}")
    ms = f"{trace['duration_ms']:.2f}ms"  # as the header writes it (facts: = the wall time)
    state = "OK" if trace["success"] else "Error"
    try:
        page.get_by_text(ms, exact=True).first.wait_for(timeout=120_000)
        header = page.get_by_text(ms, exact=True).first.locator("xpath=../..").inner_text()
    except PlaywrightTimeout:
        header = ""
    shot("trace", 3000)
    if trace["id"].removeprefix("tr-")[:8] not in header or state not in header.split("\n"):
        failures.append(f"trace page: header {header!r}, expected {ms} and {state}")
    return failures


def version_page(page, shot, base: str, runs: dict, known: dict, responses: list) -> list[str]:
    """The registered version: its MLmodel loads (no 404), its source run is the training
    stage's, its schema is not empty."""
    failures: list[str] = []
    before = len(responses)
    page.goto(f"{base}/#/models/agentrl-coder/versions/{runs['version']}")
    page.get_by_text("Source Run", exact=False).first.wait_for(timeout=120_000)
    shot("model-version")
    asked = [(u, code) for u, code in responses[before:] if "MLmodel" in u or "artifact" in u]
    if not any("MLmodel" in u and code == 200 for u, code in asked):
        failures.append(f"model version page: no MLmodel loaded ({asked})")
    if any(code == 404 for _, code in asked):
        failures.append(f"model version page: 404 for {[u for u, c in asked if c == 404]}")
    source = page.locator(f'a[href*="{known["version_run"]}"]')
    if not source.count() or source.first.inner_text().strip() != known["version_stage"]:
        failures.append(f"model version page: no link to its source run, {known['version_stage']}")
    if not page.get_by_text("Inputs (1)").count():
        failures.append("model version page: no input schema")
    return failures


def discover(workdir: Path, version: str) -> dict:
    """The runs in a checkout's own stores after `make run` and `agentrl reproduce VERSION`:
    the pipeline run that registered the version (its lineage) and its newest reproduction."""
    from mlflow import MlflowClient

    from components import tracking
    from components.promote.config import PromotionConfig

    uri = store_uri(workdir)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = client.get_model_version(PromotionConfig().model_name, version)
    exp = client.get_experiment_by_name(tracking.EXPERIMENT).experiment_id
    found = client.search_runs(
        [exp],
        f"{tracking.pipeline_search_filter()} and tags.reproduction_of_version = '{version}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not found:
        raise SystemExit(
            f"no reproduction of version {version} in {uri}: run "
            f"`agentrl reproduce {version}` first"
        )
    return {
        "original": mv.tags["pipeline_run_id"],
        "reproduction": found[0].info.run_id,
        "version": str(version),
    }


def pipeline_workdir(workdir: Path, uri: str, version: str) -> Path:
    """The original run's pipeline folder: its preset's `pipeline.workdir` (the version's
    `preset` tag names the file, relative to where the flow ran)."""
    import yaml
    from mlflow import MlflowClient

    from components.promote.config import PromotionConfig

    mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(
        PromotionConfig().model_name, version
    )
    preset = yaml.safe_load(Path(workdir, mv.tags["preset"]).read_text())
    return Path(workdir, preset["pipeline"]["workdir"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/ui_check.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / "runs" / "ui-check",
        help="where the stores are (mlruns/mlflow.db) and the flow ran",
    )
    p.add_argument("--build", action="store_true", help="run the tiny pipeline + reproduce first")
    p.add_argument(
        "--version",
        default="",
        help="check the stores `make run` + `agentrl reproduce VERSION` left in "
        "--workdir (e.g. --workdir . --version 1) instead of a --build's",
    )
    p.add_argument(
        "--shots",
        type=Path,
        default=None,
        help="screenshot folder (default: <workdir>/screenshots)",
    )
    p.add_argument("--port", type=int, default=0, help="mlflow ui port (default: a free one)")
    p.add_argument("--ui", default="", help="an MLflow UI already serving the store (its URL)")
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    shots = (args.shots or workdir / "screenshots").resolve()
    if args.build:
        runs = build(workdir)
    elif args.version:
        runs = discover(workdir, args.version)
    else:
        runs = json.loads((workdir / "ui-check-runs.json").read_text())
    uri = store_uri(workdir)
    runs["workdir_original"] = str(pipeline_workdir(workdir, uri, runs["version"]))
    known = facts(uri, runs)
    print(json.dumps(known, indent=2, default=str))
    if args.ui:
        failures = browse(args.ui.rstrip("/"), runs, known, shots)
    else:
        shots.mkdir(parents=True, exist_ok=True)
        with mlflow_ui(uri, args.port or _free_port(), shots / "mlflow-ui.log") as base:
            failures = browse(base, runs, known, shots)
    for f in failures:
        print(f"FAILED: {f}")
    print(f"screenshots: {shots}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
