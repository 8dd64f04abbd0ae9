"""Harbor's own models and template task, for testing our Harbor and ATIF readers and
writers against the reference rather than against our reading of it.

The `harbor` wheel (HARBOR_VERSION) needs Python >= 3.12 to install, but its task and
trajectory models are plain pydantic: fetched with `pip download` (cached under
~/.cache/agentrl-tests) and put on sys.path with `typing.override` (3.12) taken from
typing_extensions, they import on 3.11. Tests that need them skip, with the reason, when
the package registry cannot be reached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import typing
import zipfile
from pathlib import Path

import pytest

HARBOR_VERSION = "0.26.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentrl-tests"


@functools.cache
def _extracted() -> Path | str:
    """The folder holding the unpacked wheel, or why it could not be had."""
    root = CACHE / f"harbor-{HARBOR_VERSION}"
    if (root / "harbor" / "models").is_dir():
        return root
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"harbor=={HARBOR_VERSION}", "--no-deps",
           "--python-version", "3.12", "--only-binary=:all:", "-d", str(wheels), "-q"]  # fmt: skip
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        return "pip download harbor timed out (registry unreachable?)"
    found = sorted(wheels.glob(f"harbor-{HARBOR_VERSION}-*.whl"))
    if not found:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return f"cannot download harbor=={HARBOR_VERSION}: {tail}"
    tmp = root.with_name(f".{root.name}.{os.getpid()}")
    with zipfile.ZipFile(found[0]) as z:
        z.extractall(tmp)
    with contextlib.suppress(OSError):  # another process unpacked it first
        tmp.rename(root)
    return root


def harbor_root() -> Path:
    """The unpacked wheel's folder (harbor/ inside), importable; skips the test if absent."""
    where = _extracted()
    if isinstance(where, str):
        pytest.skip(where)
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # what harbor needs from 3.12
    if str(where) not in sys.path:
        sys.path.append(str(where))
    return where


def template_task() -> Path:
    """harbor's own template task folder (`harbor init`'s)."""
    return harbor_root() / "harbor" / "cli" / "template-task"
