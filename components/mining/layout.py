"""A repository's layout: its test files and source modules, a copy without caches and
tools, the src/ layout made importable, the distribution it declares."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from components.tasks.folder_safety import refuse_unsafe_source_tree
from components.tasks.task import TaskFormatError, parse_editable

SKIP_DIRS = {".git", ".hg", ".tox", ".nox", ".venv", "venv", "build", "dist", "docs", "doc",
             "__pycache__", ".pytest_cache", ".eggs", "node_modules", "examples", "benchmarks"}  # fmt: skip
VENDOR_DIRS = {"_vendor", "vendor", "_vendored", "vendored", "third_party", "_third_party"}
CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
# Modules of the harness inside every environment: a repository with one of these names
# would be shadowed by the harness's copy (or shadow it).
HARNESS_MODULES = {"pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments",
                   "pytest_timeout", "py"}  # fmt: skip
TOOLS = ".agentrl-mine"
SRC_LAYOUT_NOTE = "# added by agentrl tasks mine: the src/ layout's packages on sys.path"


def walk_py(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def is_test_file(rel: str) -> bool:
    name = os.path.basename(rel)
    return name.startswith("test_") or name.endswith("_test.py")


def _in_test_dir(rel: str) -> bool:
    return any(p in ("test", "tests", "testing") for p in Path(rel).parts[:-1])


def _vendored(rel: str) -> bool:
    return any(p in VENDOR_DIRS for p in Path(rel).parts[:-1])


def discover(root: Path) -> tuple[list[str], list[str]]:
    """(test files, source modules) of a repository, relative paths, sorted. Vendored
    third-party code is neither (its tests are not the repository's, its bugs not either)."""
    files = [f for f in walk_py(root) if not _vendored(f)]
    tests = [f for f in files if is_test_file(f)]
    modules = [
        f for f in files
        if not is_test_file(f) and not _in_test_dir(f)
        and os.path.basename(f) not in ("conftest.py", "setup.py", "noxfile.py", "__main__.py")
    ]  # fmt: skip
    return tests, modules


def top_modules(root: Path, modules: list[str]) -> set[str]:
    tops = set()
    for m in modules:
        parts = Path(m).parts
        if parts[0] == "src" and len(parts) > 1:
            parts = parts[1:]
        tops.add(parts[0].removesuffix(".py"))
    return tops


# What a copy leaves out: caches, tools, version control (docs and examples stay: a test
# may read them).
COPY_IGNORE = shutil.ignore_patterns(*SKIP_DIRS - {"docs", "doc", "examples", "benchmarks"},
                                     "*.pyc")  # fmt: skip


def check_source(src: Path, name: str | None = None) -> None:
    """Refuse a repository with a link that leaves it, a link cycle, a hard link to a file
    outside it, a FIFO, device or socket (folder_safety's source-tree rule: links inside it
    are copied as their targets' content); UnsafeTaskFolder naming the path."""
    refuse_unsafe_source_tree(src, name or Path(src).name, ignore=COPY_IGNORE)


def copy_repo(src: Path, dest: Path) -> None:
    """Copy a repository without caches and tools, checked first (`check_source`): the copy
    holds folders and regular files only."""
    check_source(src)
    shutil.copytree(src, dest, symlinks=False, ignore=COPY_IGNORE)


def add_src_path(root: Path) -> None:
    """src/ layout: the repository's packages are not at its root, where the tests' python
    finds them; a root conftest.py (protected, like every pytest configuration) adds src/."""
    conftest = root / "conftest.py"
    head = (f"{SRC_LAYOUT_NOTE}\nimport os as _os, sys as _sys\n"
            "_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "
            "'src'))\n")  # fmt: skip
    old = conftest.read_text() if conftest.is_file() else ""
    conftest.write_text(head + ("\n" + old if old else ""))


def distribution(repo: Path) -> tuple[str, str]:
    """(name, version) of the distribution a repository is, from its sdist's PKG-INFO or a
    static `[project]` table; ("", "") when neither says (a checkout with a dynamic version)."""
    import email.parser
    import tomllib

    name = version = ""
    pkg_info = repo / "PKG-INFO"
    if pkg_info.is_file():
        info = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
        name, version = (info.get("Name") or "").strip(), (info.get("Version") or "").strip()
    elif (repo / "pyproject.toml").is_file():
        try:
            project = tomllib.loads((repo / "pyproject.toml").read_text()).get("project", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            project = {}
        name, version = str(project.get("name", "")), str(project.get("version", ""))
    try:  # task.json's checks: a bad value means no .dist-info, not a bad repository
        parse_editable({"name": name, "version": version}, "PKG-INFO")
    except TaskFormatError:
        return "", ""
    return name, version
