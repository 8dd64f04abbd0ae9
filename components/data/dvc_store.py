"""DVC's side of dataset versioning: the repository and its remote (.dvc/config), data.dvc
(the version id of data/: DVC's md5 of its `.dir` object), the md5 of every file of data/,
and the objects of a version fetched from the remote and written out of the cache, every
md5 checked. All DVC work goes through dvc.repo.Repo (the same code the dvc CLI runs)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from pathlib import Path

from components.data.config import VersioningConfig
from components.data.ingest import file_md5
from components.data.writers import (
    IGNORE_PATTERN,
    fsync_tree,
    is_bookkeeping,
)

DVC_FILE_SUFFIX = ".dvc"


class VersioningError(RuntimeError):
    """A snapshot, lookup or rollback could not be done; the message says why."""


def _dvc():
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # no network calls home from a data stage
    from dvc.repo import Repo

    return Repo


@contextlib.contextmanager
def open_repo(root: Path):
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


def data_paths(cfg: VersioningConfig) -> tuple[Path, Path, Path, Path]:
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
    root, _, _, _ = data_paths(cfg)
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
    dvc_file = data_paths(cfg)[2]
    if dvc_file.is_file():
        read_dvc_file(dvc_file)


def current_version(cfg: VersioningConfig) -> str:
    """The version id recorded in data.dvc (what training runs log to MLflow)."""
    return read_dvc_file(data_paths(cfg)[2])["md5"].removesuffix(".dir")


def fetch_objects(repo, cfg: VersioningConfig, entry: dict) -> bool:
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


def build_from_cache(repo, entry: dict, folder: Path) -> None:
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
