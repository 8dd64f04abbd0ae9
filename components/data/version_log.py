"""The version log (data-versions.jsonl: one line per snapshot, with every file's md5 and
the exact data.dvc text) and the journal that makes a killed snapshot or rollback finish or
undo on the next one; `repair` rebuilds a damaged data.dvc from the log."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path

from components.data.config import VersioningConfig
from components.data.dvc_store import VersioningError, data_paths, hash_tree, read_dvc_file
from components.data.writers import (
    MARK,
    Lock,
    fsync_dir,
    is_bookkeeping,
    locked,
    recover_dir,
    recover_file,
    sibling,
    write_atomic,
)


def dataset_summaries(data: Path) -> tuple[dict[str, dict], list[str]]:
    summaries: dict[str, dict] = {}
    sources: set[str] = set()
    for manifest in sorted(data.rglob("manifest.json")):
        rel = manifest.parent.relative_to(data).as_posix()
        if any(is_bookkeeping(part) for part in Path(rel).parts):
            continue
        m = json.loads(manifest.read_text())
        summaries[rel] = {
            "stage": m.get("stage"),
            "counts": m.get("counts", {}),
            "content_hash": m.get("content_hash"),
            # A validated dataset names the ingested one it was made from.
            "input_content_hash": (m.get("validation") or {}).get("input_content_hash"),
        }
        sources.update(m.get("sources", {}))
    return summaries, sorted(sources)


def read_log(cfg: VersioningConfig) -> list[dict]:
    """The version log's entries; a damaged line (a hand edit, a write cut short) is
    skipped with a warning rather than failing every versioning command."""
    path = data_paths(cfg)[3]
    if not path.is_file():
        return []
    entries = []
    with path.open(encoding="utf-8", errors="replace", newline="\n") as f:
        for n, line in enumerate(f, start=1):
            try:
                entry = json.loads(line) if line.strip() else None
            except ValueError:
                entry = {}
            if entry is None:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("version"), str):
                entries.append(entry)
            else:
                logging.getLogger(__name__).warning("%s line %d is damaged: skipped", path, n)
    return entries


def _journal(cfg: VersioningConfig) -> Path:
    return sibling(data_paths(cfg)[1], "journal")


@contextlib.contextmanager
def writing(cfg: VersioningConfig):
    """Hold data/ exclusively (and every dataset inside it that has a lock file: a writer
    that started before data/'s lock file existed), after finishing an interrupted write.
    First the data repository's lock (components/workdir_lock.py): a run that holds it
    (a pipeline, a reproduction) refuses this at once instead of being waited for."""
    from components.workdir_lock import data_repository_lock

    with data_repository_lock(cfg), _data_locks(cfg) as held:
        yield held


@contextlib.contextmanager
def _data_locks(cfg: VersioningConfig):
    data = data_paths(cfg)[1]
    suffix = f"{MARK}lock"
    inner = sorted(data.rglob(f".*{suffix}")) if data.is_dir() else []
    locks = [Lock(data, keep_file=True)]
    locks += [Lock(p.parent / p.name[1 : -len(suffix)]) for p in inner if p.is_file()]
    with locked(locks, cfg.lock_timeout_s):
        done = recover(cfg)
        for line in done:
            logging.getLogger(__name__).warning("recovered: %s", line)
        yield done, {lock.path for lock in locks}


def finish_interrupted(cfg: VersioningConfig) -> list[str]:
    """Complete or undo a snapshot or rollback that was killed midway (what every snapshot
    and rollback does first); returns what was done."""
    with writing(cfg) as (done, _):
        return done


@contextlib.contextmanager
def journaled(cfg: VersioningConfig, journal: dict):
    """Write the journal, run the block; on any failure finish or undo it right away."""
    path = _journal(cfg)
    write_atomic(path, json.dumps(journal, sort_keys=True))
    try:
        yield
    except BaseException:
        recover(cfg)
        raise
    path.unlink()
    fsync_dir(path.parent)


def recover(cfg: VersioningConfig) -> list[str]:
    """Complete or undo what a killed snapshot or rollback left (call holding the lock);
    returns what was done."""
    root, data, dvc_file, _ = data_paths(cfg)
    path = _journal(cfg)
    done = recover_file(path) + recover_file(dvc_file) + _repair_dvc_rwlock(root)
    if not path.is_file():
        return done + recover_dir(data)
    journal = json.loads(path.read_text())
    if journal["op"] == "rollback":
        done.append(_recover_rollback(cfg, journal))
    else:
        done.append(_recover_snapshot(cfg, journal))
    path.unlink()
    return done


def _repair_dvc_rwlock(root: Path) -> list[str]:
    """DVC rewrites .dvc/tmp/rwlock in place: a DVC command killed mid-write leaves it cut
    short, and every later DVC command then fails on it. Checked under DVC's own guard of
    that file, content that is not JSON belonged to a dead writer: it is removed (an empty
    rwlock is what DVC starts from)."""
    path = root / ".dvc" / "tmp" / "rwlock"

    def damaged() -> bool:
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return False
        except ValueError:
            return True
        return False

    if not damaged():
        return []
    from dvc.lock import make_lock

    with make_lock(str(path.parent / "rwlock.lock"), tmp_dir=str(path.parent), wait=True):
        if not damaged():
            return []
        path.unlink()
    return [f"removed {path}, cut short by a killed DVC command"]


def _recover_rollback(cfg: VersioningConfig, journal: dict) -> str:
    root, data, dvc_file, _ = data_paths(cfg)
    entry = find_version(cfg, journal["version"])
    old, tmp = root / journal["old"], root / journal["tmp"]
    if data.is_dir() and not verify(data, entry["files"]):
        write_atomic(dvc_file, entry["dvc_file"])
        done = f"completed the interrupted rollback to {entry['version']}"
    elif not os.path.lexists(data) and old.is_dir():
        os.rename(old, data)
        done = f"undid the interrupted rollback to {entry['version']} (data/ put back)"
    elif not os.path.lexists(old):
        done = f"undid the interrupted rollback to {entry['version']} (data/ was not touched)"
    else:
        raise VersioningError(
            f"an interrupted rollback to {entry['version']} left the previous data in {old} and a "
            f"{data} that is not that version: nothing was deleted; move one of them away"
        )
    for leftover in (old, tmp):
        if leftover.is_dir():
            shutil.rmtree(leftover)
    return done


def _recover_snapshot(cfg: VersioningConfig, journal: dict) -> str:
    _, _, dvc_file, log = data_paths(cfg)
    now = dvc_file.read_text() if dvc_file.is_file() else None
    if log.is_file() and log.stat().st_size > journal["log_size"]:
        with log.open("rb") as f:
            f.seek(journal["log_size"])
            added = f.read().decode("utf-8", "replace").splitlines()
        try:
            if now is not None and json.loads(added[-1])["dvc_file"] == now:
                return "the interrupted snapshot had finished"
        except (ValueError, KeyError, IndexError, TypeError):
            pass
        os.truncate(log, journal["log_size"])
    if journal["dvc_file"] is None:
        dvc_file.unlink(missing_ok=True)
    elif now != journal["dvc_file"]:
        write_atomic(dvc_file, journal["dvc_file"])
    return "undid an interrupted snapshot (data.dvc and the version log restored)"


def repair(cfg: VersioningConfig) -> dict:
    """Rebuild a damaged or missing data.dvc from the version log: the newest version whose
    files data/ holds byte for byte. Refuses (writing nothing) when data/ matches none."""
    with writing(cfg):
        _, data, dvc_file, log = data_paths(cfg)
        try:
            current = read_dvc_file(dvc_file)["md5"].removesuffix(".dir")
        except VersioningError:
            current = None
        entries = read_log(cfg)
        for entry in reversed(entries):
            if not verify(data, entry["files"]):
                break
        else:
            raise VersioningError(
                f"{data} matches no version in {log.name} ({len(entries)} versions); nothing "
                f"was written: move {dvc_file.name} aside and run `agentrl data snapshot` to "
                "version what data/ holds"
            )
        if current == entry["version"]:
            return {"version": current, "repaired": False}
        write_atomic(dvc_file, entry["dvc_file"])
        return {"version": entry["version"], "repaired": True}


def pending(cfg: VersioningConfig) -> str | None:
    """What an interrupted snapshot/rollback left for the next one to finish, or None."""
    path = _journal(cfg)
    if not path.is_file():
        return None
    journal = json.loads(path.read_text())
    what = f"rollback to {journal['version']}" if journal["op"] == "rollback" else "snapshot"
    return f"an interrupted {what} is pending: the next snapshot or rollback finishes or undoes it"


def find_version(cfg: VersioningConfig, version: str) -> dict:
    """The newest log entry whose id starts with `version` (a unique prefix is enough)."""
    entries = read_log(cfg)
    matches = {e["version"] for e in entries if e["version"].startswith(version)}
    if not version or not matches:
        known = ", ".join(e["version"][:12] for e in entries) or "none"
        raise VersioningError(f"unknown data version {version!r} (known: {known})")
    if len(matches) > 1:
        raise VersioningError(f"version prefix {version!r} is ambiguous: {sorted(matches)}")
    return next(e for e in reversed(entries) if e["version"] in matches)


def verify(data: Path, files: dict[str, str]) -> list[str]:
    """Problems between data/ on disk and the recorded {relpath: md5}; empty when equal."""
    actual = hash_tree(data) if data.is_dir() else {}
    problems = [f"missing file {p}" for p in sorted(set(files) - set(actual))]
    problems += [f"unexpected file {p}" for p in sorted(set(actual) - set(files))]
    problems += [
        f"{p}: md5 {actual[p]} != recorded {files[p]}"
        for p in sorted(set(files) & set(actual))
        if actual[p] != files[p]
    ]
    return problems
