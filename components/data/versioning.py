"""Dataset versions with DVC: snapshot data/, list versions, roll back byte for byte.

Design
- data/ is one DVC output, tracked by the top-level data.dvc. A version id is DVC's own
  content hash of data/: the md5 of the `.dir` object recorded in data.dvc (without the
  `.dir` suffix). Same bytes, same id, on any machine; later stages log it to MLflow.
- data-versions.jsonl (next to data.dvc, tracked by git) is the version log: one line per
  snapshot with id, date, file count and size, the dataset manifests' counts and sources,
  the md5 of every file, and the exact data.dvc text. It makes `versions` and `rollback`
  independent of git history: rollback writes that data.dvc back, lets DVC check the
  files out (pulling from the remote when the local cache lacks them), then re-hashes every
  file against the log. Extra or missing files fail the check, too.
- Remotes: by default a local folder (VersioningConfig.local_remote, `.dvc-remote/` in the
  repo), written into .dvc/config as a path relative to .dvc/ so the config stays
  portable. With `s3` configured, an S3-compatible remote (url, endpointurl, region,
  profile); credentials are never written: DVC reads AWS_ACCESS_KEY_ID /
  AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN from the environment. S3 needs the dvc-s3
  plugin installed.
All DVC work goes through dvc.repo.Repo (the same code the dvc CLI runs).

Safety (writers.py): snapshot and rollback hold an exclusive lock on data/ (and on every
dataset inside it), which every ingest/validate inside data/ holds shared, so a version is
never taken or restored halfway through a write. Rollback cannot lose data:
- it refuses when data/ has changes no snapshot holds (or snapshots them first, asked);
- it makes sure every object of the target version is in the local cache, fetching the
  missing ones from the remote, before touching data/ (none missing anywhere: it refuses);
- it builds the version in a hidden sibling folder from the cache, checking every md5,
  swaps it in with two renames and writes data.dvc only after that;
- what no version can hold (entries DVC ignores: named like bookkeeping, or not regular
  files) is linked into the rebuilt folder: the only files a rollback drops are the lock
  files it holds itself;
- a journal beside data/ is written before the swap and removed after: a rollback killed
  midway is completed (data/ already holds the version) or undone (the old data/ is put
  back) by the next snapshot or rollback. A killed snapshot is undone the same way
  (data.dvc and the version log restored; data/ itself is never written by a snapshot).
A damaged data.dvc is reported by every command (`versions` too) and `repair` rebuilds it
from the log when data/ holds a version byte for byte. An object of the remote whose md5 is
not its name is reported as corrupted, not as missing, and left where it is.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from components.data.config import VersioningConfig
from components.data.dvc_store import (
    VersioningError,
    build_from_cache,
    check_dvc_file,
    current_version,
    data_paths,
    fetch_objects,
    hash_tree,
    init_dvc,
    open_repo,
    read_dvc_file,
)
from components.data.version_log import (
    dataset_summaries,
    find_version,
    journaled,
    read_log,
    writing,
)
from components.data.writers import (
    append_line,
    fsync_dir,
    is_bookkeeping,
    sibling,
    write_atomic,
)
from components.verifier.version import verifier_version


def snapshot(cfg: VersioningConfig, message: str = "", lineage: dict | None = None) -> dict:
    """dvc add + push of data/; returns the version log entry (its `version` is the id).
    `lineage`: where this version came from (e.g. `agentrl rescore --write`: the version it
    rescored and the verifier versions before and after), kept in its log entry."""
    with writing(cfg):
        return _snapshot(cfg, message, lineage or {})


def _snapshot(cfg: VersioningConfig, message: str, lineage: dict) -> dict:
    root, data, dvc_file, log = data_paths(cfg)
    if not data.is_dir() or not hash_tree(data):
        raise VersioningError(f"{data} is missing or empty: nothing to snapshot")
    check_dvc_file(cfg)  # DVC would fail on it with a parser trace
    init_dvc(cfg)
    journal = {
        "op": "snapshot",
        "dvc_file": dvc_file.read_text() if dvc_file.is_file() else None,
        "log_size": log.stat().st_size if log.is_file() else 0,
    }
    with journaled(cfg, journal):
        with open_repo(root) as repo:
            repo.add(str(data))
            repo.push(targets=[str(dvc_file)], remote=cfg.remote_name)
        out = read_dvc_file(dvc_file)
        files = hash_tree(data)
        if len(files) != out.get("nfiles"):
            raise VersioningError(
                f"{dvc_file} records {out.get('nfiles')} files but {data} holds {len(files)} "
                "(is something in .dvcignore?)"
            )
        datasets, sources = dataset_summaries(data)
        entry = {
            "version": out["md5"].removesuffix(".dir"),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "nfiles": out["nfiles"],
            "size": out["size"],
            "datasets": datasets,
            "sources": sources,
            "remote": cfg.remote_name,
            "message": message,
            # The verifier of the code that took the snapshot; records carry their own.
            "verifier_version": verifier_version(),
            "lineage": lineage,
            "files": files,
            "dvc_file": dvc_file.read_text(),
        }
        previous = read_log(cfg)
        if not previous or previous[-1]["version"] != entry["version"]:
            append_line(log, json.dumps(entry, sort_keys=True))
        else:
            entry = previous[-1]  # unchanged data: same version, nothing new to log
    return entry


def unsnapshotted_changes(cfg: VersioningConfig) -> list[str]:
    """Files in data/ that the version in data.dvc does not hold (new or changed): what a
    rollback would lose. Missing files are not listed: nothing of them would be lost."""
    _, data, dvc_file, log = data_paths(cfg)
    actual = hash_tree(data) if data.is_dir() else {}
    if not actual:
        return []
    if not dvc_file.is_file():
        return [f"{len(actual)} files and no snapshot"]
    version = current_version(cfg)
    recorded = next((e["files"] for e in reversed(read_log(cfg)) if e["version"] == version), None)
    if recorded is None:
        return [f"{dvc_file.name} records version {version}, which {log.name} does not list"]
    changes = [f"new file {p}" for p in sorted(set(actual) - set(recorded))]
    changes += [f"changed file {p}" for p in sorted(set(actual) & set(recorded))
                if actual[p] != recorded[p]]  # fmt: skip
    return changes


def rollback(cfg: VersioningConfig, version: str, snapshot_first: bool = False) -> dict:
    """Restore data/ to `version` (see the module doc for what makes it safe); returns what
    was done. Changes in data/ that no snapshot holds are refused, or snapshotted first
    when `snapshot_first`."""
    with writing(cfg) as (_, ours):
        entry = find_version(cfg, version)
        root, data, dvc_file, _ = data_paths(cfg)
        changes = unsnapshotted_changes(cfg)
        if changes and not snapshot_first:
            shown = "; ".join(changes[:5]) + (f" (+{len(changes) - 5})" if len(changes) > 5 else "")
            raise VersioningError(
                f"{data} has changes no snapshot holds ({shown}); a rollback would lose them: "
                "snapshot first (agentrl data snapshot) or pass --snapshot-first"
            )
        if changes:
            _snapshot(cfg, f"before rollback to {entry['version']}", {})
        init_dvc(cfg)  # a fresh clone may lack the remote settings (e.g. config.local)
        tmp = sibling(data, f"tmp-{os.getpid()}")
        old = sibling(data, f"old-{os.getpid()}")
        with open_repo(root) as repo:
            pulled = fetch_objects(repo, cfg, entry)
            try:
                build_from_cache(repo, entry, tmp)
                kept = _carry_over(data, tmp, ours)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        journal = {"op": "rollback", "version": entry["version"], "tmp": tmp.name, "old": old.name}
        with journaled(cfg, journal):
            if os.path.lexists(data):
                os.rename(data, old)
            os.rename(tmp, data)
            fsync_dir(root)
            write_atomic(dvc_file, entry["dvc_file"])
            if old.is_dir():
                shutil.rmtree(old)
    return {
        "version": entry["version"],
        "verified_files": len(entry["files"]),
        "pulled": pulled,
        "kept": kept,
    }


def _carry_over(data: Path, new: Path, ours: set[Path]) -> list[str]:
    """Link into `new` every entry of data/ that no version can hold (named like
    bookkeeping, or not a regular file: DVC ignores them) except the lock files this
    rollback holds: the only things it writes inside data/. Versioned files are checked
    by unsnapshotted_changes; these would otherwise go with the old data/. Linked, not
    moved, so a rollback killed before the swap loses nothing either. Returns their paths
    relative to data/."""
    kept: list[str] = []
    if not data.is_dir():
        return kept

    def walk(folder: Path) -> None:
        for p in sorted(folder.iterdir()):
            if p in ours:
                continue
            if not is_bookkeeping(p.name) and not p.is_symlink() and p.is_dir():
                walk(p)
            elif is_bookkeeping(p.name) or not p.is_file():
                rel = p.relative_to(data)
                (new / rel).parent.mkdir(parents=True, exist_ok=True)
                if p.is_dir() and not p.is_symlink():
                    shutil.copytree(p, new / rel, symlinks=True, copy_function=_link)
                else:
                    _link(p, new / rel)
                kept.append(rel.as_posix())

    walk(data)
    return kept


def _link(src, dst) -> None:
    """A hard link of src at dst (a symlink stays a symlink; a FIFO or socket is made anew)."""
    src, dst = Path(src), Path(dst)
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_file():
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    else:
        import stat

        mode = src.lstat().st_mode
        if stat.S_ISFIFO(mode):
            os.mkfifo(dst, stat.S_IMODE(mode))
        else:
            raise VersioningError(f"{src} is neither a file, folder, link nor FIFO: move it away")
