"""Tampering rules: which changes of the agent's never enter verification.

Changes to protected paths (tests), to pytest or interpreter configuration (conftest.py,
pytest.ini, pyproject.toml, ..., `*.pth`) and files that could shadow or hook the harness
(`pytest*`, `_pytest*`, `pluggy`, `sitecustomize`, `usercustomize`, at any depth) are
tampering, and so are names with a line break, another control character or bytes that are
not UTF-8, and special files (FIFO, socket, device). A symlink pointing outside the
repository is a path escape (the fresh trees never follow it either).
"""

from __future__ import annotations

import os

from components.tasks.task import Task

# Files that change how pytest or the interpreter behaves: never taken from the agent.
CONFIG_FILES = {
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
}
# Module names a repository file or folder must not have: on sys.path they would replace
# or hook the harness (pytest, its plugins and dependencies) or run at interpreter start.
HARNESS_MODULES = ("pluggy", "iniconfig", "sitecustomize", "usercustomize")
HARNESS_PREFIXES = ("pytest", "_pytest", "agentrl_")  # agentrl_: the sandbox's own plugins


def tamper_reason(task: Task, rel_path: str, kind: str = "file") -> str | None:
    """Why a change to `rel_path` may not enter verification (None: it may)."""
    name = os.path.basename(rel_path)
    if kind == "special":
        return "not a regular file (a FIFO, socket or device breaks the copy)"
    if not rel_path.isprintable():
        return (
            "a name with a line break, a control character or bytes that are not UTF-8 "
            "(only there to confuse the tools or the verifier)"
        )
    if task.is_protected(rel_path):
        return "protected path"
    if name in CONFIG_FILES:
        return "configures pytest or the interpreter"
    if name.endswith(".pth"):
        return "runs code at every interpreter start"
    for part in rel_path.split("/"):
        module = part.split(".", 1)[0]
        if module in HARNESS_MODULES or module.startswith(HARNESS_PREFIXES):
            return f"{part} would shadow or hook the test harness"
    return None


def escapes_repository(rel: str, target: str) -> bool:
    """Whether a symlink at rel with this target points outside the repository."""
    if target.startswith("/"):
        return True
    norm = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return norm == ".." or norm.startswith("../")
