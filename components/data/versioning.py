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

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from components.data.config import VersioningConfig
from components.data.ingest import file_md5
from components.data.writers import (
    IGNORE_PATTERN,
    MARK,
    Lock,
    append_line,
    fsync_dir,
    fsync_tree,
    is_bookkeeping,
    locked,
    recover_dir,
    recover_file,
    sibling,
    write_atomic,
)
from components.verifier.version import verifier_version

DVC_FILE_SUFFIX = ".dvc"


class VersioningError(RuntimeError):
    """A snapshot, lookup or rollback could not be done; the message says why."""


def _dvc():
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # no network calls home from a data stage
    from dvc.repo import Repo

    return Repo


@contextlib.contextmanager
def _repo(root: Path):
    """An open DVC repository, quiet; DVC's own errors become one-line VersioningErrors."""
    from dvc.exceptions import DvcException

    Repo = _dvc()
    with _quiet():
        repo = Repo(str(root))
        try:
            yield repo
        except DvcException as e:
            raise VersioningError(f"dvc: {e}") from e
        finally:
            repo.close()


@contextlib.contextmanager
def _quiet():
    # DVC logs hints ("To track the changes with git, run: ...") at INFO to stdout; keep
    # stdout for our own results (the version id) so scripts can capture it.
    logger = logging.getLogger("dvc")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        logger.setLevel(level)


def _paths(cfg: VersioningConfig) -> tuple[Path, Path, Path, Path]:
    root = Path(cfg.repo_root).resolve()
    data = root / cfg.data_dir
    return root, data, root / (cfg.data_dir.rstrip("/") + DVC_FILE_SUFFIX), root / cfg.version_log


def remote_settings(cfg: VersioningConfig, root: Path) -> dict[str, str]:
    """The [remote "<name>"] section for .dvc/config (never credentials).

    A local remote's url is absolute here; see _stored_url for how it is written.
    """
    if cfg.s3 is not None:
        section = {"url": cfg.s3.url}
        for key in ("endpointurl", "region", "profile"):
            value = getattr(cfg.s3, key)
            if value:
                section[key] = value
        return section
    local = Path(cfg.local_remote)
    target = local if local.is_absolute() else root / local
    target.mkdir(parents=True, exist_ok=True)
    return {"url": str(target.resolve())}


def _stored_url(cfg: VersioningConfig, root: Path, url: str) -> str:
    """How to hand `url` to DVC's config editor so .dvc/config stays portable.

    DVC stores a relative path relative to .dvc/ but reads the one it is given as relative
    to the working directory; so a repo-relative local remote is passed cwd-relative and
    ends up as "../.dvc-remote" in the file. Absolute settings and s3:// stay as they are.
    """
    if cfg.s3 is not None or Path(cfg.local_remote).is_absolute():
        return url
    return os.path.relpath(url, Path.cwd())


def _resolved(url: str, root: Path) -> str:
    """A url as read back from .dvc/config, made absolute (DVC resolves it against .dvc/)."""
    if "://" in url or Path(url).is_absolute():
        return url
    return str((root / ".dvc" / url).resolve())


def init_dvc(cfg: VersioningConfig) -> list[str]:
    """`dvc init` if needed and point the default remote at cfg; returns what was done."""
    Repo = _dvc()
    root, _, _, _ = _paths(cfg)
    done: list[str] = []
    with _quiet():
        if not (root / ".dvc").is_dir():
            Repo.init(str(root), no_scm=not (root / ".git").exists())
            done.append("dvc init")
        repo = Repo(str(root))
        try:
            wanted = remote_settings(cfg, root)
            with repo.config.edit() as conf:
                have = dict(conf["remote"].get(cfg.remote_name, {}))
                if "url" in have:
                    have["url"] = _resolved(have["url"], root)
                if have != wanted:
                    conf["remote"][cfg.remote_name] = {
                        **wanted,
                        "url": _stored_url(cfg, root, wanted["url"]),
                    }
                    done.append(f"remote {cfg.remote_name} -> {wanted['url']}")
                if conf["core"].get("remote") != cfg.remote_name:
                    conf["core"]["remote"] = cfg.remote_name
                    done.append(f"default remote {cfg.remote_name}")
        finally:
            repo.close()
    # Locks, journals and half-written folders are never data (writers.py).
    done += _ignore(root / ".dvcignore", IGNORE_PATTERN)
    local = Path(cfg.local_remote)
    if (root / ".git").exists():
        done += _ignore(root / ".gitignore", IGNORE_PATTERN)
        if cfg.s3 is None and not local.is_absolute():
            # A remote inside the work tree holds data objects: keep them out of git.
            done += _ignore(root / ".gitignore", f"/{local.as_posix().strip('/')}/")
    return done


def _ignore(ignore_file: Path, entry: str) -> list[str]:
    """Add a line to a .gitignore-style file unless it is there; what was done."""
    lines = ignore_file.read_text().splitlines() if ignore_file.is_file() else []
    if entry in lines:
        return []
    with ignore_file.open("a") as f:
        f.write(("\n" if lines and lines[-1] else "") + entry + "\n")
    return [f"{entry} added to {ignore_file.name}"]


def hash_tree(data: Path) -> dict[str, str]:
    """{path relative to data/: md5} for every file (the bytes a version must restore);
    bookkeeping files (locks, half-written folders: writers.py) are not data."""
    tree = {}
    for p in sorted(data.rglob("*")):
        rel = p.relative_to(data)
        if p.is_file() and not any(is_bookkeeping(part) for part in rel.parts):
            tree[rel.as_posix()] = file_md5(p)
    return tree


REPAIR_HINT = "`agentrl data repair` rebuilds it from the version log when data/ matches a version"


def read_dvc_file(path: Path) -> dict:
    """The single `outs` entry of data.dvc (md5, size, nfiles, ...)."""
    import yaml

    if not path.is_file():
        raise VersioningError(f"{path} does not exist: run `agentrl data snapshot` first")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise VersioningError(f"{path} is damaged ({type(e).__name__}): {REPAIR_HINT}") from e
    outs = doc.get("outs") if isinstance(doc, dict) else None
    if not (
        isinstance(outs, list)
        and len(outs) == 1
        and isinstance(outs[0], dict)
        and str(outs[0].get("md5", "")).endswith(".dir")
    ):
        raise VersioningError(
            f"{path} is damaged (expected one directory output, got {str(outs)[:80]!r}): "
            f"{REPAIR_HINT}"
        )
    return outs[0]


def check_dvc_file(cfg: VersioningConfig) -> None:
    """Raise VersioningError when data.dvc exists but is damaged (absent is fine: no
    snapshot yet)."""
    dvc_file = _paths(cfg)[2]
    if dvc_file.is_file():
        read_dvc_file(dvc_file)


def current_version(cfg: VersioningConfig) -> str:
    """The version id recorded in data.dvc (what training runs log to MLflow)."""
    return read_dvc_file(_paths(cfg)[2])["md5"].removesuffix(".dir")


def _dataset_summaries(data: Path) -> tuple[dict[str, dict], list[str]]:
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
    path = _paths(cfg)[3]
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
    return sibling(_paths(cfg)[1], "journal")


@contextlib.contextmanager
def _writing(cfg: VersioningConfig):
    """Hold data/ exclusively (and every dataset inside it that has a lock file: a writer
    that started before data/'s lock file existed), after finishing an interrupted write."""
    data = _paths(cfg)[1]
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
    with _writing(cfg) as (done, _):
        return done


@contextlib.contextmanager
def _journaled(cfg: VersioningConfig, journal: dict):
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
    root, data, dvc_file, _ = _paths(cfg)
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
    root, data, dvc_file, _ = _paths(cfg)
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
    _, _, dvc_file, log = _paths(cfg)
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
    with _writing(cfg):
        _, data, dvc_file, log = _paths(cfg)
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


def snapshot(cfg: VersioningConfig, message: str = "", lineage: dict | None = None) -> dict:
    """dvc add + push of data/; returns the version log entry (its `version` is the id).
    `lineage`: where this version came from (e.g. `agentrl rescore --write`: the version it
    rescored and the verifier versions before and after), kept in its log entry."""
    with _writing(cfg):
        return _snapshot(cfg, message, lineage or {})


def _snapshot(cfg: VersioningConfig, message: str, lineage: dict) -> dict:
    root, data, dvc_file, log = _paths(cfg)
    if not data.is_dir() or not hash_tree(data):
        raise VersioningError(f"{data} is missing or empty: nothing to snapshot")
    check_dvc_file(cfg)  # DVC would fail on it with a parser trace
    init_dvc(cfg)
    journal = {
        "op": "snapshot",
        "dvc_file": dvc_file.read_text() if dvc_file.is_file() else None,
        "log_size": log.stat().st_size if log.is_file() else 0,
    }
    with _journaled(cfg, journal):
        with _repo(root) as repo:
            repo.add(str(data))
            repo.push(targets=[str(dvc_file)], remote=cfg.remote_name)
        out = read_dvc_file(dvc_file)
        files = hash_tree(data)
        if len(files) != out.get("nfiles"):
            raise VersioningError(
                f"{dvc_file} records {out.get('nfiles')} files but {data} holds {len(files)} "
                "(is something in .dvcignore?)"
            )
        datasets, sources = _dataset_summaries(data)
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


def unsnapshotted_changes(cfg: VersioningConfig) -> list[str]:
    """Files in data/ that the version in data.dvc does not hold (new or changed): what a
    rollback would lose. Missing files are not listed: nothing of them would be lost."""
    _, data, dvc_file, log = _paths(cfg)
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


def _fetch(repo, cfg: VersioningConfig, entry: dict) -> bool:
    """Make sure every object of the version is in the local cache, pulling the missing
    ones from the remote; True when some were pulled. Refuses (VersioningError) when an
    object is in neither place, before anything else is touched."""
    from dvc_data.hashfile.hash_info import HashInfo

    needed = {entry["version"] + ".dir": "the directory listing"}
    needed.update({md5: rel for rel, md5 in entry["files"].items()})
    cache = repo.cache.local
    missing = [oid for oid in needed if not cache.exists(oid)]
    if not missing:
        return False
    remote = repo.cloud.get_remote_odb(cfg.remote_name, "rollback")
    # DVC's existence check of a local remote deletes an object whose hash is wrong, and
    # trusts a read-only one unhashed: hash them here first, so a corrupted object is named
    # as such and left in place for whoever investigates.
    corrupted = [
        oid for oid in missing if cfg.s3 is None and _damaged(remote.oid_to_path(oid), oid)
    ]
    present = set(remote.oids_exist([oid for oid in missing if oid not in corrupted]))
    absent = [oid for oid in missing if oid not in present and oid not in corrupted]
    problems = []
    if corrupted:
        problems.append(
            f"{len(corrupted)} of its objects are corrupted in remote {cfg.remote_name!r} (their "
            f"md5 is not their name: {_names(needed, corrupted)}) and not in the local cache"
        )
    if absent:
        problems.append(
            f"{len(absent)} of its objects are in neither the local cache nor remote "
            f"{cfg.remote_name!r} ({_names(needed, absent)})"
        )
    if problems:
        raise VersioningError(
            f"cannot roll back to {entry['version']}: {'; '.join(problems)}; data/ was not touched"
        )
    repo.cloud.pull([HashInfo("md5", oid) for oid in missing], remote=cfg.remote_name)
    still = [oid for oid in missing if not cache.exists(oid)]
    if still:
        raise VersioningError(
            f"could not fetch {len(still)} objects of {entry['version']} from remote "
            f"{cfg.remote_name!r} ({_names(needed, still)}): the remote holds them, so they are "
            "corrupted there or the transfer failed; data/ was not touched"
        )
    return True


def _damaged(path: str, oid: str) -> bool:
    """A file at `path` whose md5 is not `oid` (a missing file is not damaged)."""
    try:
        return file_md5(Path(path)) != oid.removesuffix(".dir")
    except FileNotFoundError:
        return False


def _names(needed: dict[str, str], oids: list[str]) -> str:
    return ", ".join(needed[oid] for oid in oids[:5]) + (", ..." if len(oids) > 5 else "")


def _build(repo, entry: dict, folder: Path) -> None:
    """Write the version's files into `folder` from the cache, checking every md5."""
    cache = repo.cache.local
    for rel, md5 in sorted(entry["files"].items()):
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.md5()
        with open(cache.oid_to_path(md5), "rb") as src, dst.open("wb") as out:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != md5:
            raise VersioningError(
                f"the cached copy of {rel} is damaged (md5 {h.hexdigest()} != {md5}); "
                "delete it from .dvc/cache and retry (it will be pulled again)"
            )
    fsync_tree(folder)


def rollback(cfg: VersioningConfig, version: str, snapshot_first: bool = False) -> dict:
    """Restore data/ to `version` (see the module doc for what makes it safe); returns what
    was done. Changes in data/ that no snapshot holds are refused, or snapshotted first
    when `snapshot_first`."""
    with _writing(cfg) as (_, ours):
        entry = find_version(cfg, version)
        root, data, dvc_file, _ = _paths(cfg)
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
        with _repo(root) as repo:
            pulled = _fetch(repo, cfg, entry)
            try:
                _build(repo, entry, tmp)
                kept = _carry_over(data, tmp, ours)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        journal = {"op": "rollback", "version": entry["version"], "tmp": tmp.name, "old": old.name}
        with _journaled(cfg, journal):
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
