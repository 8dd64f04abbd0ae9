"""Ingest: files in any supported format -> a dataset folder of Parquet shards.

A dataset folder (written here and by validate.py) holds
    trajectories-00000.parquet, steps-00000.parquet, ...   the records (schema.py columns)
    quarantine.jsonl                                        rejected records, with reasons
    manifest.json                                           counts, file hashes, sources
Nothing is dropped silently: every JSONL line that is not blank, every element of a JSON
array and every whole JSON file is one *ingested* record, and ends up either valid or in
quarantine; the manifest's counts reconcile (ingested = valid + quarantined) per source.
No record aborts the run (reading.py says what is checked on the way in), and a file that
cannot be read is listed in the manifest's `skipped_files` with the reason. Outputs hold no
timestamps, so the same inputs give byte-identical files (and one DVC version).

Writing (writers.py): ingest holds a lock on its output folder for the whole run, builds
the dataset in a hidden sibling folder and renames it into place, so readers and a second
ingest see the old dataset or the new one, never a mix. It refuses to replace an existing
dataset unless asked (`overwrite`), refuses a folder holding anything else, and refuses to
publish a dataset of zero records.

A record's reward, terms and success are only claims unless this installation's verifier
signed them (adapters.claim_unless_signed): whatever the format, a foreign verdict is kept
as claimed_reward / claimed_reward_terms / claimed_success, never as the fields a trainer
reads, and the schema checks it first as the input gave it.

Quarantine lines: {"record", "source_file", "source_index", ["source_item"], "stage",
"format", "reasons", "raw" | "raw_text"}; each reason reads "record <id> field <path>:
<problem>". `raw` is the record as read; `raw_text` the line as escaped text when it could
not be decoded/parsed. `source_item` is the position in a JSON array found on one line.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.data.adapters import (
    AdapterError,
    claim_unless_signed,
    detect_format,
    to_canonical,
)
from components.data.config import DEFAULT_SECRET_PATTERNS, IngestConfig
from components.data.reading import (
    InputFile,
    RawRecord,
    decode,
    find_input_files,
    first_bad_utf8,
    json_lines,
    open_input,
    read_records,
)
from components.data.redaction import redact_text, secret_regex
from components.data.schema import SCHEMA_VERSION, parse_record, record_to_rows
from components.data.writers import Lock, is_bookkeeping, locked, publish_dir, recover_dir

MANIFEST = "manifest.json"
QUARANTINE = "quarantine.jsonl"
DATASET_FILE = re.compile(r"(?:trajectories|steps)-\d{5}\.parquet|quarantine\.jsonl|manifest\.json")
# Line breaks that str.splitlines (and many JSON-lines readers) split on, inside strings.
_CHUNK_LINES = 500  # JSON lines per pool job: large enough to amortise the pickling
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class DatasetError(RuntimeError):
    """A dataset cannot be written or read as asked; the message says why (one line)."""


@dataclass
class IngestResult:
    out_dir: Path
    counts: dict[str, int]
    per_source: dict[str, dict]
    quarantine: list[dict] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def _record_name(obj: Any, fallback: str) -> str:
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and rid else fallback


def _entry(raw: RawRecord) -> dict[str, Any]:
    """The start of a quarantine line for `raw` (see the module doc)."""
    entry: dict[str, Any] = {
        "record": raw.name,
        "source_file": raw.source_file,
        "source_index": raw.source_index,
        "stage": "ingest",
        "format": None,
    }
    if raw.item is not None:
        entry["source_item"] = raw.item
    return entry


def adapt_record(raw: RawRecord, fmt: str, default_source: str = ""):
    """RawRecord -> (trajectory row, step rows, None) or (None, None, quarantine entry)."""
    name = raw.name
    entry = _entry(raw)
    if raw.error is not None:
        return (
            None,
            None,
            {**entry, "reasons": [f"record {name} {raw.error}"], "raw_text": raw.raw_text},
        )
    entry["raw"] = raw.obj
    use = detect_format(raw.obj, raw.source_file) if fmt == "auto" else fmt
    entry["format"] = use
    if use is None:
        why = "cannot detect the format (no 'trajectory' or 'messages' key); use --format"
        return None, None, {**entry, "reasons": [f"record {name} field <record>: {why}"]}
    name = entry["record"] = _record_name(raw.obj, name)
    try:
        record = to_canonical(
            raw.obj, use, file_name=raw.source_file, default_source=default_source
        )
    except AdapterError as e:
        return (
            None,
            None,
            {**entry, "reasons": [f"record {name} field {e.field}: {e.problem} ({use} format)"]},
        )
    name = entry["record"] = _record_name(record, name)
    bad = first_bad_utf8(record) if raw.maybe_surrogate else None
    if bad is not None:
        # Lone surrogates (\\udXXX escapes) decode in JSON but are not valid UTF-8 text.
        reason = f"record {name} field {bad}: invalid UTF-8 (unpaired surrogate)"
        return None, None, {**entry, "reasons": [reason]}
    model, reasons = parse_record(record, name)
    if reasons:
        return None, None, {**entry, "reasons": reasons}
    # Checked as given (a bad reward is named as the input's field), then kept only as a
    # claim unless this installation's verifier signed it: a foreign verdict never trains.
    claimed = claim_unless_signed({**record, "metadata": _copied(record.get("metadata"))})
    if claimed != record:
        model, reasons = parse_record(claimed, name)
        if reasons:
            return None, None, {**entry, "reasons": reasons}
    traj_row, step_rows = record_to_rows(model, raw.source_file, raw.source_index)
    return traj_row, step_rows, None


def _copied(metadata: Any) -> Any:
    return dict(metadata) if isinstance(metadata, dict) else metadata


def adapt_or_quarantine(raw: RawRecord, fmt: str, default_source: str = ""):
    """adapt_record, with the last line of defence: whatever goes wrong with one record
    quarantines that record (with the error) instead of aborting the run."""
    try:
        return adapt_record(raw, fmt, default_source)
    except Exception as e:  # noqa: BLE001 - one record must never abort an ingest
        entry = _entry(raw)
        problem = f"could not be processed ({type(e).__name__}: {str(e)[:200]})"
        entry["reasons"] = [f"record {raw.name} field <record>: {problem}"]
        try:
            json.dumps(raw.obj)  # what the quarantine writer will do with it
            entry["raw"] = raw.obj
        except (ValueError, TypeError, RecursionError):
            entry["raw_text"] = raw.raw_text
        return None, None, entry


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse to write over anything but a dataset we may replace: a folder holding other
    files (they would be lost), or a dataset when `overwrite` is False."""
    if not os.path.lexists(out_dir):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise DatasetError(f"output {out_dir} exists and is not a folder")
    names = sorted(p.name for p in out_dir.iterdir() if not is_bookkeeping(p.name))
    foreign = [n for n in names if not DATASET_FILE.fullmatch(n)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" (+{len(foreign) - 5})" if len(foreign) > 5 else "")
        raise DatasetError(
            f"output {out_dir} holds files that are not part of a dataset ({shown}); "
            "they would be lost: choose another output folder"
        )
    if names and not overwrite:
        raise DatasetError(
            f"output {out_dir} already holds a dataset; pass --overwrite to replace it"
        )


def _quarantine_line(entry: dict, rx) -> str:
    line = json.dumps(entry, ensure_ascii=False, default=str)
    for char, escape in _LINE_BREAKS.items():
        if char in line:  # only inside strings: the escape is the same JSON value
            line = line.replace(char, escape)
    return redact_text(line, rx) if rx.pattern else line


def write_dataset(
    out_dir: Path,
    traj_table,
    step_table,
    quarantine: list[dict],
    manifest: dict,
    rows_per_shard: int,
    secret_patterns: dict[str, str] | None = None,
) -> dict:
    """Write shards, quarantine and manifest into `out_dir` (a fresh folder: publish_dir's);
    returns the manifest as written.

    Steps of trajectory shard k go to steps shard k, so one shard pair is self-contained.
    Quarantined raw text has credentials redacted: it is versioned and pushed like the data.
    """
    import pyarrow.parquet as pq

    rx = secret_regex(DEFAULT_SECRET_PATTERNS if secret_patterns is None else secret_patterns)

    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict] = {}
    n = traj_table.num_rows
    offsets = step_offsets(traj_table)
    if offsets[-1] != step_table.num_rows:
        raise AssertionError(
            f"{offsets[-1]} steps expected from num_steps, table has {step_table.num_rows}"
        )
    for k, start in enumerate(range(0, max(n, 1), rows_per_shard)):
        part = traj_table.slice(start, rows_per_shard)
        end = min(start + rows_per_shard, n)
        steps = step_table.slice(offsets[start], offsets[end] - offsets[start])
        for name, table in (
            (f"trajectories-{k:05d}.parquet", part),
            (f"steps-{k:05d}.parquet", steps),
        ):
            pq.write_table(table, out_dir / name, compression="zstd")
            files[name] = {"md5": file_md5(out_dir / name), "rows": table.num_rows}
    # backslashreplace: a lone surrogate in a quarantined record is written as its JSON
    # escape (\\udXXX), so the file stays valid UTF-8 and reads back to the same record.
    with (out_dir / QUARANTINE).open("w", encoding="utf-8", errors="backslashreplace") as f:
        for entry in quarantine:
            f.write(_quarantine_line(entry, rx) + "\n")
    files[QUARANTINE] = {"md5": file_md5(out_dir / QUARANTINE), "rows": len(quarantine)}
    hashes = traj_table.column("content_hash").to_pylist() if n else []
    manifest = {
        **manifest,
        "schema_version": SCHEMA_VERSION,
        "content_hash": hashlib.sha256("".join(hashes).encode()).hexdigest(),
        "files": files,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def step_offsets(traj_table) -> list[int]:
    """Row offset of each trajectory's first step (plus the total at the end).

    Steps are stored in trajectory order, num_steps rows each; joining by position keeps
    duplicate ids (which validation rejects) from mixing their steps.
    """
    offsets = [0]
    for n in traj_table.column("num_steps").to_pylist():
        offsets.append(offsets[-1] + n)
    return offsets


def reconcile(per_source: dict[str, dict]) -> dict[str, int]:
    """Totals over sources; raises if ingested != valid + quarantined anywhere."""
    totals = Counter()
    for src, c in per_source.items():
        if c["ingested"] != c["valid"] + c["quarantined"]:
            raise AssertionError(
                f"{src}: ingested {c['ingested']} != valid {c['valid']} + quarantined {c['quarantined']}"
            )
        totals.update({k: c[k] for k in ("ingested", "valid", "quarantined")})
    return {k: totals[k] for k in ("ingested", "valid", "quarantined")}


def _adapted(raw: RawRecord, fmt: str, default_source: str, label: str):
    """(trajectory row, step rows, quarantine entry, format counted) of one raw record."""
    traj, steps, bad = adapt_or_quarantine(raw, fmt, default_source)
    if bad is not None:
        return traj, steps, bad, bad["format"]
    return traj, steps, None, detect_format(raw.obj, label) if fmt == "auto" else fmt


def _adapt_lines(job: tuple) -> list[tuple]:
    """A pool worker's share: decode and adapt a chunk of JSON lines (in order)."""
    label, fmt, default_source, max_bytes, max_depth, lines = job
    return [
        _adapted(raw, fmt, default_source, label)
        for lineno, line in lines
        for raw in decode(line, label, lineno, max_bytes, max_depth)
    ]


def _worker_init() -> None:
    # A killed ingest must not leave workers behind.
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _adapted_records(handle, f: InputFile, cfg: IngestConfig) -> Iterator[tuple]:
    """Every record of one open file, adapted. A large JSON-lines file is decoded and
    checked by cfg.workers processes in chunks, in order: the same rows, byte for byte, as
    one process gives (tested), in about half the time on two cores."""
    big = os.fstat(handle.fileno()).st_size >= cfg.parallel_min_bytes
    # Workers are forked (a forkserver's re-imports cost more than they save here), which
    # is only safe while this process runs one thread: otherwise all is read here.
    parallel = big and cfg.workers > 1 and threading.active_count() == 1
    lines = json_lines(handle, f.label, cfg.max_record_bytes) if parallel else None
    if lines is None:
        for raw in read_records(handle, f.label, cfg.max_record_bytes, cfg.max_depth):
            yield _adapted(raw, cfg.format, cfg.default_source, f.label)
        return
    read: list[tuple[int, bytes]] = []
    error = None
    try:
        read.extend(lines)
    except OSError as e:  # adapt what was read, then report where the file broke
        error = e
    step = max(1, min(_CHUNK_LINES, -(-len(read) // (4 * cfg.workers))))
    jobs = (
        (f.label, cfg.format, cfg.default_source, cfg.max_record_bytes, cfg.max_depth,
         read[i : i + step])
        for i in range(0, len(read), step)
    )  # fmt: skip
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(cfg.workers, os.cpu_count() or 1), initializer=_worker_init) as pool:
        for chunk in pool.imap(_adapt_lines, jobs):
            yield from chunk
    if error is not None:
        raise error


def _read_file(f: InputFile, cfg: IngestConfig, out: dict) -> None:
    """Every record of one file into out["traj"/"steps"/"quarantine"] and its counts."""
    stats = {"ingested": 0, "valid": 0, "quarantined": 0, "formats": {}}

    def take(traj, steps, bad, fmt) -> None:
        stats["ingested"] += 1
        if bad is None:
            out["traj"].append(traj)
            out["steps"].extend(steps)
            stats["valid"] += 1
        else:
            out["quarantine"].append(bad)
            stats["quarantined"] += 1
        stats["formats"][fmt or "unknown"] = stats["formats"].get(fmt or "unknown", 0) + 1

    with open_input(f) as handle:  # OSError here: the caller lists the file as skipped
        out["sources"][f.label] = stats
        try:
            for adapted in _adapted_records(handle, f, cfg):
                take(*adapted)
        except OSError as e:  # the file broke mid-read: say where, keep what was read
            problem = f"field <file>: read failed after {stats['ingested']} records ({e})"
            raw = RawRecord(f.label, 0, error=problem)
            take(*_adapted(raw, cfg.format, cfg.default_source, f.label))


def _read_sources(sources: list[str], cfg: IngestConfig) -> dict:
    """Read every input: {"traj", "steps", "quarantine", "sources", "skipped"}."""
    files, skipped = find_input_files(sources)
    out: dict = {"traj": [], "steps": [], "quarantine": [], "sources": {}, "skipped": skipped}
    for f in files:
        try:
            _read_file(f, cfg, out)
        except OSError as e:  # could not be opened: not a source, a skipped file
            out["skipped"].append(f"{f.label}: cannot be read ({e.strerror or e})")
    return out


def ingest(sources: list[str], cfg: IngestConfig, overwrite: bool = False) -> IngestResult:
    """Read every input, reshape, check the schema, and publish the dataset folder.

    Raises DatasetError (nothing written) when the output holds a dataset and `overwrite`
    is False, holds other files, or when the inputs hold no record at all; LockTimeout when
    another writer holds the output for longer than cfg.lock_timeout_s.
    """
    import pyarrow as pa

    from components.data.schema import arrow_schemas

    out_dir = Path(cfg.out_dir)
    with locked([Lock(out_dir)], cfg.lock_timeout_s):
        recover_dir(out_dir)
        check_target(out_dir, overwrite)
        read = _read_sources(sources, cfg)
        counts = reconcile(read["sources"])
        if counts["ingested"] == 0:
            skipped = read["skipped"]
            detail = f"{len(read['sources'])} files read, all empty" if read["sources"] else ""
            detail += "; " if detail and skipped else ""
            detail += f"{len(skipped)} skipped, first: {skipped[0]}" if skipped else ""
            raise DatasetError(
                f"no records in the input ({detail or 'no input files'}): "
                f"nothing written to {out_dir}"
            )
        traj_schema, step_schema = arrow_schemas()
        traj_table = pa.Table.from_pylist(read["traj"], schema=traj_schema)
        step_table = pa.Table.from_pylist(read["steps"], schema=step_schema)
        with publish_dir(out_dir) as tmp:
            manifest = write_dataset(
                tmp,
                traj_table,
                step_table,
                read["quarantine"],
                {
                    "stage": "ingest",
                    "counts": counts,
                    "sources": read["sources"],
                    "skipped_files": read["skipped"],
                },  # fmt: skip
                cfg.rows_per_shard,
            )
    return IngestResult(out_dir, counts, read["sources"], read["quarantine"], manifest)


def read_manifest(dataset_dir: str | Path) -> dict:
    path = Path(dataset_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{dataset_dir}: no {MANIFEST} (not a dataset folder; run ingest)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path} is damaged ({e})") from e


def verify_files(dataset_dir: str | Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its recorded md5 (DatasetError if not):
    a dataset is read whole and as published, or not at all."""
    d = Path(dataset_dir)
    for name, info in sorted(manifest.get("files", {}).items()):
        if not (d / name).is_file():
            raise DatasetError(f"dataset {d} is damaged: {name} is missing")
        if file_md5(d / name) != info.get("md5"):
            raise DatasetError(f"dataset {d} is damaged: {name} does not match its manifest md5")


def read_tables(dataset_dir: str | Path):
    """(trajectories, steps) pyarrow tables of a dataset folder, in shard order, after
    checking every file against the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.data.schema import arrow_schemas

    d = Path(dataset_dir)
    manifest = read_manifest(d)
    verify_files(d, manifest)
    names = sorted(manifest["files"])
    traj_schema, step_schema = arrow_schemas()
    trajs = [
        pq.read_table(d / n, schema=traj_schema) for n in names if n.startswith("trajectories-")
    ]
    steps = [pq.read_table(d / n, schema=step_schema) for n in names if n.startswith("steps-")]
    return (
        pa.concat_tables(trajs) if trajs else traj_schema.empty_table(),
        pa.concat_tables(steps) if steps else step_schema.empty_table(),
    )


def read_quarantine(dataset_dir: str | Path) -> list[dict]:
    """Quarantine entries; lines split on "\\n" only (a record's text may hold U+2028 or
    U+0085, which str.splitlines would split on), a damaged line kept as its text."""
    path = Path(dataset_dir) / QUARANTINE
    if not path.is_file():
        return []
    entries = []
    with path.open(encoding="utf-8", errors="backslashreplace", newline="\n") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except ValueError as e:
                reason = f"record {path}:{n} field <json>: damaged quarantine line ({e})"
                entries.append({"record": f"{path}:{n}", "source_file": str(path),
                                "source_index": n, "stage": "quarantine", "format": None,
                                "reasons": [reason], "raw_text": line[:4096]})  # fmt: skip
    return entries


def load_records(dataset_dir: str | Path, lock_timeout_s: float = 600.0) -> Iterator[dict]:
    """Canonical records of a dataset folder (what training stages consume), read under a
    shared lock so that no writer replaces the folder while it is read."""
    from components.data.schema import rows_to_record

    try:
        with locked([Lock(Path(dataset_dir), exclusive=False)], lock_timeout_s):
            trajs, steps = read_tables(dataset_dir)
    except PermissionError:  # a read-only location: no lock file possible, read as is
        trajs, steps = read_tables(dataset_dir)
    offsets = step_offsets(trajs)
    step_rows = steps.to_pylist()
    for i, row in enumerate(trajs.to_pylist()):
        yield rows_to_record(row, step_rows[offsets[i] : offsets[i + 1]])
