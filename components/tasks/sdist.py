"""A library's source distribution, fetched the way pip builds it: `fetch_sdist`.

`pip download --no-binary :all: --no-deps NAME==VERSION` with build isolation: pip installs
the sdist's own build back-end (setuptools, setuptools_scm, flit_core, hatchling,
poetry-core, ...) from the package registry into a throw-away environment to read its
metadata, as `pip install` would. Without isolation only the back-ends of this interpreter
are there, and a flit/hatch/poetry sdist fails with `No module named ...`.

The sdist is then checked against what was asked for: its PKG-INFO must name the version
requested (PEP 440 equality), and a version of 0.0.0 is refused — a setuptools_scm sdist
whose version could not be found says 0.0.0, and pip may otherwise fall back to another
release silently. Extraction refuses links and paths that leave the folder (tarfile's
"data" filter). Nothing here runs the library's code on this machine except its build
back-end's metadata hook, which pip runs in its isolated build environment.
"""

from __future__ import annotations

import email.parser
import hashlib
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class SdistError(RuntimeError):
    """The sdist cannot be fetched or is not the one asked for (one line)."""


@dataclass(frozen=True)
class Sdist:
    root: Path  # the extracted source tree (with PKG-INFO and, usually, its tests)
    archive: Path
    upstream: dict  # name, version, sdist, sha256, url, license, build_backend


def parse_requirement(text: str) -> tuple[str, str]:
    """('attrs', '23.2.0') from 'attrs==23.2.0'; SdistError for anything but NAME==VERSION."""
    name, sep, version = text.partition("==")
    name, version = name.strip(), version.strip()
    if not (sep and name and version) or any(c in text for c in " ;[@<>~!,"):
        raise SdistError(f"expected NAME==VERSION (an exact pin), got {text!r}")
    return name, version


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _build_backend(root: Path) -> str:
    import tomllib

    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return "setuptools.build_meta:__legacy__"  # no pyproject: pip's default
    return str(data.get("build-system", {}).get("build-backend", "setuptools.build_meta"))


def _extract(archive: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise SdistError(f"{archive.name}: member {member!r} leaves the folder")
            z.extractall(dest)
    else:
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(dest, filter="data")  # no links or paths out of dest
            except tarfile.FilterError as e:
                raise SdistError(f"{archive.name}: {e}") from e
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise SdistError(f"{archive.name}: expected one top folder, found {len(roots)}")
    return roots[0]


def fetch_sdist(
    requirement: str, dest: Path, *, find_links: tuple[str, ...] = (), timeout_s: float = 600.0
) -> Sdist:
    """Download and extract the sdist of `requirement` (NAME==VERSION) into `dest`."""
    name, version = parse_requirement(requirement)
    dest = Path(dest)
    download = dest / "download"
    download.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            "--disable-pip-version-check", "--no-input", "-q", "-d", str(download),
            *(f"--find-links={f}" for f in find_links), f"{name}=={version}"]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise SdistError(f"{requirement}: pip download timed out after {timeout_s:g}s") from e
    if proc.returncode != 0:
        text = proc.stderr + proc.stdout
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        why = next((x for x in lines if "inconsistent version" in x or "0.0.0" in x), None)
        why = why or next((x for x in reversed(lines) if x.startswith("ERROR")), None)
        why = why or (lines[-1] if lines else f"exit code {proc.returncode}")
        raise SdistError(f"{requirement}: pip download failed: {why[:300]}")
    archives = [p for p in download.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tgz"))]
    if len(archives) != 1:
        raise SdistError(f"{requirement}: expected one sdist, pip saved {len(archives)}")
    (archive,) = archives
    root = _extract(archive, dest / "src")
    pkg_info = root / "PKG-INFO"
    if not pkg_info.is_file():
        raise SdistError(f"{requirement}: {archive.name} has no PKG-INFO (not an sdist)")
    info = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
    got = (info.get("Version") or "").strip()
    if _same_version(got, "0.0.0"):
        raise SdistError(
            f"{requirement}: the sdist's version resolves to 0.0.0 (a setuptools_scm sdist "
            "without its version): refused"
        )
    if not _same_version(got, version):
        raise SdistError(f"{requirement}: the sdist is version {got!r}, not {version!r}: refused")
    upstream = {
        "name": name,
        "version": version,
        "sdist": archive.name,
        "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "url": f"https://pypi.org/project/{name}/{version}/",
        "license": (info.get("License-Expression") or info.get("License") or "")
        .strip()
        .split("\n")[0][:200],
        "build_backend": _build_backend(root),
    }
    return Sdist(root=root, archive=archive, upstream=upstream)
