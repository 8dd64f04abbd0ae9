"""bench/pipeline_overhead.py --make-run's table, read off the lines flows/retrain.py prints
when a stage ends (a change to either shows here); the full run is the bench itself."""

from __future__ import annotations

import inspect
import time

from bench.pipeline_overhead import stage_table
from flows import retrain


def test_the_table_reads_the_flows_stage_lines():
    source = inspect.getsource(retrain.Run.stage)
    assert "{'cached' if cached else 'done'} in {result['_stage_seconds']:.0f}s" in source
    log = "\n".join(["==> gate: agentrl tasks check", "    gate: done in 380s",
                     "    expert: done in 229s", "    sft: cached in 0s", "noise"])  # fmt: skip
    table = stage_table(log, install_s=120.0, run_s=700.0)
    assert "| install (make install) | 120 | |" in table
    assert "| gate | 380 | 54% |" in table and "| expert | 229 | 33% |" in table
    assert "| sft | 0 (cached) | 0% |" in table
    assert "| flow (Prefect, MLflow, start-up) | 91 | 13% |" in table
    assert "| **total, install included** | **820** | |" in table


def test_the_table_reads_the_closing_summary_when_the_stage_lines_went_to_the_log():
    """Inside the flow Prefect may route prints to its log (stderr): the summary line that
    flows/retrain.py prints after the flow is enough."""
    source = inspect.getsource(retrain)
    assert "=== Stage timings (s; 0 = cached) ===" in source and "| total " in source
    log = ("PENDING APPROVAL\n\n=== Stage timings (s; 0 = cached) ===\n"
           "  generate 1  gate 102  sft 0  safety 96  | total 199\n\nUIs:")  # fmt: skip
    table = stage_table(log, install_s=210.0, run_s=476.0)
    assert "| gate | 102 | 21% |" in table and "| safety | 96 | 20% |" in table
    assert "| sft | 0 | 0% |" in table
    assert "| flow (Prefect, MLflow, start-up) | 277 | 58% |" in table
    assert "| **total, install included** | **686** | |" in table


def test_the_load_sampler_reads_the_load_average_while_in_its_block():
    from bench.pipeline_overhead import LoadSampler

    with LoadSampler(every_s=0.01) as load:
        deadline = time.monotonic() + 5
        while len(load.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    taken = len(load.samples)
    time.sleep(0.05)
    assert taken >= 3 and len(load.samples) == taken  # stopped at the block's end
    low, mean, high = map(float, load.summary().split()[-1].split("-"))
    assert low <= mean <= high and low == round(min(load.samples), 1)
