"""Columns computed for the validation suites: checks Great Expectations cannot state
directly (role order, arguments valid for the tool and its tool set, finite numbers and no
NUL anywhere in a record's values, reward terms in bounds) as plain columns, vectorised
with pandas/numpy, which GX expectations then assert like every other rule; and the
evaluation task ids a training record must not hold (contamination)."""

from __future__ import annotations

import json

from components.data.config import ValidationConfig
from components.data.reading import first_nonfinite
from components.env.tool_sets import (
    DEFAULT_TOOL_SET,
    TOOL_NAMES,
    TOOL_SETS,
    TOOL_SPECS,
    argument_errors,
)


def pylist(series) -> list:
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
    action = pylist(steps["action"])
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
    for action, args in zip(pylist(steps["action"]), pylist(steps["arguments"]), strict=True):
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
    for row, extra in zip(steps["traj_row"].to_numpy()[firsts], pylist(steps["extra"][firsts]),
                          strict=True):  # fmt: skip
        try:
            declared[int(row)] = (json.loads(extra) if extra else {}).get("tool_set")
        except (ValueError, AttributeError):
            declared[int(row)] = None
    out: list[str | None] = []
    rows, actions = steps["traj_row"].to_numpy(), pylist(steps["action"])
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
    for terms in pylist(traj["reward_terms"]):
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
