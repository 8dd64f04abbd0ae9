"""Validate an ingested dataset with Great Expectations; quarantine what fails.

Two suites, one per table (schema.py): `trajectories` (one row per record) and `steps`
(one row per event). Checks GX cannot state directly (role order, arguments valid for the
tool) are first computed as plain columns with vectorised pandas/numpy, then asserted by
GX expectations like every other rule, so the suites are the gate and the data docs show
every rule. Each failing row GX reports is mapped back to its record and becomes a reason
"record <id> field <path>: <problem>"; a record with any reason goes to quarantine.

Secrets: credentials are always redacted in what is written (valid data *and* quarantine,
since both end up in DVC). With secret_policy=redact the suite checks the redacted text
and the record passes; with reject it checks the original and the record is quarantined.

UTF-8 validity is enforced at ingest (Parquet strings cannot hold invalid UTF-8), so by
the time rows reach these suites every text column is valid UTF-8.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.data.config import BOUNDARY, ValidationConfig
from components.data.ingest import (
    QUARANTINE,
    read_manifest,
    read_quarantine,
    read_tables,
    reconcile,
    write_dataset,
)
from components.data.schema import ROLES, SCHEMA_VERSION, rows_to_record
from components.env.tool_specs import TOOL_NAMES, TOOL_SPECS, argument_errors

REDACTED = "[REDACTED:{kind}]"


class ValidationFailed(RuntimeError):
    """The quarantine rate exceeded the configured threshold."""


# ------------------------------------------------------------------ secrets


def secret_regex(patterns: dict[str, str]) -> re.Pattern:
    """One alternation with a named group per credential kind, for redaction in Python."""
    lookbehind = "(?<![A-Za-z0-9_])"
    return re.compile(
        "|".join(
            f"(?P<{name}>{lookbehind + rx.removeprefix(BOUNDARY) if rx.startswith(BOUNDARY) else rx})"
            for name, rx in patterns.items()
        )
    )


def secret_detector(patterns: dict[str, str]) -> str:
    """The same patterns as one RE2-friendly alternation (for vectorised pre-filtering)."""
    return "|".join(f"(?:{rx})" for rx in patterns.values())


def redact_text(text: str, rx: re.Pattern, counts: dict[str, int] | None = None) -> str:
    def _sub(m: re.Match) -> str:
        if counts is not None:
            counts[m.lastgroup] = counts.get(m.lastgroup, 0) + 1
        return REDACTED.format(kind=m.lastgroup)

    return rx.sub(_sub, text)


def _redact_series(series, rx: re.Pattern, detector: str, counts: dict[str, int]):
    """Redact a string column; only rows the vectorised detector flags pay the Python cost."""
    hit = series.str.contains(detector, regex=True, na=False)
    if not hit.any():
        return series
    out = series.copy()
    out[hit] = series[hit].map(lambda s: redact_text(s, rx, counts))
    return out


# ------------------------------------------------------------------ computed columns


def _pylist(series) -> list:
    """Column values with missing ones as None (pandas gives NaN for missing strings)."""
    return series.astype(object).where(series.notna(), None).tolist()


def order_status(steps) -> list[str]:
    """'ok' or what is wrong with each event's place in its trajectory.

    Rules: the first event is the user's task; every assistant action is followed
    directly by an environment observation; every observation follows an action.
    """
    import numpy as np

    traj = steps["traj_row"].to_numpy()
    role = steps["role"].to_numpy(dtype=object)
    action = _pylist(steps["action"])
    n = len(role)
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = traj[:-1] == traj[1:]
    first = np.ones(n, dtype=bool)
    first[1:] = traj[1:] != traj[:-1]
    is_action = (role == "assistant") & steps["action"].notna().to_numpy()
    next_env = np.zeros(n, dtype=bool)
    next_env[:-1] = role[1:] == "environment"
    prev_action = np.zeros(n, dtype=bool)
    prev_action[1:] = is_action[:-1]
    no_obs = is_action & ~(same_next & next_env)
    orphan = (role == "environment") & (first | ~prev_action)
    bad_first = first & (role != "user")
    status = np.full(n, "ok", dtype=object)
    for i in np.flatnonzero(no_obs | orphan | bad_first):
        if bad_first[i]:
            status[i] = f"first event must be the user's task, got role {role[i]!r}"
        elif no_obs[i]:
            nxt = f"a {role[i + 1]!r} event" if same_next[i] else "the end of the trajectory"
            status[i] = f"action {action[i]!r} is not followed by its observation (next is {nxt})"
        else:
            status[i] = "observation does not follow an assistant action"
    return status.tolist()


def argument_problems(steps) -> list[str | None]:
    """None, or why the arguments do not fit the tool (unknown tools are a separate rule)."""
    cache: dict[tuple[str, str], str | None] = {}
    out: list[str | None] = []
    for action, args in zip(_pylist(steps["action"]), _pylist(steps["arguments"]), strict=True):
        if action is None or action not in TOOL_SPECS:
            out.append(None)
            continue
        key = (action, args)
        if key not in cache:
            parsed = json.loads(args) if args is not None else {}
            errors = argument_errors(action, parsed)
            cache[key] = "; ".join(errors) if errors else None
        out.append(cache[key])
    return out


def reward_term_bounds(traj) -> tuple[list, list]:
    lows, highs = [], []
    for terms in _pylist(traj["reward_terms"]):
        values = list(json.loads(terms).values()) if terms else []
        lows.append(min(values) if values else None)
        highs.append(max(values) if values else None)
    return lows, highs


def eval_task_ids(cfg: ValidationConfig) -> tuple[set[str], list[str]]:
    """Task ids of the evaluation splits (task folder + config list) and load warnings."""
    ids = set(cfg.eval_task_ids)
    warnings: list[str] = []
    if cfg.eval_task_root:
        from components.tasks.task import load_tasks

        tasks, errors = load_tasks(cfg.eval_task_root)
        ids.update(t.id for t in tasks if t.metadata.split in cfg.eval_splits)
        warnings += [f"eval task folder: {e}" for e in errors]
    return ids, warnings


# ------------------------------------------------------------------ the suites


@dataclass(frozen=True)
class Check:
    """One expectation plus how to word a failing row as "field <path>: <problem>"."""

    name: str
    table: str  # "trajectories" | "steps"
    expectation: object
    field: Callable[[dict], str]  # row -> field path in the canonical record
    problem: Callable[[dict], str]  # row -> what is wrong


def _step_field(col: str) -> Callable[[dict], str]:
    return lambda r: f"trajectory[{r['step']}].{col}"


def _const(text: str) -> Callable[[dict], str]:
    return lambda r: text


def build_checks(cfg: ValidationConfig, eval_ids: set[str]) -> list[Check]:
    import great_expectations.expectations as gxe

    checks: list[Check] = []

    def add(name, table, expectation, field, problem):
        expectation.meta = {"check": name}
        checks.append(Check(name, table, expectation, field, problem))

    for col in ("id", "task_id", "source", "task", "schema_version", "num_steps"):
        add(
            f"required_{col}",
            "trajectories",
            gxe.ExpectColumnValuesToNotBeNull(column=col),
            _const(col),
            _const("required field is missing"),
        )
    add(
        "schema_version",
        "trajectories",
        gxe.ExpectColumnValuesToBeInSet(column="schema_version", value_set=[SCHEMA_VERSION]),
        _const("schema_version"),
        lambda r: f"unsupported schema_version {r['schema_version']}",
    )
    add(
        "unique_id",
        "trajectories",
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        _const("id"),
        lambda r: f"duplicate id {r['id']!r} (first seen at {r['_first_seen']})",
    )
    for col in ("id", "task_id"):
        add(
            f"{col}_pattern",
            "trajectories",
            gxe.ExpectColumnValuesToMatchRegex(column=col, regex=cfg.id_pattern),
            _const(col),
            lambda r, c=col: f"{r[c]!r} does not match {cfg.id_pattern}",
        )
    add(
        "reward_range",
        "trajectories",
        gxe.ExpectColumnValuesToBeBetween(
            column="reward", min_value=cfg.reward_min, max_value=cfg.reward_max
        ),
        _const("reward"),
        lambda r: f"{r['reward']} is outside [{cfg.reward_min}, {cfg.reward_max}]",
    )
    add(
        "reward_term_min",
        "trajectories",
        gxe.ExpectColumnValuesToBeBetween(column="reward_terms_min", min_value=cfg.reward_term_min),
        _const("reward_terms"),
        lambda r: (
            f"a term is {r['reward_terms_min']} (< {cfg.reward_term_min}): {r['reward_terms']}"
        ),
    )
    add(
        "reward_term_max",
        "trajectories",
        gxe.ExpectColumnValuesToBeBetween(column="reward_terms_max", max_value=cfg.reward_term_max),
        _const("reward_terms"),
        lambda r: (
            f"a term is {r['reward_terms_max']} (> {cfg.reward_term_max}): {r['reward_terms']}"
        ),
    )
    add(
        "num_steps",
        "trajectories",
        gxe.ExpectColumnValuesToBeBetween(
            column="num_steps", min_value=cfg.min_steps, max_value=cfg.max_steps
        ),
        _const("trajectory"),
        lambda r: f"{r['num_steps']} events (allowed {cfg.min_steps}..{cfg.max_steps})",
    )
    add(
        "task_length",
        "trajectories",
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="task", min_value=1, max_value=cfg.max_task_chars
        ),
        _const("task"),
        lambda r: f"task text is {len(r['task'])} chars (allowed 1..{cfg.max_task_chars})",
    )
    if eval_ids:
        add(
            "eval_task",
            "trajectories",
            gxe.ExpectColumnValuesToNotBeInSet(column="task_id", value_set=sorted(eval_ids)),
            _const("task_id"),
            lambda r: (
                f"task {r['task_id']!r} is in an evaluation split ({'/'.join(cfg.eval_splits)}): contamination"
            ),
        )
    if cfg.eval_splits:
        add(
            "eval_split",
            "trajectories",
            gxe.ExpectColumnValuesToNotBeInSet(column="split", value_set=list(cfg.eval_splits)),
            _const("metadata.split"),
            lambda r: (
                f"trajectory is labelled split {r['split']!r}, an evaluation split: contamination"
            ),
        )

    for col in ("trajectory_id", "step", "role"):
        add(
            f"required_step_{col}",
            "steps",
            gxe.ExpectColumnValuesToNotBeNull(column=col),
            _step_field(col),
            _const("required field is missing"),
        )
    add(
        "role",
        "steps",
        gxe.ExpectColumnValuesToBeInSet(column="role", value_set=list(ROLES)),
        _step_field("role"),
        lambda r: f"unknown role {r['role']!r}",
    )
    add(
        "role_order",
        "steps",
        gxe.ExpectColumnValuesToBeInSet(column="order_status", value_set=["ok"]),
        _step_field("role"),
        lambda r: r["order_status"],
    )
    add(
        "tool_known",
        "steps",
        gxe.ExpectColumnValuesToBeInSet(column="action", value_set=list(TOOL_NAMES)),
        _step_field("action"),
        lambda r: f"unknown tool {r['action']!r} (known: {', '.join(TOOL_NAMES)})",
    )
    add(
        "tool_arguments",
        "steps",
        gxe.ExpectColumnValuesToBeNull(column="argument_problem"),
        _step_field("arguments"),
        lambda r: r["argument_problem"],
    )
    add(
        "observation_length",
        "steps",
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="observation", max_value=cfg.max_observation_chars
        ),
        _step_field("observation"),
        lambda r: f"observation is {len(r['observation'])} chars (max {cfg.max_observation_chars})",
    )
    add(
        "content_length",
        "steps",
        gxe.ExpectColumnValueLengthsToBeBetween(column="content", max_value=cfg.max_content_chars),
        _step_field("content"),
        lambda r: f"content is {len(r['content'])} chars (max {cfg.max_content_chars})",
    )
    patterns = list(cfg.secret_patterns.values())
    if patterns:
        for col in ("observation", "content", "arguments"):
            add(
                f"secret_{col}",
                "steps",
                gxe.ExpectColumnValuesToNotMatchRegexList(column=col, regex_list=patterns),
                _step_field(col),
                lambda r, c=col: (
                    f"contains a credential ({_secret_kinds(r[c], cfg)}); secret_policy=reject"
                ),
            )
    return checks


def _secret_kinds(text: str, cfg: ValidationConfig) -> str:
    kinds = [name for name, rx in cfg.secret_patterns.items() if re.search(rx, text or "")]
    return ", ".join(kinds) or "credential"


def run_suites(checks: list[Check], frames: dict, report_dir: Path) -> tuple[dict, str | None]:
    """Run both suites in a file-backed GX context under report_dir, then build the data
    docs once. Returns ({check: failing row indices}, data docs index path)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network from a data stage
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    report_dir.mkdir(parents=True, exist_ok=True)
    # Docs describe this run only: old results would be re-rendered on every build.
    for old in ("gx/uncommitted/validations", "gx/uncommitted/data_docs"):
        shutil.rmtree(report_dir / old, ignore_errors=True)
    context = gx.get_context(mode="file", project_root_dir=str(report_dir))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    failing: dict[str, list[int]] = {}
    for table, df in frames.items():
        source = context.data_sources.add_or_update_pandas(f"agentrl_{table}")
        asset = source.add_dataframe_asset(table)
        batch_def = asset.add_batch_definition_whole_dataframe("all_rows")
        suite = context.suites.add_or_update(gx.ExpectationSuite(name=f"agentrl_{table}"))
        for c in checks:
            if c.table == table:
                suite.add_expectation(c.expectation)
        definition = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=f"agentrl_{table}", data=batch_def, suite=suite)
        )
        # run() stores the result in the context's validation store (read by the docs).
        result = definition.run(
            batch_parameters={"dataframe": df}, result_format={"result_format": "COMPLETE"}
        )
        for r in result.results:
            name = r.expectation_config.meta["check"]
            if r.exception_info and r.exception_info.get("raised_exception"):
                raise RuntimeError(
                    f"expectation {name} raised: {r.exception_info['exception_message']}"
                )
            if not r.success:
                failing[name] = [int(i) for i in r.result.get("unexpected_index_list") or []]
                if not failing[name] and r.result.get("unexpected_count"):
                    raise RuntimeError(f"expectation {name} failed without row indices")
    context.build_data_docs()
    docs = context.get_docs_sites_urls()
    url = docs[0]["site_url"] if docs else None
    return failing, url.removeprefix("file://") if url else None


# ------------------------------------------------------------------ the stage


def validate_dataset(cfg: ValidationConfig) -> dict:
    """Validate cfg.in_dir into cfg.out_dir; returns the report (also written as JSON).

    The report's `passed` is False when quarantined / ingested > cfg.max_failure_rate.
    """
    import numpy as np
    import pyarrow as pa

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    in_dir, out_dir, report_dir = Path(cfg.in_dir), Path(cfg.out_dir), Path(cfg.report_dir)
    manifest_in = read_manifest(in_dir)
    traj_tbl, step_tbl = read_tables(in_dir)
    traj = traj_tbl.to_pandas()
    steps = step_tbl.to_pandas()
    timings["read_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    rx = secret_regex(cfg.secret_patterns) if cfg.secret_patterns else None
    redactions: dict[str, int] = {}
    text_cols = ("observation", "content", "arguments")
    detector = secret_detector(cfg.secret_patterns)
    redacted = {
        c: _redact_series(steps[c], rx, detector, redactions) if rx else steps[c] for c in text_cols
    }
    steps["traj_row"] = np.repeat(np.arange(len(traj)), traj["num_steps"].to_numpy())
    steps["order_status"] = order_status(steps)
    steps["argument_problem"] = argument_problems(steps)
    traj["reward_terms_min"], traj["reward_terms_max"] = reward_term_bounds(traj)
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
        for c in text_cols:
            steps[c] = redacted[c]
    eval_ids, warnings = eval_task_ids(cfg)
    timings["prepare_s"] = time.perf_counter() - t

    t = time.perf_counter()  # GX's share includes importing it and building the suites
    checks = build_checks(cfg, eval_ids)
    gx_traj = traj.drop(columns=["_first_seen"])
    failing, docs = run_suites(checks, {"trajectories": gx_traj, "steps": steps}, report_dir)
    timings["great_expectations_s"] = time.perf_counter() - t

    t = time.perf_counter()
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

    # What gets written: redacted text always (quarantine is versioned by DVC as well).
    red_steps = step_tbl
    for c in text_cols:
        red_steps = red_steps.set_column(
            red_steps.schema.get_field_index(c),
            c,
            pa.array(redacted[c], type=pa.string(), from_pandas=True),
        )
    bad = np.zeros(len(traj), dtype=bool)
    bad[list(reasons)] = True
    step_bad = bad[steps["traj_row"].to_numpy()] if len(steps) else np.zeros(0, dtype=bool)
    offsets = np.concatenate([[0], np.cumsum(traj["num_steps"].to_numpy())])
    quarantine = list(read_quarantine(in_dir))
    bad_steps = red_steps.filter(pa.array(step_bad)).to_pylist()
    bad_traj = traj_tbl.filter(pa.array(bad)).to_pylist()
    cursor = 0
    for row_i, trow in zip(np.flatnonzero(bad), bad_traj, strict=True):
        n = int(offsets[row_i + 1] - offsets[row_i])
        record = rows_to_record(trow, bad_steps[cursor : cursor + n])
        cursor += n
        quarantine.append(
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
    valid_traj = traj_tbl.filter(pa.array(~bad))
    valid_steps = red_steps.filter(pa.array(~step_bad))

    per_source: dict[str, dict] = {}
    valid_by_source = traj.loc[~bad, "source_file"].value_counts().to_dict()
    for src, c in manifest_in["sources"].items():
        valid = int(valid_by_source.get(src, 0))
        per_source[src] = {
            "ingested": c["ingested"],
            "valid": valid,
            "quarantined": c["quarantined"] + int(((traj["source_file"] == src) & bad).sum()),
            "formats": c.get("formats", {}),
        }
    counts = reconcile(per_source)
    rate = counts["quarantined"] / counts["ingested"] if counts["ingested"] else 0.0
    passed = rate <= cfg.max_failure_rate
    rows_per_shard = max(
        1,
        max(
            (f["rows"] for n, f in manifest_in["files"].items() if n.startswith("trajectories-")),
            default=1,
        ),
    )
    write_dataset(
        out_dir,
        valid_traj,
        valid_steps,
        quarantine,
        {
            "stage": "validate",
            "counts": counts,
            "sources": per_source,
            "skipped_files": manifest_in.get("skipped_files", []),
            "validation": {
                "passed": passed,
                "failure_rate": round(rate, 6),
                "max_failure_rate": cfg.max_failure_rate,
                "secret_policy": cfg.secret_policy,
                "redactions": dict(sorted(redactions.items())),
                "quarantined_by_check": dict(sorted(by_check.items())),
                "input_content_hash": manifest_in["content_hash"],
            },
        },
        rows_per_shard,
        secret_patterns=cfg.secret_patterns,
    )
    timings["write_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    report = {
        "passed": passed,
        "failure_rate": rate,
        "max_failure_rate": cfg.max_failure_rate,
        "counts": counts,
        "sources": per_source,
        "quarantined_by_check": by_check,
        "secret_policy": cfg.secret_policy,
        "redactions": redactions,
        "eval_task_ids": len(eval_ids),
        "warnings": warnings,
        "expectations": [
            {
                "check": c.name,
                "suite": f"agentrl_{c.table}",
                "expectation": c.expectation.expectation_type,
                "column": c.expectation.column,
                "success": c.name not in failing,
                "unexpected_rows": len(failing.get(c.name, [])),
            }
            for c in checks
        ],
        "timings_s": {k: round(v, 4) for k, v in timings.items()},
        "data_docs": docs,
        "dataset": str(out_dir),
        "quarantine": str(out_dir / QUARANTINE),
    }
    (report_dir / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report
