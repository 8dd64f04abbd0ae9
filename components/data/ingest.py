"""Ingest: files in any supported format -> a dataset folder of Parquet shards.

A dataset folder (written here and by validate.py) holds
    trajectories-00000.parquet, steps-00000.parquet, ...   the records (schema.py columns)
    quarantine.jsonl                                        rejected records, with reasons
    manifest.json                                           counts, file hashes, sources
Nothing is dropped silently: every JSONL line that is not blank, every element of a JSON
array and every whole JSON file is one *ingested* record, and ends up either valid or in
quarantine; the manifest's counts reconcile (ingested = valid + quarantined) per source.
Outputs hold no timestamps, so the same inputs give byte-identical files (and one DVC
version).

Quarantine lines: {"record", "source_file", "source_index", "stage", "format", "reasons",
"raw" | "raw_text"}; each reason reads "record <id> field <path>: <problem>". `raw` is the
record as read; `raw_text` the line as escaped text when it could not be decoded/parsed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.data.adapters import AdapterError, detect_format, to_canonical
from components.data.config import DEFAULT_SECRET_PATTERNS, IngestConfig
from components.data.redaction import redact_text, secret_regex
from components.data.schema import SCHEMA_VERSION, parse_record, record_to_rows

_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")
INPUT_SUFFIXES = (".jsonl", ".json", ".traj")
MANIFEST = "manifest.json"
QUARANTINE = "quarantine.jsonl"


@dataclass
class RawRecord:
    """One input record as read: the parsed object, or why it could not be parsed."""

    source_file: str
    source_index: int  # 1-based line for JSONL; position for a JSON array; 0 for a file
    obj: Any = None
    error: str | None = None  # "field <path>: <problem>" when obj could not be read
    raw_text: str | None = None
    # The JSON text has a \\uD8xx-\\uDFxx escape: a lone surrogate may hide in a string.
    maybe_surrogate: bool = False


@dataclass
class IngestResult:
    out_dir: Path
    counts: dict[str, int]
    per_source: dict[str, dict]
    quarantine: list[dict] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def find_input_files(sources: list[str]) -> tuple[list[tuple[str, Path]], list[str]]:
    """Expand files and folders into (label, path) pairs; list what was skipped and why."""
    files: list[tuple[str, Path]] = []
    skipped: list[str] = []
    for src in sources:
        p = Path(src)
        if p.is_file():
            files.append((str(p), p))  # named explicitly: read whatever the extension
        elif p.is_dir():
            for f in sorted(q for q in p.rglob("*") if q.is_file()):
                if f.name.endswith(INPUT_SUFFIXES):
                    files.append((str(f), f))
                elif not f.name.startswith("."):
                    skipped.append(f"{f}: not an input file (expected {', '.join(INPUT_SUFFIXES)})")
        else:
            raise FileNotFoundError(f"input {src!r} does not exist")
    return files, skipped


def _escaped(data: bytes, limit: int = 4096) -> str:
    text = data[:limit].decode("utf-8", "backslashreplace")
    return text + (f"... [{len(data) - limit} more bytes]" if len(data) > limit else "")


def _decode(data: bytes, label: str, index: int, max_bytes: int) -> RawRecord:
    if len(data) > max_bytes:
        return RawRecord(
            label,
            index,
            error=f"field <bytes>: record is {len(data)} bytes (max {max_bytes})",
            raw_text=_escaped(data),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return RawRecord(
            label,
            index,
            error=f"field <bytes>: invalid UTF-8 at byte {e.start} ({data[e.start : e.start + 4]!r})",
            raw_text=_escaped(data),
        )
    try:
        return RawRecord(
            label, index, obj=json.loads(text), maybe_surrogate=_SURROGATE.search(data) is not None
        )
    except json.JSONDecodeError as e:
        what = "truncated JSON" if e.pos >= len(text.rstrip()) else "invalid JSON"
        return RawRecord(
            label,
            index,
            error=f"field <json>: {what}: {e.msg} at column {e.colno}",
            raw_text=_escaped(data),
        )


def read_records(label: str, path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """Yield every record of one input file, parsed or with the reason it could not be."""
    if path.name.endswith(".jsonl"):
        with path.open("rb") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    yield _decode(line.rstrip(b"\r\n"), label, lineno, max_bytes)
        return
    rec = _decode(path.read_bytes(), label, 0, max_bytes)
    if rec.error is None and isinstance(rec.obj, list):
        for i, obj in enumerate(rec.obj):
            yield RawRecord(label, i, obj=obj, maybe_surrogate=rec.maybe_surrogate)
    else:
        yield rec


def _bad_utf8_path(obj: Any, path: str = "") -> str | None:
    """Path of the first string that cannot be UTF-8 encoded (JSON escapes like \\ud800)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return path or "<record>"
        return None
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for k, v in items:
        sub = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else str(k))
        if isinstance(k, str) and _bad_utf8_path(k) is not None:
            return sub
        found = _bad_utf8_path(v, sub)
        if found:
            return found
    return None


def _record_name(obj: Any, fallback: str) -> str:
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and rid else fallback


def adapt_record(raw: RawRecord, fmt: str, default_source: str = ""):
    """RawRecord -> (trajectory row, step rows, None) or (None, None, quarantine entry)."""
    name = f"{raw.source_file}:{raw.source_index}"
    entry = {
        "record": name,
        "source_file": raw.source_file,
        "source_index": raw.source_index,
        "stage": "ingest",
        "format": None,
    }
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
    name = _record_name(raw.obj, name)
    entry["record"] = name
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
    name = _record_name(record, name)
    entry["record"] = name
    bad = _bad_utf8_path(record) if raw.maybe_surrogate else None
    if bad is not None:
        # Lone surrogates (\udXXX escapes) decode in JSON but are not valid UTF-8 text.
        return (
            None,
            None,
            {
                **entry,
                "reasons": [f"record {name} field {bad}: invalid UTF-8 (unpaired surrogate)"],
            },
        )
    model, reasons = parse_record(record, name)
    if reasons:
        return None, None, {**entry, "reasons": reasons}
    traj_row, step_rows = record_to_rows(model, raw.source_file, raw.source_index)
    return traj_row, step_rows, None


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def clear_dataset(out_dir: Path) -> None:
    """Remove a previous dataset's files (only ours) so no stale shard survives."""
    for pattern in ("trajectories-*.parquet", "steps-*.parquet", QUARANTINE, MANIFEST):
        for p in out_dir.glob(pattern):
            p.unlink()


def write_dataset(
    out_dir: Path,
    traj_table,
    step_table,
    quarantine: list[dict],
    manifest: dict,
    rows_per_shard: int,
    secret_patterns: dict[str, str] | None = None,
) -> dict:
    """Write shards, quarantine and manifest; returns the manifest as written.

    Steps of trajectory shard k go to steps shard k, so one shard pair is self-contained.
    Quarantined raw text has credentials redacted: it is versioned and pushed like the data.
    """
    import pyarrow.parquet as pq

    rx = secret_regex(DEFAULT_SECRET_PATTERNS if secret_patterns is None else secret_patterns)

    out_dir.mkdir(parents=True, exist_ok=True)
    clear_dataset(out_dir)
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
            line = json.dumps(entry, ensure_ascii=False, default=str)
            f.write((redact_text(line, rx) if rx.pattern else line) + "\n")
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


def ingest(sources: list[str], cfg: IngestConfig) -> IngestResult:
    """Read every input, reshape, check the schema, and write the dataset folder."""
    import pyarrow as pa

    from components.data.schema import arrow_schemas

    files, skipped = find_input_files(sources)
    traj_rows: list[dict] = []
    step_rows: list[dict] = []
    quarantine: list[dict] = []
    per_source: dict[str, dict] = defaultdict(
        lambda: {"ingested": 0, "valid": 0, "quarantined": 0, "formats": {}}
    )
    for label, path in files:
        stats = per_source[label]
        for raw in read_records(label, path, cfg.max_record_bytes):
            stats["ingested"] += 1
            traj, steps, bad = adapt_record(raw, cfg.format, cfg.default_source)
            fmt = bad["format"] if bad else None
            if bad is None:
                traj_rows.append(traj)
                step_rows.extend(steps)
                stats["valid"] += 1
                fmt = detect_format(raw.obj, label) if cfg.format == "auto" else cfg.format
            else:
                quarantine.append(bad)
                stats["quarantined"] += 1
            key = fmt or "unknown"
            stats["formats"][key] = stats["formats"].get(key, 0) + 1
    per_source = dict(per_source)
    counts = reconcile(per_source)
    traj_schema, step_schema = arrow_schemas()
    traj_table = pa.Table.from_pylist(traj_rows, schema=traj_schema)
    step_table = pa.Table.from_pylist(step_rows, schema=step_schema)
    out_dir = Path(cfg.out_dir)
    manifest = write_dataset(
        out_dir,
        traj_table,
        step_table,
        quarantine,
        {"stage": "ingest", "counts": counts, "sources": per_source, "skipped_files": skipped},
        cfg.rows_per_shard,
    )
    return IngestResult(out_dir, counts, per_source, quarantine, manifest)


def read_manifest(dataset_dir: str | Path) -> dict:
    path = Path(dataset_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{dataset_dir}: no {MANIFEST} (not a dataset folder; run ingest)")
    return json.loads(path.read_text())


def read_tables(dataset_dir: str | Path):
    """(trajectories, steps) pyarrow tables of a dataset folder, in shard order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.data.schema import arrow_schemas

    d = Path(dataset_dir)
    names = sorted(read_manifest(d)["files"])
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
    path = Path(dataset_dir) / QUARANTINE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def load_records(dataset_dir: str | Path) -> Iterator[dict]:
    """Canonical records of a dataset folder (what training stages consume)."""
    from components.data.schema import rows_to_record

    trajs, steps = read_tables(dataset_dir)
    offsets = step_offsets(trajs)
    step_rows = steps.to_pylist()
    for i, row in enumerate(trajs.to_pylist()):
        yield rows_to_record(row, step_rows[offsets[i] : offsets[i + 1]])
