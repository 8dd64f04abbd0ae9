"""Lint and security findings the agent's changes introduce (ruff), for the reward terms.

Only the changed files are checked, in the original and in the final tree; a finding counts
when the final tree has more of it than the original and than the task's reference fix
(whose own findings are not the agent's to answer for).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from components import shutdown
from components.runtime import refuse_if_stopping
from components.tasks.task import Task

LINT_RULES = "E,F,W"
SECURITY_RULES = "S"
# assert and pseudo-random numbers are normal in this code base; not security findings.
RUFF_IGNORE = "E501,S101,S311"


def _ruff_counts(root: Path, files: list[str]) -> Counter:
    """Diagnostics per (file, rule code) for the given files under root."""
    present = [f for f in files if (root / f).is_file()]
    if not present:
        return Counter()
    ruff = Path(sys.executable).with_name("ruff")
    exe = str(ruff) if ruff.exists() else (shutil.which("ruff") or "ruff")
    proc = subprocess.run(
        [exe, "check", "--isolated", "--no-cache", "--output-format", "json", "--exit-zero",
         "--select", f"{LINT_RULES},{SECURITY_RULES}", "--ignore", RUFF_IGNORE, *present],
        cwd=root, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ruff failed: {proc.stderr.strip()[:300]}")
    counts: Counter = Counter()
    for d in json.loads(proc.stdout or "[]"):
        counts[(os.path.relpath(d["filename"], root), d["code"])] += 1
    return counts


_REFERENCE_LINT: dict[tuple[str, str], Counter] = {}


def reference_findings(task: Task) -> Counter:
    """Ruff findings per (file, code) in the files the task's reference fix touches, with
    the fix applied (cached per task and patch): findings the fix itself brings are not the
    agent's to answer for. Empty when the task has no reference or it does not apply."""
    patch = task.reference_patch()
    if patch is None:
        return Counter()
    key = (str(task.root), hashlib.sha256(patch.encode()).hexdigest())
    if key not in _REFERENCE_LINT:
        from components.tasks.patching import PatchError, apply_unified_diff

        refuse_if_stopping("a reference lint")  # Ctrl-C: no new folder in the run's tmp
        with shutdown.temporary_folder("agentrl-reflint-") as tmp:
            repo = Path(tmp) / "repo"
            shutil.copytree(task.repo_dir, repo, symlinks=True)
            try:
                touched = apply_unified_diff(repo, patch)
                counts = _ruff_counts(repo, [f for f in touched if f.endswith(".py")])
            except (PatchError, OSError, RuntimeError, subprocess.SubprocessError):
                counts = Counter()  # the gate reports a patch that does not apply
        _REFERENCE_LINT[key] = counts
    return _REFERENCE_LINT[key]


def introduced_findings(
    original: Path, final: Path, files: list[str], allowed: Counter | None = None
) -> dict[str, list[str]]:
    """Ruff findings in `files` that the final tree has more of than the original (or than
    `allowed`, the reference fix's own, where that is more). When ruff checks the original
    but fails on the agent's files, that is one lint finding (a file that crashes the
    linter must not erase the episode)."""
    py = [f for f in files if f.endswith(".py")]
    before = _ruff_counts(original, py)
    try:
        after = _ruff_counts(final, py)
    except (RuntimeError, subprocess.SubprocessError, ValueError) as e:
        return {"lint": [f"ruff could not check the changed files: {e}"], "security": []}
    out: dict[str, list[str]] = {"lint": [], "security": []}
    allowed = allowed or Counter()
    for (path, code), n in sorted(after.items()):
        extra = n - max(before.get((path, code), 0), allowed.get((path, code), 0))
        if extra > 0:
            out["security" if code.startswith("S") else "lint"] += [f"{path}: {code}"] * extra
    return out
