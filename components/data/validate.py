"""Validate an ingested dataset with Great Expectations; quarantine what fails.

Two suites, one per table (schema.py): `trajectories` (one row per record) and `steps`
(one row per event), in expectations.py. Checks GX cannot state directly (role order,
arguments valid for the tool) are first computed as plain columns with vectorised
pandas/numpy (computed_columns.py), then asserted by GX expectations like every other rule, so the suites are the gate and the data docs show
every rule. Each failing row GX reports is mapped back to its record and becomes a reason
"record <id> field <path>: <problem>"; a record with any reason goes to quarantine.

Secrets: credentials are always redacted in what is written (valid data *and* quarantine,
since both end up in DVC). With secret_policy=redact the suite checks the redacted text
and the record passes; with reject it checks the original and the record is quarantined.

UTF-8 validity is enforced at ingest (Parquet strings cannot hold invalid UTF-8), so by
the time rows reach these suites every text column is valid UTF-8. Numbers must be finite
and text must not hold NUL characters, anywhere in a record (`values`, `step_values`):
ingest rejects non-finite JSON already; these checks hold for datasets written otherwise.
An empty dataset fails the gate. The stage holds its input shared and its output
exclusively, and publishes the output whole (writers.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from components.data.computed_columns import (
    STEP_VALUES,
    TRAJECTORY_VALUES,
    argument_problems,
    eval_task_ids,
    order_status,
    reward_problems,
    reward_term_bounds,
    tool_set_problems,
    value_problems,
)
from components.data.config import ValidationConfig
from components.data.expectations import Check, build_checks, expectation_summary, run_suites
from components.data.ingest import (
    QUARANTINE,
    DatasetError,
    check_target,
    read_manifest,
    read_quarantine,
    read_tables,
    reconcile,
    write_dataset,
)
from components.data.redaction import redact_text, secret_detector, secret_regex
from components.data.schema import rows_to_record
from components.data.writers import (
    Lock,
    locked,
    publish_dir,
    recover_dir,
    write_atomic,
)

# ------------------------------------------------------------------ secrets


def _redact_series(series, rx: re.Pattern, detector: str, counts: dict[str, int]):
    """Redact a string column; only rows the vectorised detector flags pay the Python cost."""
    hit = series.str.contains(detector, regex=True, na=False)
    if not hit.any():
        return series
    out = series.copy()
    out[hit] = series[hit].map(lambda s: redact_text(s, rx, counts))
    return out


# ------------------------------------------------------------------ the stage

TEXT_COLUMNS = ("observation", "content", "arguments")


def validate_dataset(cfg: ValidationConfig) -> dict:
    """Validate cfg.in_dir into cfg.out_dir; returns the report (also written as JSON).

    The report's `passed` is False when quarantined / ingested > cfg.max_failure_rate.
    Holds a shared lock on the input and exclusive ones on the output and the report folder
    (writers.py) and publishes both whole: a run that fails (a full disk) leaves the old
    ones as they were and nothing half-written. Raises DatasetError for a dataset of zero
    records (the gate fails on empty input), a damaged one, or a folder it could not write
    (named), LockTimeout when another writer holds a folder for longer than
    cfg.lock_timeout_s.
    """
    in_dir, out_dir, report_dir = Path(cfg.in_dir), Path(cfg.out_dir), Path(cfg.report_dir)
    locks = [Lock(out_dir), Lock(report_dir)]
    if in_dir.resolve() != out_dir.resolve():
        locks.append(Lock(in_dir, exclusive=False))
    with locked(locks, cfg.lock_timeout_s):
        recover_dir(out_dir)
        recover_dir(report_dir)
        check_target(out_dir, overwrite=True)
        return _validate(cfg)


@contextlib.contextmanager
def _writing_to(target: Path):
    """A file-system error while writing `target` names it (an OSError from deep inside GX
    or pyarrow often names no path, or a hidden staging one)."""
    try:
        yield
    except OSError as e:
        raise DatasetError(f"could not write {target}: {e.strerror or e}") from e


def _validate(cfg: ValidationConfig) -> dict:
    import numpy as np

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    in_dir, report_dir = Path(cfg.in_dir), Path(cfg.report_dir)
    manifest_in = read_manifest(in_dir)
    if not manifest_in.get("counts", {}).get("ingested"):
        raise DatasetError(f"{in_dir} holds no records: an empty dataset fails the data gate")
    traj_tbl, step_tbl = read_tables(in_dir)
    traj, steps = traj_tbl.to_pandas(), step_tbl.to_pandas()
    timings["read_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    redacted, redactions = _prepare(cfg, traj_tbl, traj, steps)
    eval_ids, warnings = eval_task_ids(cfg)
    timings["prepare_s"] = time.perf_counter() - t

    # The report folder (GX's context, data docs, report.json) is built aside and published
    # whole after the dataset, so it describes this run only.
    with _writing_to(report_dir), publish_dir(report_dir) as staged:
        t = time.perf_counter()  # GX's share includes importing it and building the suites
        checks = build_checks(cfg, eval_ids)
        gx_traj = traj.drop(columns=["_first_seen"])
        failing, docs = run_suites(checks, {"trajectories": gx_traj, "steps": steps}, staged)
        timings["great_expectations_s"] = time.perf_counter() - t

        t = time.perf_counter()
        reasons, by_check = _row_reasons(checks, failing, traj, steps)
        bad = np.zeros(len(traj), dtype=bool)
        bad[list(reasons)] = True
        with _writing_to(Path(cfg.out_dir)):
            counts, per_source = _write_validated(
                cfg, manifest_in, (traj_tbl, step_tbl, traj, steps), redacted, bad, reasons,
                {"redactions": redactions, "by_check": by_check},
            )  # fmt: skip
        timings["write_s"] = time.perf_counter() - t
        timings["total_s"] = time.perf_counter() - t0
        rate = _failure_rate(counts)
        report = {
            "passed": rate <= cfg.max_failure_rate,
            "failure_rate": rate,
            "max_failure_rate": cfg.max_failure_rate,
            "counts": counts,
            "sources": per_source,
            "quarantined_by_check": by_check,
            "secret_policy": cfg.secret_policy,
            "redactions": redactions,
            "eval_task_ids": len(eval_ids),
            "warnings": warnings,
            "expectations": [expectation_summary(c, failing) for c in checks],
            "timings_s": {k: round(v, 4) for k, v in timings.items()},
            # Where the docs will be once the folder is published.
            "data_docs": str(report_dir / Path(docs).relative_to(staged.resolve()))
            if docs
            else None,
            "dataset": str(Path(cfg.out_dir)),
            "quarantine": str(Path(cfg.out_dir) / QUARANTINE),
        }
        write_atomic(staged / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    return report


def _prepare(cfg: ValidationConfig, traj_tbl, traj, steps) -> tuple[dict, dict[str, int]]:
    """Add the computed columns the suites check (in place) and redact the text columns.

    Returns the redacted text columns (always what gets written) and the redaction counts;
    with secret_policy=redact the suites see the redacted text, with reject the original.
    """
    import numpy as np

    rx = secret_regex(cfg.secret_patterns) if cfg.secret_patterns else None
    redactions: dict[str, int] = {}
    detector = secret_detector(cfg.secret_patterns)
    redacted = {
        c: _redact_series(steps[c], rx, detector, redactions) if rx else steps[c]
        for c in TEXT_COLUMNS
    }
    steps["traj_row"] = np.repeat(np.arange(len(traj)), traj["num_steps"].to_numpy())
    steps["order_status"] = order_status(steps)
    steps["argument_problem"] = argument_problems(steps)
    steps["tool_set_problem"] = tool_set_problems(steps)
    traj["reward_terms_min"], traj["reward_terms_max"] = reward_term_bounds(traj)
    first = reward_problems(traj_tbl)
    traj["value_field"], traj["value_problem"] = value_problems(traj, TRAJECTORY_VALUES, first)
    steps["value_field"], steps["value_problem"] = value_problems(steps, STEP_VALUES)
    firsts = traj.drop_duplicates("id")
    where = dict(
        zip(
            firsts["id"],
            firsts["source_file"] + ":" + firsts["source_index"].astype(str),
            strict=True,
        )
    )
    traj["_first_seen"] = traj["id"].map(where)
    if cfg.secret_policy == "redact":
        for c in TEXT_COLUMNS:
            steps[c] = redacted[c]
    return redacted, redactions


def _row_reasons(checks: list[Check], failing: dict, traj, steps):
    """({trajectory row: reasons}, {check: trajectories it quarantines}) from GX's rows."""
    reasons: dict[int, list[str]] = defaultdict(list)
    by_check: dict[str, int] = {}
    for check in checks:
        rows = failing.get(check.name, [])
        if check.name == "unique_id":
            # Keep the first copy of a duplicated id; quarantine the later ones.
            first_rows = set(traj.drop_duplicates("id").index)
            rows = [i for i in rows if i not in first_rows]
        hit = set()
        for i in rows:
            row = (traj if check.table == "trajectories" else steps).loc[i].to_dict()
            traj_row = i if check.table == "trajectories" else int(row["traj_row"])
            rid = traj.at[traj_row, "id"]
            reasons[traj_row].append(f"record {rid} field {check.field(row)}: {check.problem(row)}")
            hit.add(traj_row)
        if hit:
            by_check[check.name] = len(hit)
    return reasons, by_check


def _write_validated(cfg, manifest_in: dict, tables, redacted: dict, bad, reasons, found):
    """Write the valid rows and the quarantine (earlier stages' plus ours) to cfg.out_dir.

    `tables` is (trajectory table, step table, their pandas frames); `found` holds the
    redaction counts and rows quarantined per check for the manifest. Returns the counts
    and per-source counts.
    """
    import numpy as np
    import pyarrow as pa

    traj_tbl, step_tbl, traj, steps = tables
    # What gets written: redacted text always (quarantine is versioned by DVC as well).
    red_steps = step_tbl
    for c in TEXT_COLUMNS:
        red_steps = red_steps.set_column(
            red_steps.schema.get_field_index(c),
            c,
            pa.array(redacted[c], type=pa.string(), from_pandas=True),
        )
    step_bad = bad[steps["traj_row"].to_numpy()] if len(steps) else np.zeros(0, dtype=bool)
    quarantine = [
        *read_quarantine(cfg.in_dir),
        *_quarantine_entries(traj, traj_tbl, red_steps.filter(pa.array(step_bad)), bad, reasons),
    ]
    per_source = _per_source(manifest_in, traj, bad)
    counts = reconcile(per_source)
    rate = _failure_rate(counts)
    validation = {
        "passed": rate <= cfg.max_failure_rate,
        "failure_rate": round(rate, 6),
        "max_failure_rate": cfg.max_failure_rate,
        "secret_policy": cfg.secret_policy,
        "redactions": dict(sorted(found["redactions"].items())),
        "quarantined_by_check": dict(sorted(found["by_check"].items())),
        "input_content_hash": manifest_in["content_hash"],
    }
    with publish_dir(Path(cfg.out_dir)) as tmp:
        write_dataset(
            tmp,
            traj_tbl.filter(pa.array(~bad)),
            red_steps.filter(pa.array(~step_bad)),
            quarantine,
            {"stage": "validate", "counts": counts, "sources": per_source,
             "skipped_files": manifest_in.get("skipped_files", []), "validation": validation},
            _rows_per_shard(manifest_in),
            secret_patterns=cfg.secret_patterns,
        )  # fmt: skip
    return counts, per_source


def _quarantine_entries(traj, traj_tbl, bad_steps_tbl, bad, reasons) -> list[dict]:
    """One quarantine line per rejected trajectory, its record rebuilt from the rows."""
    import numpy as np
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum(traj["num_steps"].to_numpy())])
    bad_steps = bad_steps_tbl.to_pylist()
    bad_traj = traj_tbl.filter(pa.array(bad)).to_pylist()
    entries, cursor = [], 0
    for row_i, trow in zip(np.flatnonzero(bad), bad_traj, strict=True):
        n = int(offsets[row_i + 1] - offsets[row_i])
        record = rows_to_record(trow, bad_steps[cursor : cursor + n])
        cursor += n
        entries.append(
            {
                "record": trow["id"],
                "source_file": trow["source_file"],
                "source_index": trow["source_index"],
                "stage": "validate",
                "format": None,
                "reasons": reasons[int(row_i)],
                "raw": record,
            }
        )
    return entries


def _per_source(manifest_in: dict, traj, bad) -> dict[str, dict]:
    """Ingest's counts per source with this stage's quarantine added."""
    per_source: dict[str, dict] = {}
    valid_by_source = traj.loc[~bad, "source_file"].value_counts().to_dict()
    for src, c in manifest_in["sources"].items():
        per_source[src] = {
            "ingested": c["ingested"],
            "valid": int(valid_by_source.get(src, 0)),
            "quarantined": c["quarantined"] + int(((traj["source_file"] == src) & bad).sum()),
            "formats": c.get("formats", {}),
        }
    return per_source


def _failure_rate(counts: dict[str, int]) -> float:
    return counts["quarantined"] / counts["ingested"] if counts["ingested"] else 0.0


def _rows_per_shard(manifest_in: dict) -> int:
    """The input's shard size, so validated shards line up with ingested ones."""
    return max(
        1,
        max(
            (f["rows"] for n, f in manifest_in["files"].items() if n.startswith("trajectories-")),
            default=1,
        ),
    )
