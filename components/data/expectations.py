"""The validation suites: one Great Expectations suite per table (schema.py), `trajectories`
(one row per record) and `steps` (one row per event), each rule a `Check` that also names
the field and the problem a failing row is reported with; `run_suites` runs them and
writes the data docs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.data.config import ValidationConfig
from components.data.redaction import secret_detector
from components.data.schema import ROLES, SCHEMA_VERSION
from components.env.tool_sets import TOOL_NAMES


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


def expectation_summary(check: Check, failing: dict) -> dict:
    return {
        "check": check.name,
        "suite": f"agentrl_{check.table}",
        "expectation": check.expectation.expectation_type,
        "column": check.expectation.column,
        "success": check.name not in failing,
        "unexpected_rows": len(failing.get(check.name, [])),
    }
