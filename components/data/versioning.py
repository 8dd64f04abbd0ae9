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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from components.data.config import VersioningConfig
from components.data.ingest import file_md5

DVC_FILE_SUFFIX = ".dvc"


class VersioningError(RuntimeError):
    """A snapshot, lookup or rollback could not be done; the message says why."""


def _dvc():
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # no network calls home from a data stage
    from dvc.repo import Repo

    return Repo


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
    local = Path(cfg.local_remote)
    if cfg.s3 is None and not local.is_absolute() and (root / ".git").exists():
        # A remote inside the work tree holds data objects: keep them out of git.
        gitignore = root / ".gitignore"
        entry = f"/{local.as_posix().strip('/')}/"
        lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
        if entry not in lines:
            with gitignore.open("a") as f:
                f.write(("\n" if lines and lines[-1] else "") + entry + "\n")
            done.append(f"{entry} added to .gitignore")
    return done


def hash_tree(data: Path) -> dict[str, str]:
    """{path relative to data/: md5} for every file (the bytes a version must restore)."""
    return {
        p.relative_to(data).as_posix(): file_md5(p) for p in sorted(data.rglob("*")) if p.is_file()
    }


def read_dvc_file(path: Path) -> dict:
    """The single `outs` entry of data.dvc (md5, size, nfiles, ...)."""
    import yaml

    if not path.is_file():
        raise VersioningError(f"{path} does not exist: run `agentrl data snapshot` first")
    outs = (yaml.safe_load(path.read_text()) or {}).get("outs") or []
    if len(outs) != 1 or not str(outs[0].get("md5", "")).endswith(".dir"):
        raise VersioningError(f"{path}: expected one directory output, got {outs!r}")
    return outs[0]


def current_version(cfg: VersioningConfig) -> str:
    """The version id recorded in data.dvc (what training runs log to MLflow)."""
    return read_dvc_file(_paths(cfg)[2])["md5"].removesuffix(".dir")


def _dataset_summaries(data: Path) -> tuple[dict[str, dict], list[str]]:
    summaries: dict[str, dict] = {}
    sources: set[str] = set()
    for manifest in sorted(data.rglob("manifest.json")):
        m = json.loads(manifest.read_text())
        rel = manifest.parent.relative_to(data).as_posix()
        summaries[rel] = {"stage": m.get("stage"), "counts": m.get("counts", {})}
        sources.update(m.get("sources", {}))
    return summaries, sorted(sources)


def read_log(cfg: VersioningConfig) -> list[dict]:
    path = _paths(cfg)[3]
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def snapshot(cfg: VersioningConfig, message: str = "") -> dict:
    """dvc add + push of data/; returns the version log entry (its `version` is the id)."""
    root, data, dvc_file, log = _paths(cfg)
    if not data.is_dir() or not any(p.is_file() for p in data.rglob("*")):
        raise VersioningError(f"{data} is missing or empty: nothing to snapshot")
    init_dvc(cfg)
    Repo = _dvc()
    with _quiet():
        repo = Repo(str(root))
        try:
            repo.add(str(data))
            repo.push(targets=[str(dvc_file)], remote=cfg.remote_name)
        finally:
            repo.close()
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
        "files": files,
        "dvc_file": dvc_file.read_text(),
    }
    previous = read_log(cfg)
    if not previous or previous[-1]["version"] != entry["version"]:
        with log.open("a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
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


def rollback(cfg: VersioningConfig, version: str) -> dict:
    """Restore data/ to `version` and verify every file's md5; returns what was done."""
    from dvc.exceptions import CheckoutError

    entry = find_version(cfg, version)
    root, data, dvc_file, _ = _paths(cfg)
    init_dvc(cfg)  # a fresh clone may lack the remote settings (e.g. config.local)
    dvc_file.write_text(entry["dvc_file"])
    Repo = _dvc()
    pulled = False
    with _quiet():
        repo = Repo(str(root))
        try:
            try:
                repo.checkout(targets=[str(dvc_file)], force=True)
            except CheckoutError:
                # The local cache lacks some objects: fetch them from the remote.
                repo.pull(targets=[str(dvc_file)], remote=cfg.remote_name, force=True)
                pulled = True
        finally:
            repo.close()
    problems = verify(data, entry["files"])
    if problems:
        raise VersioningError(
            f"rollback to {entry['version']} did not restore the recorded bytes: "
            + "; ".join(problems[:20])
        )
    return {"version": entry["version"], "verified_files": len(entry["files"]), "pulled": pulled}
