"""Issue 44 item 7: `agentrl rescore` goes through the same limits as an episode. A record
nested 5000 deep (it crashed the whole rescore) or otherwise malformed is quarantined with
one line naming it and the run goes on; a stored diff's path is bounded (87 s per record);
the counts reconcile."""

from __future__ import annotations

import json
import time

import pytest

from components.env.config import EnvConfig
from components.evaluate.rescore import (
    MAX_DIFF_BYTES,
    QUARANTINED,
    read_stored,
    rescore_records,
    summarize_rescore,
    write_outputs,
)
from components.sandbox.config import SandboxConfig
from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks
from components.verifier.cache import verdict_cache_info


@pytest.fixture(scope="module")
def one_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("rescore-bounds")
    generate_suite(root / "tasks", 1, 7)
    tasks, errors = load_tasks(root / "tasks")
    assert not errors and len(tasks) == 1
    return root, tasks[0]


def _diff_record(task, rid: str, diff: str) -> dict:
    return {"id": rid, "task_id": task.id, "trajectory": [{"role": "user", "content": "x"}],
            "final_diff": diff, "reward": 1.0, "metadata": {"success": True}}  # fmt: skip


def _search_bomb(lines: int) -> str:
    """A created file, then a hunk matching nowhere searched over it (the 20 s patch)."""
    body = "".join("+a\n" for _ in range(2 * lines))
    context = "".join(" a\n" for _ in range(lines - 1))
    return (f"--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,{2 * lines} @@\n{body}"
            f"--- a/big.txt\n+++ b/big.txt\n@@ -1,{lines} +1,{lines} @@\n{context}-b\n+c\n")  # fmt: skip


def test_malformed_lines_are_quarantined_by_line_and_the_run_goes_on(one_task, tmp_path):
    root, task = one_task
    deep = "[" * 5000 + "]" * 5000
    nested = json.dumps(_diff_record(task, "nested", "x"))[:-1] + ', "extra": ' + "[" * 100
    nested += "]" * 100 + "}"
    good = _diff_record(task, "oracle", task.reference_patch() or "")
    lines = [
        '{"id": "deep", "task_id": "t", "trajectory": ' + deep + "}",
        "not json at all",
        json.dumps([1, 2]),
        json.dumps({"id": "no-trajectory", "task_id": task.id}),
        json.dumps({**good, "id": "bad-meta", "metadata": [1]}),
        nested,
        json.dumps(good),
    ]
    src = tmp_path / "episodes.jsonl"
    src.write_text("\n".join(lines) + "\n")
    records, source = read_stored(src)
    assert len(records) == len(lines)
    before = verdict_cache_info()
    rows = rescore_records(records, {task.id: task}, EnvConfig(), SandboxConfig(), workers=1)
    quarantined = [r for r in rows if r.error.startswith(QUARANTINED)]
    assert len(quarantined) == 6
    for r in quarantined:
        assert "\n" not in r.error and r.new is None
    assert "episodes.jsonl:1" in quarantined[0].error and "nested too deep" in quarantined[0].error
    assert "bad-meta" in quarantined[4].error and "nested deeper" in quarantined[5].error
    assert rows[-1].new is not None and rows[-1].new["success"] is True
    summary = summarize_rescore(rows, 1.0, before)
    assert summary["episodes"] == len(lines) == summary["rescored"] + summary["not_rescored"]
    assert summary["quarantined"] == 6 and summary["rescored"] == 1
    paths = write_outputs(tmp_path / "out", rows, records, summary, source)
    report = json.loads(paths["report.json"].read_text())
    assert len(report["episodes"]) == len(lines)


def test_a_doctored_diff_is_bounded_and_judged_a_failure(one_task):
    root, task = one_task
    bomb = _diff_record(task, "search-bomb", _search_bomb(8_000))
    huge = _diff_record(task, "huge", "--- /dev/null\n+++ b/x.txt\n" + "+a\n" * MAX_DIFF_BYTES)
    start = time.monotonic()
    rows = rescore_records([bomb, huge], {task.id: task}, EnvConfig(), SandboxConfig(), workers=1)
    assert time.monotonic() - start < 60  # was 87 s per record, unbounded
    assert rows[0].new is None and "line comparisons" in rows[0].error
    assert rows[1].new is None and f"over {MAX_DIFF_BYTES} bytes" in rows[1].error
    # A file-limit refusal names the file and writes nothing.
    small = SandboxConfig(max_file_bytes=1024)
    grow = _diff_record(task, "grow", "--- /dev/null\n+++ b/g.txt\n@@ -0,0 +1,600 @@\n"
                        + "+abcdefgh\n" * 600)  # fmt: skip
    row = rescore_records([grow], {task.id: task}, EnvConfig(), small, workers=1)[0]
    assert row.new is None and "1024-byte file limit" in row.error
