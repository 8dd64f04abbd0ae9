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

- the two parent runs, listed with the filter the README gives, compared side by side:
  success rate, its CI bounds and the weights hash are on the compare page, and some
  metric differs between them;
- every stage run of the original lasts at least its recorded compute time (a floor:
  stage runs used to be opened after the work and lasted milliseconds);
- a trace of the evaluate run lasts the episode's recorded wall time and its status is
  the episode's outcome;
- the registered version's page loads its MLmodel (no 404) and shows the source run.

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
    mlflow.create_experiment(tracking.EXPERIMENT,
                             artifact_location=(workdir / "mlruns" / "artifacts").as_uri())  # fmt: skip
    preset = tiny_preset({"mode": "in-process"})
    preset["name"] = "ui-check"
    (workdir / "preset.yaml").write_text(yaml.safe_dump(preset))
    os.chdir(workdir)
    from flows.reproduce import reproduce
    from flows.retrain import retrain

    original = retrain("preset.yaml")
    version = str(original["promotion"]["version"])
    report = reproduce(version, preset="preset.yaml")
    out = {"original": original["run_id"], "reproduction": report.get("run_id"),
           "version": version, "verdict": report["verdict"]}  # fmt: skip
    (workdir / "ui-check-runs.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def facts(uri: str, runs: dict) -> dict:
    """What the pages must show, read through the tracking API; raises on a broken fact."""
    from mlflow import MlflowClient

    from components import tracking

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name(tracking.EXPERIMENT)
    parents = client.search_runs([exp.experiment_id], tracking.pipeline_search_filter())
    ids = {r.info.run_id for r in parents}
    assert {runs["original"], runs["reproduction"]} <= ids, "parent runs missing from the filter"
    assert all(r.data.tags.get("stage") == "pipeline" for r in parents)
    a, b = (client.get_run(runs[k]) for k in ("original", "reproduction"))
    for run in (a, b):
        for key in ("success_rate", "success_rate_lo", "success_rate_hi"):
            assert key in run.data.metrics, f"{run.info.run_name}: no {key}"
        assert run.data.tags.get("weights_sha256"), f"{run.info.run_name}: no weights_sha256"
    differing = sorted(k for k in a.data.metrics
                       if k in b.data.metrics and a.data.metrics[k] != b.data.metrics[k])  # fmt: skip
    assert differing, "the two parent runs have no differing metric"
    children = client.search_runs([exp.experiment_id],
                                  f"tags.mlflow.parentRunId = '{runs['original']}'")  # fmt: skip
    stages = {}
    for child in children:
        seconds = (child.info.end_time - child.info.start_time) / 1000
        recorded = child.data.metrics.get("stage_seconds", 0.0)
        if child.data.tags.get("cached") != "True":
            assert seconds >= recorded - 0.5, f"{child.info.run_name}: {seconds}s < {recorded}s"
        stages[child.info.run_name] = {"run_id": child.info.run_id, "seconds": seconds,
                                       "recorded": recorded}  # fmt: skip
    evaluate = stages["evaluate"]["run_id"]
    rows = json.loads(Path(runs["workdir_original"], "eval", "results.json").read_text())
    by_episode = {r["episode_id"]: r for r in rows["results"]}
    traces = client.search_traces(locations=[exp.experiment_id], run_id=evaluate)
    assert traces, "no trace on the evaluate run"
    trace = traces[0]
    root = next(s for s in trace.data.spans if s.parent_id is None)
    row = by_episode[root.attributes["episode_id"]]
    assert abs(trace.info.execution_duration - row["wall_s"] * 1000) <= 1
    assert trace.info.state.value == ("OK" if row["success"] else "ERROR")
    assert trace.info.tags.get("pipeline_run_id") == runs["original"]
    mv = client.get_model_version("agentrl-coder", runs["version"])
    assert mv.run_id == stages["grpo"]["run_id"], "source run is not the training run"
    return {"experiment": exp.experiment_id, "differing": differing, "stages": stages,
            "trace": {"id": trace.info.trace_id, "wall_s": row["wall_s"],
                      "success": row["success"]},
            "version_run": mv.run_id}  # fmt: skip


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
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
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
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


def chromium() -> str:
    """Debian's chromium (Playwright's own browser download needs a host we cannot reach)."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    raise RuntimeError("no chromium on PATH: run `make ui-deps`")


# Scrolls the compare page's metrics grid (its own scroll box, below the page's) by a few rows.
SCROLL_METRICS = """() => {
  const cell = window.metricsBox || [...document.querySelectorAll('a, span, div')]
    .find(e => e.childElementCount === 0 && e.textContent.trim() === 'episodes');
  let box = window.metricsBox || cell;  // found once: scrolled away, the cell is gone
  while (box && !(box.scrollHeight > box.clientHeight + 5
                  && /auto|scroll/.test(getComputedStyle(box).overflowY))) box = box.parentElement;
  window.metricsBox = box;
  if (box) box.scrollTop += 120;
  return box ? box.scrollTop : -1;
}"""


def browse(base: str, runs: dict, known: dict, shots: Path) -> list[str]:
    """The checks on the pages; returns the failures (empty: all hold)."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    missing: list[str] = []
    exp = known["experiment"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)

        def shot(name: str) -> None:
            page.wait_for_timeout(8000)  # the tables fill in after the page's first paint
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        # Parents only, compared side by side.
        ids = json.dumps([runs["original"], runs["reproduction"]])
        page.goto(f"{base}/#/compare-runs?runs={ids}&experiments={json.dumps([exp])}")
        page.get_by_text("Run details").first.wait_for(timeout=120_000)
        page.wait_for_timeout(5000)
        for section in ("Visualizations", "Run details", "Parameters"):  # Metrics in view
            page.get_by_text(section, exact=True).first.click()
            page.wait_for_timeout(1000)
        # The metrics table shows a window of rows (alphabetical): scroll it to the success
        # rows, reading every window on the way.
        text = page.inner_text("body")
        for _ in range(40):
            if "success_rate_hi" in text and "success_rate_lo" in text:
                break
            page.evaluate(SCROLL_METRICS)
            page.wait_for_timeout(400)
            text += page.inner_text("body")
        shot("compare-parents")
        for needle in ("success_rate", "success_rate_lo", "success_rate_hi", "weights_sha256"):
            if needle not in text:
                failures.append(f"compare page: no {needle}")
        if "Nothing to compare" in text:
            failures.append("compare page: 'Nothing to compare!'")
        # The runs table with the README's filter: parents only.
        page.goto(f"{base}/#/experiments/{exp}/runs")
        box = page.get_by_placeholder('metrics.rmse < 1 and params.model = "tree"', exact=False)
        if box.count():
            box.first.fill("tags.stage = 'pipeline'")
            box.first.press("Enter")
        shot("runs-parents")
        # Stage durations: the original's run page lists its stages with their durations.
        sft = known["stages"].get("sft") or next(iter(known["stages"].values()))
        page.goto(f"{base}/#/experiments/{exp}/runs/{sft['run_id']}")
        page.get_by_text("Duration").first.wait_for(timeout=120_000)
        shot("stage-run-sft")
        if sft["seconds"] < 1 and sft["recorded"] >= 1:
            failures.append(f"sft run lasts {sft['seconds']}s, recorded {sft['recorded']}s")
        # The trace: its duration and status.
        trace = known["trace"]
        page.goto(f"{base}/#/experiments/{exp}/traces?selectedEvaluationId={trace['id']}")
        page.wait_for_timeout(5000)
        shot("trace")
        body = page.inner_text("body")
        wall = trace["wall_s"]
        shown = {f"{wall:.2f}s", f"{wall:.1f}s", f"{wall:.3f}s", f"{round(wall)}s"}
        if not any(s in body for s in shown):
            failures.append(f"trace page: no duration {wall:.2f}s shown")
        # The registered version: its MLmodel loads (no 404), its source run is shown.
        before = len(missing)
        page.goto(f"{base}/#/models/agentrl-coder/versions/{runs['version']}")
        page.get_by_text("Source Run", exact=False).first.wait_for(timeout=120_000)
        shot("model-version")
        gone = [u for u in missing[before:] if "MLmodel" in u or "artifact" in u]
        if gone:
            failures.append(f"model version page: 404 for {gone}")
        browser.close()
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/ui_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "runs" / "ui-check")
    p.add_argument("--build", action="store_true", help="run the tiny pipeline + reproduce first")
    p.add_argument("--port", type=int, default=0, help="mlflow ui port (default: a free one)")
    p.add_argument("--ui", default="", help="an MLflow UI already serving the store (its URL)")
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    runs = (
        build(workdir) if args.build else json.loads((workdir / "ui-check-runs.json").read_text())
    )
    runs["workdir_original"] = str(workdir / "runs" / "pipeline")
    uri = store_uri(workdir)
    known = facts(uri, runs)
    print(json.dumps(known, indent=2, default=str))
    if args.ui:
        failures = browse(args.ui.rstrip("/"), runs, known, workdir / "screenshots")
    else:
        with mlflow_ui(uri, args.port or _free_port(), workdir / "mlflow-ui.log") as base:
            failures = browse(base, runs, known, workdir / "screenshots")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"screenshots: {workdir / 'screenshots'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
