"""bench/pipeline_overhead.py --make-run's table, read off the lines flows/retrain.py prints
when a stage ends (a change to either shows here); the full run is the bench itself."""

from __future__ import annotations

import inspect

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
