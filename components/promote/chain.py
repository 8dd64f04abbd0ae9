"""The audit log's file format: one JSON record a line, each model's records a hash chain.

Every record of a model carries `seq` (1, 2, ... per model), `prev_hash` (the `hash` of the
model's previous record; for seq 1, the hash of the model's unchained records written
before the chain existed, or 64 zeros) and `hash` (SHA-256 of its canonical JSON without
`hash`). So the file alone shows:
- an edited record: its content no longer matches its hash (or, re-hashed, the next
  record's link no longer matches it);
- a deleted record: a gap in seq;
- an inserted or copied record: a repeated seq, a wrong link, or a record without a link
  after the chain began.
The end of the chain cannot be checked from the file (delete the last line, or append a
well-formed one): the registry holds the head and `head_problems` compares the two (the
tags are written by audit.py). A line that is not a JSON object (truncated, binary) is
named and skipped: reading never fails on a line. No MLflow here, so `agentrl promote
history` reads and checks the file without importing it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

GENESIS = "0" * 64
LINK_FIELDS = ("seq", "prev_hash", "hash")


def canonical(record: dict) -> str:
    """The one JSON spelling of a record: sorted keys, ASCII only (so U+2028 and friends
    never split a line)."""
    return json.dumps(record, sort_keys=True, default=str, ensure_ascii=True)


def record_hash(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def seal(record: dict, seq: int, prev_hash: str) -> dict:
    """The record as a reader will parse it, linked after `prev_hash` and hashed."""
    sealed = json.loads(canonical({**record, "seq": seq, "prev_hash": prev_hash}))
    sealed["hash"] = record_hash(sealed)
    return sealed


def link(record: dict) -> str:
    """`seq:hash`, the form the registry's chain-head tags hold."""
    return f"{record.get('seq')}:{record.get('hash')}"


def parse_link(value: str | None) -> tuple[int, str] | None:
    seq, _, digest = (value or "").partition(":")
    return (int(seq), digest) if seq.isdigit() and digest else None


def describe(record: dict) -> str:
    return (
        f"seq {record.get('seq', '-')} ({record.get('action', '?')} of v{record.get('version', '?')}"
        f" by {record.get('actor', '?')})"
    )


def append_line(path: Path, record: dict) -> None:
    """Append one record and fsync. Callers hold the store's lock; a damaged last line
    (no newline) stays a line of its own instead of swallowing this record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (canonical(record) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[tuple[int, dict | None]]:
    """(line number, record) of every non-blank line; None for a line that is not a JSON
    object. Lines end at b"\\n" only."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[tuple[int, dict | None]] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            record = None
        out.append((number, record if isinstance(record, dict) else None))
    return out


@dataclass(frozen=True)
class Entry:
    line: int
    record: dict

    @property
    def seq(self):
        return self.record.get("seq")


@dataclass
class LogScan:
    """One model's records in file order, and what does not verify in the file alone."""

    entries: list[Entry] = field(default_factory=list)  # every record of the model
    chained: list[Entry] = field(default_factory=list)  # those carrying a link
    problems: list[str] = field(default_factory=list)  # each names a line
    damaged: list[int] = field(default_factory=list)  # lines that are no record (any model)

    @property
    def last(self) -> Entry | None:
        return self.chained[-1] if self.chained else None

    def next_link(self) -> tuple[int, str]:
        """(seq, prev_hash) of the model's next record."""
        if self.chained:
            return self.chained[-1].seq + 1, self.chained[-1].record.get("hash", "")
        return 1, _prefix_hash([e.record for e in self.entries])

    def damaged_after(self, line: int) -> list[int]:
        return [n for n in self.damaged if n > line]


def _prefix_hash(records: list[dict]) -> str:
    """What seq 1 links to: the records written before the chain existed (none: zeros)."""
    if not records:
        return GENESIS
    digest = hashlib.sha256()
    for record in records:
        digest.update((canonical(record) + "\n").encode())
    return digest.hexdigest()


def _check_link(scan: LogScan, entry: Entry) -> bool:
    """Record what is wrong with `entry`'s link; False when it cannot be part of the chain
    (no usable seq)."""
    record, line = entry.record, entry.line
    seq, prev = scan.next_link()
    if type(entry.seq) is not int or record.get("hash") != record_hash(record):
        scan.problems.append(
            f"line {line}: {describe(record)} was edited: its content no longer matches its hash"
        )
        return type(entry.seq) is int
    if entry.seq > seq:
        gap = [n for n in scan.damaged if n < line and (not scan.last or n > scan.last.line)]
        missing = f"seq {seq}" if entry.seq == seq + 1 else f"seq {seq}..{entry.seq - 1}"
        scan.problems.append(
            f"line {line}: the record(s) before it ({missing}) are missing: deleted"
            + (f" (damaged line(s) {gap})" if gap else "")
        )
    elif entry.seq < seq:
        scan.problems.append(f"line {line}: {describe(record)} repeats a seq: copied or inserted")
    elif record.get("prev_hash") != prev:
        scan.problems.append(
            f"line {line}: {describe(record)} does not link to line {scan.last.line}, "
            "which was edited or replaced after it was written"
            if scan.last
            else f"line {line}: the first chained record does not cover the records before "
            "it: one of them was edited, deleted or inserted"
        )
    return True


def scan(path: Path, model: str) -> LogScan:
    """Read the log and verify `model`'s chain in the file (not its end: head_problems)."""
    out = LogScan()
    for number, record in read_lines(path):
        if record is None:
            out.damaged.append(number)
            continue
        if record.get("model") != model:
            continue
        entry = Entry(number, record)
        if any(k in record for k in LINK_FIELDS):
            if _check_link(out, entry):  # against the records before it
                out.chained.append(entry)
        elif out.chained:
            out.problems.append(
                f"line {number}: {describe(record)} has no chain link but follows chained "
                "records: inserted by hand"
            )
        out.entries.append(entry)
    return out


def head_problems(
    log: LogScan, head: tuple[int, str] | None, pending: tuple[int, str] | None
) -> tuple[list[str], Entry | None]:
    """Compare the file's chain with the registry's head; returns (problems, the record of
    a decision that was written but not completed, if that is all the difference)."""
    last = log.last
    if head is None:
        if last is None:
            return [], None
        if len(log.chained) == 1 and pending == (last.seq, last.record.get("hash")):
            return [], last
        return [
            f"the registry holds no chain head for this model, but the audit log has "
            f"{len(log.chained)} chained record(s) up to line {last.line}: written outside "
            "the workflow, or the registry lost its tags"
        ], None
    seq, digest = head
    index = next((i for i, e in enumerate(log.chained) if e.seq == seq), None)
    if index is None:
        end = f"seq {last.seq} (line {last.line})" if last else "no chained record"
        damaged = log.damaged_after(last.line if last else 0)
        return [
            f"the audit log ends at {end} but the registry's chain head is seq {seq}: its "
            "last record(s) were deleted or truncated"
            + (f" (damaged line(s) {damaged})" if damaged else "")
        ], None
    problems = []
    at = log.chained[index]
    if at.record.get("hash") != digest:
        problems.append(
            f"line {at.line}: {describe(at.record)} is not the record the registry holds as "
            "the chain head: replaced"
        )
    after = log.chained[index + 1 :]
    in_flight = (after[0].seq, after[0].record.get("hash")) if len(after) == 1 else None
    if in_flight is not None and in_flight == pending and in_flight[0] == seq + 1:
        return problems, after[0]
    problems += [
        f"line {e.line}: {describe(e.record)} is not in the registry's chain: forged or "
        "appended by hand"
        for e in after
    ]
    return problems, None
