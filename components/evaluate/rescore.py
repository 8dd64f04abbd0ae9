"""`agentrl rescore`: judge stored episodes again under the current verifier.

A fix to the verifier leaves every stored reward, dataset and evaluation computed under the
old one. Rescoring replays each stored episode into a fresh workspace over its task and
verifies that, so the new verdict comes from a fresh verification only; nothing the record
says about its own verdict (reward, terms, success, a stored diff next to actions) enters it.

- **Replay.** An episode with recorded actions is played again through its tool set (the
  record's first event names it) in a fresh `EpisodeEnv`: the same monitor, tools and
  sandbox, so the episode's facts (tests run, blocked actions, invalid calls, counted terms)
  are recomputed too, and `finish` verifies the final tree. A record with no actions but a
  `final_diff` (an expert log that kept only its patch) has the diff applied to a fresh
  copy of the task's repository (the strict patcher: no path outside it) and is verified
  with the facts of an episode that did nothing. A replayed tree whose diff differs from
  the stored `final_diff` is reported (`diverged`): the actions, not the diff, are the
  episode. Anything else is `unreplayable`, with why, and keeps no new verdict.
- **Speed.** Episodes replay in `workers` threads; verdicts are cached by (task, tree), so
  a GRPO group's identical trees are verified once (components/verifier/verdict.py).
- **Report.** Per episode the old and new verdict and reward terms, the flips in each
  direction, the tasks involved and what the new verdicts flagged (`report.json`,
  `report.md`); the rescored records (`rescored.jsonl`) and, for episodes that replayed,
  per-task results (`results.json`) under the current verifier version.
- **--write** (a dataset folder inside the versioned data folder): the dataset is rewritten
  with the new verdicts and snapshotted as a new data version whose log entry's `lineage`
  names the version it was rescored from and both verifier versions; the old version
  stays for `agentrl data rollback`. A record with no new verdict goes to the dataset's
  quarantine with why, never on as data with its unconfirmed reward.
- **Bounds.** A stored record is hostile input, and no record may stall or end the run
  (issue 44): a line that is not JSON, nests deeper than MAX_RECORD_DEPTH, or has fields of
  the wrong type is quarantined with one line naming it (`quarantined: record ...`) and the
  run goes on; its replay goes through the tools' own limits (components/env/safety.py),
  and a stored diff over MAX_DIFF_BYTES is refused unread, a shorter one applied under the
  patcher's comparison budget and the sandbox's file limit (components/tasks/patching.py).
  Every record is counted once: rescored + not rescored = episodes, and the quarantined
  are among the not rescored.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from components.env.config import EnvConfig
from components.env.episode import END_REASONS, Action, EpisodeEnv, EpisodeResult
from components.sandbox.config import SandboxConfig
from components.tasks.patching import PatchError, apply_unified_diff
from components.tasks.task import Task
from components.verifier import provenance
from components.verifier.cache import verdict_cache_info
from components.verifier.version import verifier_version

# What a stored record may be (module docstring, Bounds).
MAX_RECORD_DEPTH = 64
MAX_DIFF_BYTES = 1024 * 1024
QUARANTINED = "quarantined: "


class RescoreError(ValueError):
    """The stored episodes cannot be read or rescored as asked; the message says which."""


@dataclass
class Rescored:
    """One episode judged again: its old verdict (as stored) beside the new one."""

    id: str
    task_id: str
    replay: str  # "actions" | "diff" | "" (not replayed)
    old: dict  # {"success", "reward", "reward_terms", "verifier_version"} as stored
    new: dict | None = None  # the same keys under the current verifier; None: no verdict
    flags: list[str] = field(default_factory=list)  # categories the new verdict flagged
    diverged: bool = False  # the replayed tree's diff is not the stored final_diff
    error: str = ""  # why it was not replayed (or why the replay has no verdict)
    result: EpisodeResult | None = field(default=None, repr=False)

    @property
    def flip(self) -> str:
        """ "pass->fail", "fail->pass" or "" (same outcome, or a side unknown)."""
        if self.new is None or self.old["success"] is None:
            return ""
        before, after = bool(self.old["success"]), bool(self.new["success"])
        return "" if before == after else ("pass->fail" if before else "fail->pass")

    def row(self) -> dict:
        return {"id": self.id, "task_id": self.task_id, "replay": self.replay, "old": self.old,
                "new": self.new, "flip": self.flip, "flags": self.flags,
                "diverged": self.diverged, "error": self.error}  # fmt: skip


def _nesting_depth(value: object, limit: int) -> int:
    """How deep `value` nests (stops counting past `limit`), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]
    return deepest


def record_problem(record: object) -> str | None:
    """Why a stored record cannot be rescored at all (None: its shape is sound)."""
    if not isinstance(record, dict):
        return f"a record must be a JSON object, not {type(record).__name__}"
    if _nesting_depth(record, MAX_RECORD_DEPTH) > MAX_RECORD_DEPTH:
        return f"nested deeper than {MAX_RECORD_DEPTH} levels"
    kinds = {"id": (str, int), "task_id": (str,), "trajectory": (list,),
             "metadata": (dict, type(None)), "final_diff": (str, type(None))}  # fmt: skip
    for key, allowed in kinds.items():
        if key in ("id", "task_id", "trajectory") and key not in record:
            return f"field {key} is missing"
        if key in record and not isinstance(record[key], allowed):
            return f"field {key} is a {type(record[key]).__name__}"
    return None


def _record_name(record: object) -> str:
    """A record's id for a report line, whatever the record holds."""
    rid = record.get("id") if isinstance(record, dict) else None
    return str(rid)[:200] if isinstance(rid, str | int) else "?"


def _quarantined_line(source: str, n: int, reason: str) -> dict:
    """A stand-in for a line that is no record: rescore reports it quarantined, by line."""
    return {"id": f"{source}:{n}", "task_id": "", "trajectory": [], "quarantine": reason}


def _old_verdict(record: dict) -> dict:
    meta = record.get("metadata") or {}
    success = meta.get("success")
    return {"success": success if isinstance(success, bool) else None,
            "reward": record.get("reward"), "reward_terms": record.get("reward_terms") or {},
            "verifier_version": meta.get("verifier_version") or ""}  # fmt: skip


def _action(event: dict) -> Action:
    tool = event.get("action")
    if tool is None:  # a turn that was not a parseable call stays one
        return Action(None, {}, content=event.get("content"), parse_error="unparseable")
    return Action(tool, event.get("arguments") or {}, content=event.get("content"))


def replay_episode(
    record: dict, task: Task, env: EnvConfig, sandbox: SandboxConfig
) -> tuple[EpisodeResult, str]:
    """The episode played again in a fresh workspace and verified now; returns (result, how:
    "actions" or "diff"). Raises RescoreError when there is nothing to replay or the stored
    diff does not apply."""
    events = record.get("trajectory") or []
    turns = [e for e in events if isinstance(e, dict) and e.get("role") == "assistant"]
    first = events[0] if events and isinstance(events[0], dict) else {}
    tool_set = first.get("tool_set") or env.tool_set
    try:
        env = env.with_tool_set(tool_set)
    except KeyError as e:
        raise RescoreError(f"record {record.get('id')}: unknown tool set {tool_set!r}") from e
    # The episode's own length: a record never ends earlier on replay than it did.
    env = dataclasses.replace(env, max_steps=max(env.max_steps, len(turns), 1))
    meta = record.get("metadata") or {}
    episode = EpisodeEnv(task, env, sandbox, policy_name=str(meta.get("policy") or "rescore"),
                         episode_id=str(record.get("id")),
                         source="oracle" if record.get("source") == "oracle" else "rollout")  # fmt: skip
    try:
        if turns:
            how = "actions"
            for event in turns:
                if episode.done:
                    break
                episode.step(_action(event))
        elif isinstance(record.get("final_diff"), str) and record["final_diff"]:
            how = "diff"
            if len(record["final_diff"]) > MAX_DIFF_BYTES:
                raise RescoreError(f"record {record.get('id')}: its final_diff is over "
                                   f"{MAX_DIFF_BYTES} bytes; not applied")  # fmt: skip
            try:
                apply_unified_diff(episode.workspace.root, record["final_diff"],
                                   max_file_bytes=sandbox.max_file_bytes)  # fmt: skip
            except PatchError as e:
                raise RescoreError(f"record {record.get('id')}: its final_diff: {e}") from e
        else:
            raise RescoreError(f"record {record.get('id')}: no actions and no final_diff")
        end = meta.get("end_reason")
        episode.stop(end if end in END_REASONS else "max_steps")
    except BaseException:
        episode.workspace.cleanup()
        raise
    return episode.finish(), how


def rescore_record(record: dict, tasks: dict[str, Task], env: EnvConfig,
                   sandbox: SandboxConfig) -> Rescored:  # fmt: skip
    """One stored record judged again (never raises for the record's own defects)."""
    problem = record_problem(record)
    if problem is None and isinstance(record.get("quarantine"), str):
        problem = record["quarantine"]  # a line read_stored could not take as a record
    if problem is not None:
        rid = _record_name(record)
        old = {"success": None, "reward": None, "reward_terms": {}, "verifier_version": ""}
        return Rescored(rid, "", "", old, error=f"{QUARANTINED}record {rid}: {problem}")
    rid, task_id = str(record.get("id")), str(record.get("task_id"))
    out = Rescored(rid, task_id, "", _old_verdict(record))
    task = tasks.get(task_id)
    if task is None:
        out.error = f"task {task_id!r} is not in the task folder"
        return out
    try:
        result, out.replay = replay_episode(record, task, env, sandbox)
    except RescoreError as e:
        out.error = str(e)
        return out
    except Exception as e:  # noqa: BLE001 - a tool or harness fault on replay: this record's
        out.error = f"replay failed: {type(e).__name__}: {e}"
        return out
    out.result = result
    out.flags = sorted({f["category"] for f in result.safety_flags})
    stored = record.get("final_diff")
    out.diverged = (
        out.replay == "actions" and isinstance(stored, str) and (stored != result.final_diff)
    )
    if result.status != "ok":
        out.error = f"no verdict (infrastructure): {result.infra_detail[:200]}"
        return out
    out.new = {"success": result.success, "reward": result.reward,
               "reward_terms": result.reward_terms,
               "verifier_version": result.verifier_version}  # fmt: skip
    return out


def rescore_records(
    records: list[dict],
    tasks: dict[str, Task],
    env: EnvConfig,
    sandbox: SandboxConfig,
    *,
    workers: int = 2,
    on_done: Callable[[Rescored], None] | None = None,
) -> list[Rescored]:
    """Every record judged again, in `workers` threads; results in record order."""

    def one(record: dict) -> Rescored:
        r = rescore_record(record, tasks, env, sandbox)
        if on_done is not None:
            on_done(r)
        return r

    if workers == 1:
        return [one(r) for r in records]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, records))


def rescored_record(record: dict, r: Rescored) -> dict:
    """The stored record with its new verdict (unchanged when it has none: rescored.jsonl
    keeps it for the report, --write quarantines it): reward, terms, success and verifier
    version, and what it was before under `metadata.rescored`."""
    if r.new is None:
        return record
    meta = dict(record.get("metadata") or {})
    meta["rescored"] = {"previous_reward": r.old["reward"], "previous_success": r.old["success"],
                        "previous_verifier_version": r.old["verifier_version"]}  # fmt: skip
    meta.update(success=r.new["success"], verifier_version=r.new["verifier_version"])
    meta.pop(provenance.MAC_FIELD, None)  # the old verdict's signature
    # A foreign record's claim gives way to our verdict (kept for the report), else it
    # would stay foreign for ever and never train.
    claims = {k: record[k] for k in provenance.CLAIMED_FIELDS if k in record}
    if claims:
        meta["rescored"]["claimed"] = claims
    new = {k: v for k, v in record.items() if k not in claims}
    new.update(reward=r.new["reward"], reward_terms=r.new["reward_terms"], metadata=meta)
    if not r.diverged:  # our verifier judged the very tree the record holds: it may train
        provenance.sign_record(new)
    return new


def summarize_rescore(rows: list[Rescored], seconds: float, cache_before: dict) -> dict:
    """Counts the report leads with: flips each way, tasks and flags involved, speed."""
    cache = verdict_cache_info()
    flipped = [r for r in rows if r.flip]
    judged = Counter(r.old["verifier_version"] or "unrecorded" for r in rows)
    return {
        "verifier_version": verifier_version(),
        "judged_by_before": dict(sorted(judged.items())),
        "episodes": len(rows),
        "rescored": sum(r.new is not None for r in rows),
        "not_rescored": sum(r.new is None for r in rows),
        "quarantined": sum(r.error.startswith(QUARANTINED) for r in rows),
        "replayed_from": dict(Counter(r.replay or "none" for r in rows)),
        "flips": {
            "pass->fail": sum(r.flip == "pass->fail" for r in rows),
            "fail->pass": sum(r.flip == "fail->pass" for r in rows),
        },  # fmt: skip
        "reward_changed": sum(
            r.new is not None and r.new["reward"] != r.old["reward"] for r in rows
        ),  # fmt: skip
        "diverged": sum(r.diverged for r in rows),
        "tasks_flipped": sorted({r.task_id for r in flipped}),
        "flags_of_flipped": dict(Counter(f for r in flipped for f in r.flags)),
        "errors": [f"{r.id}: {r.error}" for r in rows if r.error][:50],
        "verdict_cache": {
            "hits": cache["hits"] - cache_before["hits"],
            "misses": cache["misses"] - cache_before["misses"],
        },  # fmt: skip
        "seconds": round(seconds, 3),
        "episodes_per_s": round(len(rows) / seconds, 3) if seconds > 0 else None,
    }


def report_markdown(summary: dict, rows: list[Rescored], source: dict) -> str:
    f = summary["flips"]
    lines = [
        f"# Rescore under verifier {summary['verifier_version']}",
        "",
        f"- source: {source.get('kind')} {source.get('path')}"
        + (f" (data version {source['data_version']})" if source.get("data_version") else ""),
        f"- judged before by: {', '.join(f'{k} ({v})' for k, v in summary['judged_by_before'].items())}",
        f"- episodes {summary['episodes']}: rescored {summary['rescored']}, not rescored "
        f"{summary['not_rescored']}; replayed from {summary['replayed_from']}",
        f"- flips: pass->fail {f['pass->fail']}, fail->pass {f['fail->pass']}; reward changed "
        f"{summary['reward_changed']}; replay diverged from the stored diff {summary['diverged']}",
        f"- tasks with a flip: {', '.join(summary['tasks_flipped']) or 'none'}",
        f"- flags of flipped episodes: {summary['flags_of_flipped'] or 'none'}",
        f"- {summary['episodes_per_s']} episodes/s ({summary['seconds']} s; verdict cache "
        f"{summary['verdict_cache']['hits']} hits, {summary['verdict_cache']['misses']} misses)",
        "",
        "| episode | task | old | new | old reward | new reward | flip | flags |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        new = r.new or {}
        lines.append(f"| {r.id} | {r.task_id} | {r.old['success']} | "
                     f"{new.get('success', 'n/a')} | {r.old['reward']} | "
                     f"{new.get('reward', r.error or 'n/a')} | {r.flip or '-'} | "
                     f"{', '.join(r.flags) or '-'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- inputs


def _jsonl(path: Path) -> list[dict]:
    """Every line's record; a line that is none (not JSON, nested too deep for the parser,
    the wrong shape) becomes a stand-in that rescore reports quarantined, by line."""
    records = []
    with path.open(encoding="utf-8", errors="replace", newline="\n") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as e:
                why = "nested too deep to parse" if isinstance(e, RecursionError) else str(e)
                records.append(_quarantined_line(path.name, n, f"line {n}: not JSON ({why})"))
                continue
            problem = record_problem(record)
            if problem is not None:
                name = _record_name(record)
                records.append(_quarantined_line(path.name, n, f"line {n} ({name}): {problem}"))
                continue
            records.append(record)
    return records


def read_stored(src: Path) -> tuple[list[dict], dict]:
    """(records, where they came from) of a dataset folder (manifest.json, as ingest and
    validate write it), an evaluation's folder (trajectories.jsonl), a rollout stage's
    folder (samples.jsonl) or a JSONL file of canonical records."""
    src = Path(src)
    if src.is_dir() and (src / "manifest.json").is_file():
        from components.data.ingest import load_records

        return list(load_records(src)), {"kind": "dataset", "path": str(src)}
    for name, kind in (("trajectories.jsonl", "evaluation"), ("samples.jsonl", "rollouts")):
        if src.is_dir() and (src / name).is_file():
            return _jsonl(src / name), {"kind": kind, "path": str(src / name)}
    if src.is_file():
        return _jsonl(src), {"kind": "jsonl", "path": str(src)}
    raise RescoreError(
        f"{src}: not a dataset folder (manifest.json), an evaluation (trajectories.jsonl), "
        "rollouts (samples.jsonl) or a JSONL file"
    )


# ----------------------------------------------------------------------------- outputs


def write_outputs(out: Path, rows: list[Rescored], records: list[dict], summary: dict,
                  source: dict) -> dict[str, Path]:  # fmt: skip
    """report.json, report.md, rescored.jsonl and results.json (the replayed episodes)."""
    from components.env.batch_eval import write_results

    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("report.json", "report.md", "rescored.jsonl",
                                           "results.json")}  # fmt: skip
    report = {"source": source, "summary": summary, "episodes": [r.row() for r in rows]}
    paths["report.json"].write_text(json.dumps(report, indent=2, default=str) + "\n")
    paths["report.md"].write_text(report_markdown(summary, rows, source))
    with paths["rescored.jsonl"].open("w") as f:
        for record, r in zip(records, rows, strict=True):
            f.write(json.dumps(rescored_record(record, r)) + "\n")
    write_results(paths["results.json"], [r.result for r in rows if r.result is not None], None)
    return paths


def _rows_per_shard(manifest: dict) -> int:
    rows = [i.get("rows", 0) for n, i in manifest.get("files", {}).items()
            if n.startswith("trajectories-")]  # fmt: skip
    return max([*rows, 1])


def write_rescored_dataset(dataset: Path, rows: list[Rescored], rescore: dict,
                           lock_timeout_s: float = 600.0) -> dict:  # fmt: skip
    """Replace the dataset folder with its records under their new verdicts (`rescore`
    goes into the manifest); returns the new manifest. A record with no new verdict is
    moved to the quarantine with why: its stored reward was never confirmed, and a forged
    one must not survive as data. Written atomically under the dataset's exclusive lock,
    like validate's output."""
    import copy

    import pyarrow as pa

    from components.data.ingest import (
        read_manifest,
        read_quarantine,
        read_tables,
        step_offsets,
        write_dataset,
    )
    from components.data.schema import arrow_schemas, parse_record, record_to_rows, rows_to_record
    from components.data.writers import Lock, locked, publish_dir

    by_id = {r.id: r for r in rows}
    with locked([Lock(dataset, exclusive=True)], lock_timeout_s):
        manifest = read_manifest(dataset)
        trajs, steps = read_tables(dataset)
        offsets, step_rows = step_offsets(trajs), steps.to_pylist()
        new_trajs, new_steps, quarantine = [], [], read_quarantine(dataset)
        counts, sources = (
            dict(manifest.get("counts", {})),
            copy.deepcopy(manifest.get("sources", {})),
        )
        for i, row in enumerate(trajs.to_pylist()):
            record = rows_to_record(row, step_rows[offsets[i] : offsets[i + 1]])
            r = by_id.get(str(record["id"]))
            if r is None or r.new is None:
                why = r.error if r is not None else "not rescored"
                quarantine.append({"record": record["id"], "source_file": row["source_file"],
                                   "source_index": row["source_index"], "stage": "rescore",
                                   "format": None, "raw": record,
                                   "reasons": [f"record {record['id']} field trajectory: "
                                               f"no verdict on rescore: {why}"]})  # fmt: skip
                for c in (counts, sources.get(row["source_file"], {})):
                    if "valid" in c:
                        c["valid"] -= 1
                        c["quarantined"] = c.get("quarantined", 0) + 1
                continue
            model, problems = parse_record(rescored_record(record, r), str(record["id"]))
            if model is None:
                raise RescoreError(f"rescored record is not canonical: {problems[0]}")
            t, s = record_to_rows(model, row["source_file"], row["source_index"])
            new_trajs.append(t)
            new_steps.extend(s)
        traj_schema, step_schema = arrow_schemas()
        kept = {k: v for k, v in manifest.items()
                if k not in ("files", "content_hash", "schema_version")}  # fmt: skip
        kept.update(counts=counts, sources=sources, rescore=rescore)
        with publish_dir(dataset) as tmp:
            return write_dataset(
                tmp, pa.Table.from_pylist(new_trajs, schema=traj_schema),
                pa.Table.from_pylist(new_steps, schema=step_schema), quarantine, kept,
                _rows_per_shard(manifest),
            )  # fmt: skip


def publish_rescored_version(dataset: Path, rows: list[Rescored], summary: dict, report: Path,
                             versioning) -> dict:  # fmt: skip
    """`--write`: the dataset under its new verdicts as a new data version (DVC), whose log
    entry links it to the version it was rescored from and both verifier versions; the old
    version stays in the log for `agentrl data rollback`. Returns the new log entry."""
    from components.data import dvc_store
    from components.data import versioning as dv

    data = (Path(versioning.repo_root) / versioning.data_dir).resolve()
    if data != dataset.resolve() and data not in dataset.resolve().parents:
        raise RescoreError(f"--write: {dataset} is not inside the versioned data folder {data}")
    before = dvc_store.current_version(versioning)
    pending = dv.unsnapshotted_changes(versioning)
    if pending:
        raise RescoreError(f"--write: {data} has changes no version holds ({pending[0]}, ...): "
                           "snapshot or roll back first")  # fmt: skip
    lineage = {
        "rescored_from": before,
        "dataset": dataset.resolve().relative_to(data).as_posix() or ".",
        "verifier_versions_before": sorted(summary["judged_by_before"]),
        "verifier_version": summary["verifier_version"],
        "flips": summary["flips"],
        "report": str(report.resolve()),
    }
    write_rescored_dataset(dataset, rows, lineage)
    message = f"rescore of {before[:12]} under verifier {summary['verifier_version']}"
    return dv.snapshot(versioning, message, lineage=lineage)
