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
the time rows reach these suites every text column is valid UTF-8. Numbers must be finite
and text must not hold NUL characters, anywhere in a record (`values`, `step_values`):
ingest rejects non-finite JSON already; these checks hold for datasets written otherwise.
An empty dataset fails the gate. The stage holds its input shared and its output
exclusively, and publishes the output whole (writers.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.data.config import ValidationConfig
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
from components.data.reading import first_nonfinite
from components.data.redaction import redact_text, secret_detector, secret_regex
from components.data.schema import ROLES, SCHEMA_VERSION, rows_to_record
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


def tool_set_problems(steps) -> list[str | None]:
    """None, or why a step does not fit its trajectory's tool set: the set the first event
    names (`"tool_set"`, the free-form set when none) must exist, and every known tool
    called must be one of its tools. SFT renders the set's prompt, which lists only its
    tools: a record calling another set's tool would teach calls the prompt never offers."""
    firsts = steps["step"].to_numpy() == 0
    declared: dict[int, object] = {}
    for row, extra in zip(steps["traj_row"].to_numpy()[firsts], _pylist(steps["extra"][firsts]),
                          strict=True):  # fmt: skip
        try:
            declared[int(row)] = (json.loads(extra) if extra else {}).get("tool_set")
        except (ValueError, AttributeError):
            declared[int(row)] = None
    out: list[str | None] = []
    rows, actions = steps["traj_row"].to_numpy(), _pylist(steps["action"])
    for row, step, action in zip(rows, steps["step"].to_numpy(), actions, strict=True):
        name = declared.get(int(row)) or DEFAULT_TOOL_SET
        if name not in TOOL_SETS:
            out.append(f"unknown tool set {name!r} (known: {', '.join(TOOL_SETS)})" if step == 0
                       else None)  # fmt: skip
        elif action in TOOL_NAMES and action not in TOOL_SETS[name].tools:
            out.append(f"tool {action!r} is not in the trajectory's tool set {name!r}")
        else:
            out.append(None)
    return out


# (column, field prefix in the record, what to look for): "json" columns hold JSON text
# that may carry NaN/Infinity, "text" columns must not hold NUL characters (binary data).
TRAJECTORY_VALUES = (("reward_terms", "reward_terms", "json"), ("metadata_extra", "metadata", "json"),
                     ("extra", "", "json"), ("task", "task", "text"))  # fmt: skip
STEP_VALUES = (("arguments", "arguments", "json"), ("extra", "", "json"),
               ("content", "content", "text"), ("observation", "observation", "text"))  # fmt: skip


def value_problems(frame, columns, first=None) -> tuple[list, list]:
    """(field, problem) per row: the first non-finite number or NUL-holding text, or None.

    `first` holds problems found before (e.g. the reward column, read from Arrow, where a
    NaN is not the same as a missing value). Only rows a vectorised scan flags are parsed.
    """
    import numpy as np

    fields = list(first[0]) if first else [None] * len(frame)
    problems = list(first[1]) if first else [None] * len(frame)
    for column, prefix, kind in columns:
        series = frame[column]
        token = "NaN|Infinity" if kind == "json" else "\x00"
        hit = series.str.contains(token, regex=kind == "json", na=False).to_numpy(dtype=bool)
        for i in np.flatnonzero(hit):
            if problems[i] is not None:
                continue
            if kind == "text":
                count = series.iat[i].count("\x00")
                fields[i], problems[i] = prefix, f"holds {count} NUL characters (binary, not text)"
                continue
            found = first_nonfinite(json.loads(series.iat[i]))
            if found is not None:
                path = found[0] if found[0] != "<record>" else ""
                fields[i] = ".".join(p for p in (prefix, path) if p) or prefix or "<record>"
                problems[i] = f"{found[1]} is not a finite number"
    return fields, problems


def reward_problems(traj_tbl) -> tuple[list, list]:
    """The reward column's NaN/Infinity values (missing rewards are allowed: unscored)."""
    import pyarrow.compute as pc

    values = traj_tbl.column("reward")
    bad = pc.fill_null(pc.invert(pc.is_finite(values)), False).to_pylist()
    rewards = values.to_pylist()
    fields = ["reward" if b else None for b in bad]
    problems = [
        f"{r} is not a finite number" if b else None for b, r in zip(bad, rewards, strict=True)
    ]
    return fields, problems


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

    def __post_init__(self) -> None:
        # GX hands results back per expectation; the name maps each one back to its check.
        self.expectation.meta = {"check": self.name}


def _step_field(col: str) -> Callable[[dict], str]:
    return lambda r: f"trajectory[{r['step']}].{col}"


def _const(text: str) -> Callable[[dict], str]:
    return lambda r: text


def build_checks(cfg: ValidationConfig, eval_ids: set[str]) -> list[Check]:
    """Every rule of both suites, trajectories first (the order reasons are listed in)."""
    import great_expectations.expectations as gxe

    return [
        *_record_checks(gxe, cfg),
        *_range_checks(gxe, cfg),
        *_contamination_checks(gxe, cfg, eval_ids),
        *_step_checks(gxe, cfg),
        *_secret_checks(gxe, cfg),
        *_value_checks(gxe),
    ]


def _value_checks(gxe) -> list[Check]:
    """No NaN/Infinity anywhere and no NUL characters in text (value_problems)."""
    return [
        Check("values", "trajectories",
              gxe.ExpectColumnValuesToBeNull(column="value_problem"),
              lambda r: r["value_field"], lambda r: r["value_problem"]),
        Check("step_values", "steps",
              gxe.ExpectColumnValuesToBeNull(column="value_problem"),
              lambda r: f"trajectory[{r['step']}].{r['value_field']}".removesuffix("."),
              lambda r: r["value_problem"]),
    ]  # fmt: skip


def _record_checks(gxe, cfg: ValidationConfig) -> list[Check]:
    """Required fields, the schema version and the ids of each trajectory."""
    checks = [
        Check(f"required_{col}", "trajectories", gxe.ExpectColumnValuesToNotBeNull(column=col),
              _const(col), _const("required field is missing"))
        for col in ("id", "task_id", "source", "task", "schema_version", "num_steps")
    ]  # fmt: skip
    checks += [
        Check(
            "schema_version",
            "trajectories",
            gxe.ExpectColumnValuesToBeInSet(column="schema_version", value_set=[SCHEMA_VERSION]),
            _const("schema_version"),
            lambda r: f"unsupported schema_version {r['schema_version']}",
        ),
        Check(
            "unique_id",
            "trajectories",
            gxe.ExpectColumnValuesToBeUnique(column="id"),
            _const("id"),
            lambda r: f"duplicate id {r['id']!r} (first seen at {r['_first_seen']})",
        ),
    ]
    checks += [
        Check(f"{col}_pattern", "trajectories",
              gxe.ExpectColumnValuesToMatchRegex(column=col, regex=cfg.id_pattern), _const(col),
              lambda r, c=col: f"{r[c]!r} does not match {cfg.id_pattern}")
        for col in ("id", "task_id")
    ]  # fmt: skip
    return checks


def _range_checks(gxe, cfg: ValidationConfig) -> list[Check]:
    """Rewards, reward terms, trajectory length and task text within the configured bounds."""
    between = gxe.ExpectColumnValuesToBeBetween
    return [
        Check(
            "reward_range",
            "trajectories",
            between(column="reward", min_value=cfg.reward_min, max_value=cfg.reward_max),
            _const("reward"),
            lambda r: f"{r['reward']} is outside [{cfg.reward_min}, {cfg.reward_max}]",
        ),
        Check(
            "reward_term_min",
            "trajectories",
            between(column="reward_terms_min", min_value=cfg.reward_term_min),
            _const("reward_terms"),
            lambda r: (
                f"a term is {r['reward_terms_min']} (< {cfg.reward_term_min}): {r['reward_terms']}"
            ),
        ),
        Check(
            "reward_term_max",
            "trajectories",
            between(column="reward_terms_max", max_value=cfg.reward_term_max),
            _const("reward_terms"),
            lambda r: (
                f"a term is {r['reward_terms_max']} (> {cfg.reward_term_max}): {r['reward_terms']}"
            ),
        ),
        Check(
            "num_steps",
            "trajectories",
            between(column="num_steps", min_value=cfg.min_steps, max_value=cfg.max_steps),
            _const("trajectory"),
            lambda r: f"{r['num_steps']} events (allowed {cfg.min_steps}..{cfg.max_steps})",
        ),
        Check(
            "task_length",
            "trajectories",
            gxe.ExpectColumnValueLengthsToBeBetween(
                column="task", min_value=1, max_value=cfg.max_task_chars
            ),
            _const("task"),
            lambda r: f"task text is {len(r['task'])} chars (allowed 1..{cfg.max_task_chars})",
        ),
    ]


def _contamination_checks(gxe, cfg: ValidationConfig, eval_ids: set[str]) -> list[Check]:
    """No trajectory of an evaluation task or labelled with an evaluation split."""
    checks = []
    if eval_ids:
        splits = "/".join(cfg.eval_splits)
        checks.append(
            Check(
                "eval_task",
                "trajectories",
                gxe.ExpectColumnValuesToNotBeInSet(column="task_id", value_set=sorted(eval_ids)),
                _const("task_id"),
                lambda r: (
                    f"task {r['task_id']!r} is in an evaluation split ({splits}): contamination"
                ),
            )
        )
    if cfg.eval_splits:
        checks.append(
            Check(
                "eval_split",
                "trajectories",
                gxe.ExpectColumnValuesToNotBeInSet(column="split", value_set=list(cfg.eval_splits)),
                _const("metadata.split"),
                lambda r: (
                    f"trajectory is labelled split {r['split']!r}, an evaluation split: contamination"
                ),
            )
        )
    return checks


def _step_checks(gxe, cfg: ValidationConfig) -> list[Check]:
    """Each event: required fields, a known role in order, a known tool with valid
    arguments, text within the length limits."""
    in_set, lengths = gxe.ExpectColumnValuesToBeInSet, gxe.ExpectColumnValueLengthsToBeBetween
    checks = [
        Check(f"required_step_{col}", "steps", gxe.ExpectColumnValuesToNotBeNull(column=col),
              _step_field(col), _const("required field is missing"))
        for col in ("trajectory_id", "step", "role")
    ]  # fmt: skip
    return [
        *checks,
        Check(
            "role",
            "steps",
            in_set(column="role", value_set=list(ROLES)),
            _step_field("role"),
            lambda r: f"unknown role {r['role']!r}",
        ),
        Check(
            "role_order",
            "steps",
            in_set(column="order_status", value_set=["ok"]),
            _step_field("role"),
            lambda r: r["order_status"],
        ),
        Check(
            "tool_known",
            "steps",
            in_set(column="action", value_set=list(TOOL_NAMES)),
            _step_field("action"),
            lambda r: f"unknown tool {r['action']!r} (known: {', '.join(TOOL_NAMES)})",
        ),
        Check(
            "tool_set",
            "steps",
            gxe.ExpectColumnValuesToBeNull(column="tool_set_problem"),
            lambda r: f"trajectory[{r['step']}].{'action' if r['step'] else 'tool_set'}",
            lambda r: r["tool_set_problem"],
        ),
        Check(
            "tool_arguments",
            "steps",
            gxe.ExpectColumnValuesToBeNull(column="argument_problem"),
            _step_field("arguments"),
            lambda r: r["argument_problem"],
        ),
        Check(
            "observation_length",
            "steps",
            lengths(column="observation", max_value=cfg.max_observation_chars),
            _step_field("observation"),
            lambda r: (
                f"observation is {len(r['observation'])} chars (max {cfg.max_observation_chars})"
            ),
        ),
        Check(
            "content_length",
            "steps",
            lengths(column="content", max_value=cfg.max_content_chars),
            _step_field("content"),
            lambda r: f"content is {len(r['content'])} chars (max {cfg.max_content_chars})",
        ),
    ]


def _secret_checks(gxe, cfg: ValidationConfig) -> list[Check]:
    """No credential in any text column (checked on redacted text unless policy is reject)."""
    if not cfg.secret_patterns:
        return []
    # One alternation: a pass over each text column instead of one per credential kind
    # (the kinds are named in the reason, per failing row).
    patterns = [secret_detector(cfg.secret_patterns)]
    return [
        Check(
            f"secret_{col}",
            "steps",
            gxe.ExpectColumnValuesToNotMatchRegexList(column=col, regex_list=patterns),
            _step_field(col),
            lambda r, c=col: (
                f"contains a credential ({_secret_kinds(r[c], cfg)}); secret_policy=reject"
            ),
        )
        for col in ("observation", "content", "arguments")
    ]


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
        # Only the failing rows' indices are needed (the quarantine holds the records and
        # their reasons): GX need not copy the failing values nor render an index query.
        result = definition.run(
            batch_parameters={"dataframe": df},
            result_format={
                "result_format": "COMPLETE",
                "return_unexpected_index_query": False,
                "exclude_unexpected_values": True,
                "partial_unexpected_count": 0,
            },
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
            "expectations": [_expectation_summary(c, failing) for c in checks],
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


def _expectation_summary(check: Check, failing: dict) -> dict:
    return {
        "check": check.name,
        "suite": f"agentrl_{check.table}",
        "expectation": check.expectation.expectation_type,
        "column": check.expectation.column,
        "success": check.name not in failing,
        "unexpected_rows": len(failing.get(check.name, [])),
    }
