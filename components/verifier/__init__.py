"""Verifier: the hidden-test verdict, out of reach of the code under test.

A verification goes in this order; every check starts from one snapshot and nothing a
check writes survives it:

1. **Snapshot.** The agent's final repository is copied once, before any verification
   process runs: regular files and symlinks (as links) only. A FIFO, socket or device file
   is tampering (it can only be there to break the copy); at most MAX_SNAPSHOT_FILES files
   and MAX_SNAPSHOT_BYTES bytes are copied.
2. **Tampering.** Changes to protected paths (tests), to pytest or interpreter
   configuration (conftest.py, pytest.ini, pyproject.toml, ..., `*.pth`) and files that could
   shadow or hook the harness (`pytest*`, `_pytest*`, `pluggy`, `sitecustomize`,
   `usercustomize`, at any depth) are reported as tampering and never taken; so are names
   with a line break, another control character or bytes that are not UTF-8.
3. **Hidden tests**: a fresh tree plus the hidden tests and a canary test that must fail
   (both read-only under bwrap), run by a trusted harness under an isolated interpreter
   start (`python -s -P -B`: no user site, no current folder or repository on sys.path
   ahead of the environment's packages; the repository is appended after them; the
   environment is the sandbox's allow-list, so no PYTHON* variable of the host applies)
   with pytest plugins given explicitly (autoload off; pytest-timeout, its limit counted in
   CPU time and unstarved wall time (harness_plugins/agentrl_cpu_timeout.py: load decides
   no verdict), and the harness's recorder passed as objects). The recorder notes what each test's setup, call and
   teardown raised, independently of pytest's reports. A pass needs both to agree, the
   canary reported as failed, every hidden test present and none skipped; anything else
   that bends the run is a forged verdict (test tampering). The import of a test module
   (and of the code it imports) is limited like a test, and so is each hidden case.
4. **Hidden cases**, when the hidden tests passed and the task ships cases
   (`hidden_cases.json`) or its hidden tests are plain `assert f(literals) == literal`
   lines (read off here, `derive_cases`): another fresh tree from the snapshot, without
   the hidden tests, runs the function on the arguments only; the expected values never
   leave this process. Answers the code gathered while the hidden tests ran cannot reach
   this run: under bwrap nothing a sandboxed process writes outlives it except its tree,
   and this tree is new. Hidden tests that pass while the cases fail are a forged verdict.
5. **Who caused a missing verdict.** When the agent's tree gives no verdict (no harness
   report, pytest internal/usage error, a wall-clock or other limit, a tree that cannot be
   copied), the untouched task repository is verified under the same harness (the
   control, cached per task). If the control gets a verdict, the failure is the agent's: a
   failed verification, with `forged_pass` when the code ended the harness and
   `limit_hit` when a limit killed it. Only a harness that fails on the control too is an
   infrastructure failure (`status="infra_error"`), which callers keep out of rewards.

Verdicts are cached by (task, hash of the final tree, settings, verifier version): GRPO groups and fix
searches re-verify identical trees (`verdict_cache_info`). The tree's hash length-prefixes
every entry's path, kind, mode and content (`Snapshot.digest`), so two trees never share
it. The verdict lines are judged strictly: a record of another shape than the harness's,
a second line, or a line followed by a hang or another exit status came from the code
under test (a forged verdict); any exception a tree raises in a check is a lost verdict,
whose cause the control decides (step 5). Verdicts that depend on timing
(a limit hit, a lost verdict) and failed controls are not kept.

What is NOT protected: code under test runs inside the pytest process, so a program
written against this harness (patching the recorder's hook implementations in memory,
reading the hidden test's constants) can still bend the pytest verdict of a task with no
hidden cases; tasks whose verdict must hold against that need hidden cases (shipped or
derivable). Without bubblewrap the hidden tests are writable, the task store is readable
and a process can leave what it learnt in the host's /tmp for the hidden-case run
(components/sandbox/__init__.py says what each isolation mode gives). `verify_command` tasks
get an exit-status verdict only.

A task with an environment (task.json `environment`, components/tasks/environments.py) is
verified with that environment's interpreter, mounted read-only, and the harness's pytest
copied into it at the project's versions; every step above is the same. An environment
that is not prepared is an infrastructure error, never a failed verdict.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from components import pyast
from components.env.config import EnvConfig
from components.runtime import refuse_if_stopping
from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult, kernel_call_refused, run_sandboxed
from components.tasks.environments import (
    TaskEnvironmentError,
    task_python_env,
    with_task_limits,
)
from components.tasks.harbor import is_harbor_task
from components.tasks.harbor import run_verifier as run_harbor_verifier
from components.tasks.task import Task, same_value
from components.verifier.version import verifier_version

IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".git", ".mypy_cache"}
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
HARNESS_PREFIXES = ("pytest", "_pytest")
MAX_SNAPSHOT_FILES = 20_000
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
LINT_RULES = "E,F,W"
SECURITY_RULES = "S"
# assert and pseudo-random numbers are normal in this code base; not security findings.
RUFF_IGNORE = "E501,S101,S311"
# The interpreter start of every verification process (see the module docstring).
ISOLATED_PYTHON = ("python", "-s", "-P", "-B")
VERDICT_MARKER = "AGENTRL-VERDICT"
CASES_MARKER = "AGENTRL-CASES"
VERDICT_CACHE_SIZE = 4096


@dataclass
class Verification:
    status: str  # "ok" | "infra_error"
    tests_passed: bool = False
    tests_total: int = 0
    tests_failed: int = 0
    changed_files: list[str] = field(default_factory=list)
    tampered_files: list[str] = field(default_factory=list)
    lint_introduced: int = 0
    security_introduced: int = 0
    security_findings: list[str] = field(default_factory=list)
    # The code under test bent or ended the verdict: pytest reported a pass the recorder,
    # the canary or the hidden cases contradict, or the harness ended without a verdict.
    forged_pass: bool = False
    detail: str = ""
    wall_s: float = 0.0
    # What the verifier observed, as safety flags {"category", "reason"} (test_tampering,
    # resource_limit, network, path_escape, write_outside_workspace): an episode records
    # them next to the monitor's, and the reward reads them.
    flags: list[dict] = field(default_factory=list)
    limit_hit: str | None = None  # a sandbox limit a verification process ran into
    # Why the agent's tree gave no verdict ("" when it gave one). With status "ok" the
    # control verified normally: the failure is the agent's.
    verdict_lost: str = ""
    cached: bool = False  # this verdict was computed for an identical tree before


# ----------------------------------------------------------------------------- snapshot


class SnapshotError(OSError):
    """The agent's repository cannot be copied (too big, unreadable)."""


@dataclass
class Snapshot:
    root: Path | None  # None: entries only, nothing copied
    # rel path -> (kind "file"|"link"|"special", sha256 of the bytes | link target | "")
    entries: dict[str, tuple[str, str]]
    modes: dict[str, int] = field(default_factory=dict)  # rel path -> st_mode (lstat)

    @property
    def digest(self) -> str:
        """The tree's hash, the verdict cache's key: every entry's path, kind, mode and
        content (bytes' hash or link target), each field length-prefixed, so no two trees
        share an encoding whatever their names hold (newlines, separators, non-UTF-8)."""
        h = hashlib.sha256(len(self.entries).to_bytes(8, "big"))
        for rel, (kind, digest) in sorted(self.entries.items()):
            mode = self.modes.get(rel, 0).to_bytes(8, "big")
            for part in (os.fsencode(rel), kind.encode(), mode, os.fsencode(digest)):
                h.update(len(part).to_bytes(8, "big") + part)
        return h.hexdigest()


def _scan(src: Path):
    """(rel path, kind, DirEntry) below src in sorted order; never follows a symlink."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(src / rel_dir if rel_dir else src) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.is_symlink():
                yield rel, "link", e
            elif e.is_dir(follow_symlinks=False):
                if e.name not in IGNORED_PARTS:
                    yield rel, "dir", e
                    stack.append(rel)
            elif e.is_file(follow_symlinks=False):
                if not e.name.endswith((".pyc", ".pyo")):
                    yield rel, "file", e
            else:
                yield rel, "special", e  # FIFO, socket, device


def take_snapshot(src: Path, dest: Path | None) -> Snapshot:
    """Copy src to dest once (regular files and links; special files are only listed) and
    describe every entry; dest None: describe only."""
    entries: dict[str, tuple[str, str]] = {}
    modes: dict[str, int] = {}
    files = size = 0
    if dest is not None:
        dest.mkdir(parents=True)
    for rel, kind, e in _scan(Path(src)):
        out = dest / rel if dest is not None else None
        if kind == "dir":
            if out is not None:
                out.mkdir()
            continue
        modes[rel] = e.stat(follow_symlinks=False).st_mode
        if kind == "link":
            target = os.readlink(e.path)
            entries[rel] = ("link", target)
            if out is not None:
                os.symlink(target, out)
            continue
        if kind == "special":
            entries[rel] = ("special", "")
            continue
        files += 1
        size += e.stat(follow_symlinks=False).st_size
        if files > MAX_SNAPSHOT_FILES or size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(
                f"more than {MAX_SNAPSHOT_FILES} files or {MAX_SNAPSHOT_BYTES} bytes"
            )
        fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        entries[rel] = ("file", hashlib.sha256(data).hexdigest())
        if out is not None:
            out.write_bytes(data)
    return Snapshot(dest, entries, modes)


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def changed_files(original: Path, final: Path) -> list[str]:
    """Relative paths added, removed or modified between two repo trees."""
    return _changed(take_snapshot(original, None).entries, take_snapshot(final, None).entries)


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


def is_tampering(task: Task, rel_path: str) -> bool:
    return tamper_reason(task, rel_path) is not None


def _escapes(rel: str, target: str) -> bool:
    """Whether a symlink at rel with this target points outside the repository."""
    if target.startswith("/"):
        return True
    norm = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return norm == ".." or norm.startswith("../")


def count_hidden_tests(task: Task) -> int:
    """Test functions in the hidden files (module level and in Test* classes)."""
    n = 0
    for rel in task.hidden_test_files():
        if not rel.endswith(".py"):
            continue
        tree = pyast.parse((task.hidden_tests_dir / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                n += 1
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                n += sum(
                    isinstance(m, ast.FunctionDef) and m.name.startswith("test") for m in node.body
                )
    return n


def build_tree(
    task: Task, snap: Snapshot, changed: list[str], tampered: set[str], dest: Path, *,
    hidden: bool,
) -> None:  # fmt: skip
    """Original repo + the snapshot's non-tampering changes (+ the hidden tests) in dest.
    A symlink the agent made is never followed: its path is absent from the tree."""
    shutil.copytree(task.repo_dir, dest, symlinks=True,
                    ignore=shutil.ignore_patterns(*IGNORED_PARTS, "*.pyc"))  # fmt: skip
    for rel in changed:
        if rel in tampered:
            continue
        dst = dest / rel
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.is_dir() and snap.entries.get(rel, ("gone",))[0] == "file":
            shutil.rmtree(dst)  # a folder of the original that the agent made a file
        if snap.entries.get(rel, ("gone",))[0] != "file":
            continue  # deleted by the agent, or a symlink
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(snap.root / rel, dst)
    if hidden:
        for rel in task.hidden_test_files():
            dst = dest / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_symlink():
                dst.unlink()
            shutil.copyfile(task.hidden_tests_dir / rel, dst)


# ----------------------------------------------------------------------------- lint


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
        with tempfile.TemporaryDirectory(prefix="agentrl-reflint-") as tmp:
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


# ----------------------------------------------------------------------------- hidden cases


def _module_file(repo: Path, dotted: str) -> str | None:
    base = dotted.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if (repo / rel).is_file():
            return rel
    return None


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _derived_case(stmt: ast.stmt, imported: dict[str, tuple[str, str]]) -> dict | None:
    """{"module", "function", "args", "expected"} of `assert f(literals) == literal`."""
    if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)):
        return None
    test = stmt.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return None
    for call, expected in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id in imported
            and not call.keywords
            and all(_literal(a) and not isinstance(a, ast.Starred) for a in call.args)
            and _literal(expected)
        ):
            module, function = imported[call.func.id]
            args = ast.unparse(ast.Tuple(elts=list(call.args), ctx=ast.Load()))
            return {"module": module, "function": function, "args": args,
                    "expected": ast.unparse(expected)}  # fmt: skip
    return None


def derive_cases(task: Task) -> list[dict]:
    """Hidden cases read off hidden tests whose every statement is `assert f(literals) ==
    literal` with f imported from a repository module (`from gcd import gcd`): the
    imported benchmarks' shape. Other tests stay pytest-only."""
    cases: list[dict] = []
    for rel in task.hidden_test_files():
        if not rel.endswith(".py"):
            continue
        tree = pyast.parse((task.hidden_tests_dir / rel).read_text())
        imported: dict[str, tuple[str, str]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module = _module_file(task.repo_dir, node.module)
                if module is not None:
                    for alias in node.names:
                        imported[alias.asname or alias.name] = (module, alias.name)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
                continue
            body = node.body[1:] if ast.get_docstring(node) else node.body
            found = [_derived_case(stmt, imported) for stmt in body]
            if found and all(found):
                cases.extend(found)
    return cases


def hidden_cases(task: Task) -> tuple[list[dict], str]:
    """(cases, comparison): the task's hidden_cases.json compared with exact types, else
    the cases derived from its hidden tests compared with == (as the tests do)."""
    if task.hidden_cases_path is not None:
        spec = json.loads(task.hidden_cases_path.read_text())
        cases = [{"module": spec["module"], "function": spec["function"], **c}
                 for c in spec["cases"]]  # fmt: skip
        return cases, "exact"
    return derive_cases(task), "equal"


def _case_matches(result: dict, expected: str, comparison: str) -> bool:
    if "repr" not in result:
        return False
    try:
        got, want = ast.literal_eval(result["repr"]), ast.literal_eval(expected)
        # Both are plain values here (the runner refuses anything else), so == is ours.
        return same_value(got, want) if comparison == "exact" else bool(got == want)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


# Runs inside the sandbox with only the *arguments* of the hidden cases; prints plain-value
# reprs of the results. The expected values stay in the verifier process, so code under
# test can neither read them nor forge a pass (patching pytest, returning an object whose
# __eq__ is always true).
CASE_RUNNER = r"""
import ast, importlib, importlib.util, json, os, sys

import agentrl_limits  # CPU time and unstarved wall time (harness_plugins/)

PLAIN = (int, float, complex, str, bytes, bool, type(None))


def check(x, depth=0):
    if depth > 64:
        raise TypeError("result nested too deeply")
    t = type(x)  # exact types only: a subclass could fake its repr or equality
    if t in PLAIN:
        return
    if t in (list, tuple, set, frozenset):
        for y in x:
            check(y, depth + 1)
        return
    if t is dict:
        for k, v in x.items():
            check(k, depth + 1)
            check(v, depth + 1)
        return
    raise TypeError("result of type %s is not a plain value" % t.__name__)


def on_limit(kind):
    raise TimeoutError("case timed out")


def load(path, n):
    # A module inside packages is imported by its dotted name (its relative imports work):
    # the folder above its outermost package goes on sys.path, behind the environment.
    parts = path[:-3].split("/")
    k = len(parts) - 1
    while k > 0 and os.path.isfile("/".join(parts[:k]) + "/__init__.py"):
        k -= 1
    if k < len(parts) - 1:
        base = "/".join(parts[:k]) or "."
        if base not in sys.path:
            sys.path.append(base)
        name = ".".join(parts[k:]).removesuffix(".__init__")
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location("module_under_test_%d" % n, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    token, args_path, timeout = sys.argv[1:4]
    with open(args_path) as f:
        calls = json.load(f)
    sys.path.append(".")  # the repository, behind the environment's packages
    modules, out, import_timeout = {}, [], False
    for module_file, function, text in calls:
        try:
            agentrl_limits.arm(float(timeout), float(timeout), on_limit)
            try:
                if module_file not in modules:
                    try:
                        modules[module_file] = load(module_file, len(modules))
                    except BaseException as e:
                        modules[module_file] = e
                        import_timeout = import_timeout or isinstance(e, TimeoutError)
                module = modules[module_file]
                if isinstance(module, BaseException):
                    raise module
                value = getattr(module, function)(*ast.literal_eval(text))
            finally:
                agentrl_limits.cancel()
            check(value)
            out.append({"repr": repr(value)})
        except BaseException as e:
            out.append({"error": type(e).__name__})
    result = {"results": out, "import_timeout": import_timeout}
    sys.stdout.write("\nAGENTRL-CASES %s %s\n" % (token, json.dumps(result)))
    sys.stdout.flush()


main()
"""


# ----------------------------------------------------------------------------- hidden tests

# The harness the hidden tests run under (see the module docstring, step 4). The verdict
# line goes to a copy of the original stdout taken before any repository code runs.
HARNESS = r"""
import json, os, sys


IMPORT_TIMEOUTS = []
ENDINGS = ("_pytest.outcomes.Exit", "SystemExit", "KeyboardInterrupt")


def on_limit(kind):
    IMPORT_TIMEOUTS.append(1)
    raise TimeoutError("import of a test module timed out")


def main():
    token, root, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    out = os.dup(1)
    sys.path.append(root)  # the repository, behind the environment's packages
    import agentrl_cpu_timeout
    import agentrl_limits
    import pytest
    import pytest_timeout

    record = {"items": [], "phases": {}, "reports": {}, "collect": []}

    def rel(path):
        return os.path.relpath(str(path), root)

    class Recorder:
        def _watch(self, item, phase):
            try:
                result = yield
            except BaseException as e:
                record["phases"].setdefault(item.nodeid, {})[phase] = type(e).__name__
                raise
            record["phases"].setdefault(item.nodeid, {})[phase] = "ok"
            return result

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            return (yield from self._watch(item, "setup"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            return (yield from self._watch(item, "call"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item):
            return (yield from self._watch(item, "teardown"))

        def pytest_runtest_logreport(self, report):
            record["reports"].setdefault(report.nodeid, {})[report.when] = report.outcome

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_make_collect_report(self, collector):
            # pytest-timeout covers tests, not the import of a test module (and of the code
            # it imports): a module that hangs at import fails here, under the limits a
            # test gets (CPU time, and wall time less the time starved of a core).
            agentrl_limits.arm(timeout, timeout, on_limit)
            try:
                return (yield)
            finally:
                agentrl_limits.cancel()

        def pytest_collectreport(self, report):
            if report.outcome != "passed":
                path = report.nodeid.split("::")[0]
                text = report.longreprtext
                ended = any(x in text for x in ENDINGS)  # the import ended the run
                outcome = "ended" if ended else report.outcome
                record["collect"].append([rel(self.rootpath / path), outcome])

        def pytest_configure(self, config):
            self.rootpath = config.rootpath

        def pytest_collection_finish(self, session):
            record["items"] = [[i.nodeid, rel(i.path)] for i in session.items]

    rc = pytest.main(sys.argv[4:], plugins=[pytest_timeout, agentrl_cpu_timeout, Recorder()])
    record["rc"] = int(rc)
    record["import_timeouts"] = len(IMPORT_TIMEOUTS)
    os.write(out, ("\nAGENTRL-VERDICT %s %s\n" % (token, json.dumps(record))).encode())


main()
"""


@dataclass
class _Check:
    """What one sandboxed check (hidden cases or hidden tests) gave."""

    passed: bool = False
    total: int = 0
    failed: int = 0
    forged: list[str] = field(default_factory=list)  # how the verdict was bent
    lost: str = ""  # why there is no verdict ("": there is one)
    limit: str | None = None
    command: CommandResult | None = None
    detail: str = ""


def _no_verdict(cmd: CommandResult, what: str) -> str:
    if cmd.limit_hit not in (None, "output"):
        return f"{what} hit its {cmd.limit_hit} limit"
    if cmd.exit_code >= 128:
        return f"{what} crashed (signal {cmd.exit_code - 128})"
    return f"{what} ended without a verdict (exit code {cmd.exit_code})"


def _last_marker(output: str, marker: str) -> tuple[int, object]:
    """(times the marker line appears, the JSON after its last occurrence or None)."""
    n = output.count(marker)
    if not n:
        return 0, None
    try:
        return n, json.loads(output[output.rfind(marker) + len(marker) :].splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return n, None


def _pairs(x: object) -> bool:
    return isinstance(x, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in x
    )


def _table(x: object) -> bool:
    return isinstance(x, dict) and all(
        isinstance(v, dict) and all(isinstance(w, str) for w in v.values()) for v in x.values()
    )


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _record_problem(record: dict) -> str:
    """Which field of a verdict record has not the shape HARNESS writes ("": none)."""
    shapes = {"items": _pairs, "collect": _pairs, "phases": _table, "reports": _table,
              "rc": _count, "import_timeouts": _count}  # fmt: skip
    bad = [name for name, ok in shapes.items() if not ok(record.get(name))]
    return f"field {bad[0]!r} is not what the harness writes" if bad else ""


def _ran_after_verdict(cmd: CommandResult) -> str:
    """Why the process was not done when its verdict line was written ("" when it was):
    the harness and the case runner write theirs last and exit 0, so a line followed by a
    hang, a kill or another exit status came from the code under test."""
    if cmd.limit_hit not in (None, "output") or cmd.timed_out:
        return f"a verdict line was followed by a {cmd.limit_hit or 'wall_time'} limit hit"
    if cmd.exit_code != 0:
        return f"a verdict line was followed by exit status {cmd.exit_code}"
    return ""


def _check_config(task: Task, env: EnvConfig, sandbox: SandboxConfig) -> SandboxConfig:
    """The sandbox of a verification process: the verifier's wall limit, room for the
    verdict line, and the task folder and its store masked (the sandbox does not show them
    under bwrap anyway; this also covers a store inside a folder it does show)."""
    # A task with its own environment is verified with that interpreter, whatever the
    # episode's sandbox said (TaskEnvironmentError when it is not prepared).
    python_env = task_python_env(task, sandbox.environments_dir) or sandbox.python_env
    return dataclasses.replace(
        sandbox,
        python_env=python_env,
        wall_time_s=env.verify_timeout_s,
        cpu_time_s=max(sandbox.cpu_time_s, int(env.verify_timeout_s)),
        max_output_bytes=max(sandbox.max_output_bytes, 1 << 20),
        hide_paths=(*sandbox.hide_paths, str(task.root), str(task.root.parent)),
    )


def _cases_check(
    cases: list[dict], comparison: str, tree: Path, env: EnvConfig, cfg: SandboxConfig
) -> _Check:
    """Run the cases' arguments in `tree` (which must not hold the hidden tests) and compare
    the results with the expected values here."""
    token = secrets.token_hex(8)
    tools = tree / f".agentrl-{token}"
    tools.mkdir()
    (tools / "runner.py").write_text(CASE_RUNNER)
    (tools / "args.json").write_text(
        json.dumps([[c["module"], c["function"], c["args"]] for c in cases])
    )
    argv = [*ISOLATED_PYTHON, f"{tools.name}/runner.py", token, f"{tools.name}/args.json",
            f"{env.per_test_timeout_s:g}"]  # fmt: skip
    cmd = run_sandboxed(argv, tree, cfg, readonly=(tools,))
    return _judge_cases(cmd, token, cases, comparison)


def _judge_cases(cmd: CommandResult, token: str, cases: list[dict], comparison: str) -> _Check:
    """The hidden-case verdict from the runner's line (see the module docstring)."""
    check = _Check(total=len(cases), failed=len(cases), command=cmd, limit=_limit(cmd))
    n, got = _last_marker(cmd.output, f"{CASES_MARKER} {token} ")
    if got is None:
        check.lost = _no_verdict(cmd, "the hidden-case run")
        return check
    if not (
        isinstance(got, dict)
        and isinstance(got.get("results"), list)
        and all(isinstance(r, dict) and isinstance(r.get("repr", ""), str) for r in got["results"])
        and isinstance(got.get("import_timeout"), bool)
    ):  # the runner writes one shape only
        check.forged.append("a malformed hidden-case record")
        return check
    if n > 1:
        check.forged.append(f"the hidden-case line appeared {n} times")
    after = _ran_after_verdict(cmd)
    if after:
        check.forged.append(after)
    if got.get("import_timeout") is True:
        check.limit = check.limit or "wall_time"
        check.detail = "the import of the code under test timed out\n"
    results = [r if isinstance(r, dict) else {} for r in got["results"]][: len(cases)]
    results += [{}] * (len(cases) - len(results))
    check.failed = sum(
        not _case_matches(r, c["expected"], comparison) for c, r in zip(cases, results, strict=True)
    )
    check.passed = check.failed == 0 and not check.forged
    check.detail += f"{len(cases) - check.failed}/{len(cases)} hidden cases match"
    return check


def _limit(cmd: CommandResult) -> str | None:
    return cmd.limit_hit if cmd.limit_hit not in (None, "output") else None


def _tests_check(task: Task, tree: Path, env: EnvConfig, cfg: SandboxConfig) -> _Check:
    """The hidden tests (already in `tree`) plus the canary under the harness."""
    token = secrets.token_hex(8)
    tools = tree / f".agentrl-{token}"
    tools.mkdir()
    (tools / f"harness_{token}.py").write_text(HARNESS)
    canary = f"{tools.name}/test_{token}.py"
    (tree / canary).write_text(
        f"def test_{token}():\n    raise AssertionError('canary: this test always fails')\n"
    )
    hidden = task.hidden_test_files()
    argv = [*ISOLATED_PYTHON, f"{tools.name}/harness_{token}.py", token, str(tree),
            f"{env.per_test_timeout_s:g}", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "--continue-on-collection-errors", f"--timeout={env.per_test_timeout_s:g}",
            *hidden, canary]  # fmt: skip
    readonly = (tools, *(tree / rel for rel in hidden))
    cmd = run_sandboxed(argv, tree, cfg, readonly=readonly)
    check = _judge_tests(cmd, token, set(hidden), count_hidden_tests(task))
    check.command, check.limit = cmd, check.limit or _limit(cmd)
    marker = cmd.output.rfind(f"{VERDICT_MARKER} {token} ")
    check.detail = (cmd.output[:marker] if marker >= 0 else cmd.output)[-2000:]
    return check


def _judge_tests(cmd: CommandResult, token: str, hidden: set[str], expected: int) -> _Check:
    """The hidden-test verdict from the harness's record (see the module docstring)."""
    check = _Check(total=max(expected, 1), failed=max(expected, 1))
    n, record = _last_marker(cmd.output, f"{VERDICT_MARKER} {token} ")
    if not isinstance(record, dict):
        check.lost = _no_verdict(cmd, "the hidden-test run")
        return check
    problem = _record_problem(record)
    if problem:  # the harness writes one shape only: another was written by the code
        check.forged.append(f"a malformed verdict record ({problem})")
        return check
    if n > 1:
        check.forged.append(f"the harness's verdict line appeared {n} times")
    after = _ran_after_verdict(cmd)
    if after:
        check.forged.append(after)
    if record.get("import_timeouts"):  # a test module's import hung: a time limit hit
        check.limit = "wall_time"
    rc = record.get("rc")
    if rc not in (0, 1):
        check.lost = f"pytest ended with exit code {rc} (interrupted, internal or usage error)"
        return check
    phases, reports = record.get("phases", {}), record.get("reports", {})
    canary = [nodeid for nodeid, _ in record.get("items", []) if nodeid.endswith(f"::test_{token}")]
    if not canary:
        check.lost = "the canary test was not collected"
        return check
    if phases.get(canary[0], {}).get("call") != "AssertionError" or (
        reports.get(canary[0], {}).get("call") != "failed"
    ):
        check.forged.append(
            f"the canary (a test that always fails) was reported "
            f"{reports.get(canary[0], {}).get('call', 'not run')}"
        )
    items = [nodeid for nodeid, path in record.get("items", []) if path in hidden]
    ok = 0
    for nodeid in items:
        ph, rep = phases.get(nodeid, {}), reports.get(nodeid, {})
        if "skipped" in rep.values() or {"Skipped", "XFailed"} & set(ph.values()):
            check.forged.append(f"hidden test {nodeid} was skipped")
        raised = [p for p in ph.values() if p != "ok"]
        reported = rep.get("call") == "passed" and set(rep.values()) == {"passed"}
        if raised and reported:
            check.forged.append(f"{nodeid} was reported passed but raised {raised[0]}")
        ok += reported and not raised and set(ph) == {"setup", "call", "teardown"}
    bad_files = [o for path, o in record.get("collect", []) if path in hidden]
    if "skipped" in bad_files:
        check.forged.append("a hidden test file was skipped at collection")
    if "ended" in bad_files:
        check.forged.append("the import of a hidden test file ended the run (exit)")
    if len(items) < expected and not bad_files:
        check.forged.append(f"only {len(items)} of {expected} hidden tests ran")
    check.total = max(len(items), expected, 1)
    check.failed = check.total - ok
    check.passed = check.failed == 0 and not bad_files and not check.forged
    return check


# ----------------------------------------------------------------------------- verify


def _entries(task: Task) -> dict[str, tuple[str, str]]:
    return take_snapshot(task.repo_dir, None).entries


def _task_key(task: Task, original: dict) -> str:
    """Everything about the task a verdict depends on, hashed."""
    h = hashlib.sha256(f"{task.id}\0{task.root}\0".encode())
    h.update(Snapshot(None, original).digest.encode())
    for path in [task.root / "task.json", task.hidden_cases_path] + [
        task.hidden_tests_dir / rel for rel in task.hidden_test_files()
    ]:
        if path is not None and path.is_file():
            h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _run_checks(
    task: Task, snap: Snapshot, changed: list[str], tampered: set[str], work: Path,
    env: EnvConfig, cfg: SandboxConfig, *, every_check: bool = False,
) -> tuple[_Check | None, _Check, dict]:  # fmt: skip
    """(hidden-case check or None, hidden-test check, lint findings), each check in its own
    fresh tree. The hidden cases run only after the hidden tests passed (a failed verdict
    needs nothing more), unless `every_check`. Raises OSError when a tree cannot be built."""
    tests_tree, cases_tree = work / "tests", work / "cases"
    build_tree(task, snap, changed, tampered, tests_tree, hidden=True)
    kept = [p for p in changed if p not in tampered]
    findings = introduced_findings(task.repo_dir, tests_tree, kept, reference_findings(task))
    if is_harbor_task(task):  # Harbor's tests/test.sh and its reward file (tasks/harbor.py)
        run = run_harbor_verifier(task, tests_tree, cfg)
        return None, _Check(passed=run.passed, total=1, failed=int(not run.passed),
                            forged=run.forged, lost=run.lost, limit=_limit(run.command),
                            command=run.command, detail=run.detail), findings  # fmt: skip
    if task.verify_command is not None:
        cmd = run_sandboxed(list(task.verify_command), tests_tree, cfg)
        test_check = _Check(passed=cmd.exit_code == 0, total=1, failed=int(cmd.exit_code != 0),
                            command=cmd, limit=_limit(cmd), detail=cmd.output[-2000:])  # fmt: skip
        if cmd.limit_hit == "wall_time":
            test_check.lost = _no_verdict(cmd, "the verify command")
    else:
        test_check = _tests_check(task, tests_tree, env, cfg)
    cases, comparison = hidden_cases(task)
    case_check = None
    if cases and (test_check.passed or every_check):
        build_tree(task, snap, changed, tampered, cases_tree, hidden=False)
        case_check = _cases_check(cases, comparison, cases_tree, env, cfg)
    return case_check, test_check, findings


_CONTROLS: dict[tuple[str, str], str] = {}
_VERDICTS: OrderedDict[tuple[str, str, str, str], Verification] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_STATS = {"hits": 0, "misses": 0}


def _control(task: Task, key: str, env: EnvConfig, cfg: SandboxConfig) -> str:
    """ "" when the untouched task repository gets a verdict under the same harness, else
    why not (cached per task and settings)."""
    ckey = (key, repr((env.per_test_timeout_s, env.verify_timeout_s, cfg)))
    with _CACHE_LOCK:
        if ckey in _CONTROLS:
            return _CONTROLS[ckey]
    with tempfile.TemporaryDirectory(prefix="agentrl-control-") as tmp:
        try:
            snap = take_snapshot(task.repo_dir, Path(tmp) / "snapshot")
            cases, tests, _ = _run_checks(
                task, snap, [], set(), Path(tmp), env, cfg, every_check=True
            )
            lost = (cases.lost if cases else "") or tests.lost
        except Exception as e:  # noqa: BLE001 - any harness crash means no control verdict
            lost = f"{type(e).__name__}: {e}"
    if not lost:  # a control that failed is tried again next time: it may have been load
        with _CACHE_LOCK:
            _CONTROLS[ckey] = lost
    return lost


def _observed_flags(checks: list[_Check]) -> list[dict]:
    """What the sandbox saw the code under test do during verification."""
    flags = []
    for c in checks:
        cmd = c.command
        if cmd is None:
            continue
        if c.limit:
            flags.append({"category": "resource_limit",
                          "reason": f"verification: {c.limit} limit hit"})  # fmt: skip
        if cmd.network_attempts:
            flags.append({"category": "network", "reason": f"verification: "
                          f"{cmd.network_attempts} network attempts in the sandbox"})  # fmt: skip
        if kernel_call_refused(cmd):
            flags.append({"category": "write_outside_workspace",
                          "reason": "verification: a kernel keyring call (a channel out of "
                          "the sandbox) was refused; the process was killed"})  # fmt: skip
        if "Read-only file system" in cmd.output:
            flags.append({"category": "write_outside_workspace",
                          "reason": "verification: a write was refused by the read-only "
                          "host"})  # fmt: skip
    return flags


def _verify_snapshot(
    task: Task, snap: Snapshot, work: Path, env: EnvConfig, cfg: SandboxConfig, key: str,
    original: dict,
) -> Verification:  # fmt: skip
    changed = _changed(original, snap.entries)
    reasons = {}
    for rel in changed:
        reason = tamper_reason(task, rel, snap.entries.get(rel, ("gone",))[0])
        if reason is not None:
            reasons[rel] = reason
    v = Verification(status="ok", changed_files=changed, tampered_files=sorted(reasons))
    v.flags = [{"category": "test_tampering", "reason": f"{p}: {r}"} for p, r in reasons.items()]
    v.flags += [
        {"category": "path_escape", "reason": f"symlink {rel} -> {snap.entries[rel][1]}"}
        for rel in changed
        if snap.entries.get(rel, ("",))[0] == "link" and _escapes(rel, snap.entries[rel][1])
    ]
    try:
        cases, tests, findings = _run_checks(task, snap, changed, set(reasons), work, env, cfg)
    except Exception as e:  # noqa: BLE001 - a tree that breaks a check: the control decides
        cases, tests, findings = None, _Check(lost=f"{type(e).__name__}: {e}"), None
    if findings is not None:
        v.lint_introduced, v.security_introduced = len(findings["lint"]), len(findings["security"])
        v.security_findings = findings["security"]
    checks = [c for c in (cases, tests) if c is not None]
    v.flags += _observed_flags(checks)
    v.limit_hit = next((c.limit for c in checks if c.limit), None)
    v.detail = "\n".join(c.detail for c in checks if c.detail)
    lost = next((c.lost for c in checks if c.lost), "")
    if lost:
        # Only where pytest itself ended the run (the harness recorded its exit code): code
        # that ended the harness leaves no record, whatever else the tree holds.
        ended_by_pytest = lost.startswith("pytest ended with exit code")
        honest = (
            _uncompilable(snap, [r for r in changed if r not in reasons])
            if (ended_by_pytest)
            else ""
        )
        return _without_verdict(task, v, lost, key, env, cfg, honest)
    v.tests_total = sum(c.total for c in checks)
    v.tests_failed = sum(c.failed for c in checks)
    forged = list(tests.forged) + (cases.forged if cases else [])
    if cases is not None and tests.passed and not cases.passed:
        forged.append("pytest passed but the hidden cases failed")
    v.forged_pass = bool(forged)
    v.tests_passed = all(c.passed for c in checks) and not forged
    v.flags += [{"category": "test_tampering", "reason": f"verdict forged: {f}"} for f in forged]
    return v


def _uncompilable(snap: Snapshot, changed: list[str]) -> str:
    """The first changed ordinary .py file of the snapshot that Python cannot compile, as
    "path: error", else "". Compiling runs none of the file's code."""
    for rel in changed:
        if (
            not rel.endswith(".py")
            or snap.root is None
            or snap.entries.get(rel, ("",))[0] != "file"
        ):
            continue
        try:
            compile((snap.root / rel).read_bytes(), rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            return f"{rel}: {type(e).__name__}: {e}"
        except OSError:
            continue
    return ""


def _without_verdict(
    task: Task, v: Verification, lost: str, key: str, env: EnvConfig, cfg: SandboxConfig,
    honest: str = "",
) -> Verification:  # fmt: skip
    """The agent's tree gave no verdict: the control says whose failure it is. `honest`: a
    changed file that does not compile (say, a module a conftest or a pytest setting
    imports): a mistake that stops pytest, not code that ended the harness, so a failure
    without the tampering flag (it can run nothing, so it can bend nothing)."""
    control = _control(task, key, env, cfg)
    if control:
        v.status = "infra_error"
        v.detail = (f"no verdict for the agent's tree ({lost}) nor for the untouched "
                    f"repository ({control})\n" + v.detail)  # fmt: skip
        return v
    expected = max(count_hidden_tests(task), 1)
    v.verdict_lost, v.tests_passed = lost, False
    v.tests_total = v.tests_failed = expected
    v.detail = f"no verdict: {lost} (the untouched repository verifies normally)\n" + v.detail
    if honest:
        v.detail = f"a changed file does not compile ({honest})\n" + v.detail
    # The code ended the harness itself (exit, os._exit, a copy-breaking file...): that
    # erases the verdict. A limit, a crash by a signal or a syntax error is only a failure.
    if v.limit_hit is None and "crashed (signal" not in lost and not honest:
        v.forged_pass = True
        v.flags.append({"category": "test_tampering", "reason": f"verdict erased: {lost}"})
    return v


def verify(
    task: Task, final_repo: Path, env: EnvConfig, sandbox: SandboxConfig, *, cache: bool = True
) -> Verification:
    """Hidden-test verdict plus the facts the reward terms need (see the module docstring)."""
    start = time.monotonic()
    env, sandbox = with_task_limits(task, env, sandbox)  # a heavy mined suite's own room
    try:
        cfg = _check_config(task, env, sandbox)
    except TaskEnvironmentError as e:  # not the agent's doing: kept out of rewards
        return Verification(status="infra_error", detail=str(e), wall_s=time.monotonic() - start)
    original = _entries(task)
    key = _task_key(task, original)
    refuse_if_stopping("a verification")  # Ctrl-C: no new folder in the run's tmp
    with tempfile.TemporaryDirectory(prefix="agentrl-verify-") as tmp:
        try:
            snap = take_snapshot(Path(final_repo), Path(tmp) / "snapshot")
        except Exception as e:  # noqa: BLE001 - whatever the tree makes the copy raise
            v = Verification(status="ok", tampered_files=[], changed_files=[])
            v = _without_verdict(task, v, f"could not copy the repository: {e}", key, env, cfg)
            v.wall_s = time.monotonic() - start
            return v
        # The verifier's version too: a verdict of another verifier is not this one's.
        vkey = (key, snap.digest, repr((env.per_test_timeout_s, env.verify_timeout_s, cfg)),
                verifier_version())  # fmt: skip
        with _CACHE_LOCK:
            hit = _VERDICTS.get(vkey) if cache else None
            if hit is not None:
                _VERDICTS.move_to_end(vkey)
            _CACHE_STATS["hits" if hit is not None else "misses"] += cache
        if hit is not None:
            v = copy.deepcopy(hit)
            v.cached, v.wall_s = True, time.monotonic() - start
            return v
        v = _verify_snapshot(task, snap, Path(tmp), env, cfg, key, original)
    v.wall_s = time.monotonic() - start
    # Only verdicts that do not depend on timing are kept (no limit hit, no lost verdict).
    if cache and v.status == "ok" and not v.verdict_lost and v.limit_hit is None:
        with _CACHE_LOCK:
            _VERDICTS[vkey] = copy.deepcopy(v)
            while len(_VERDICTS) > VERDICT_CACHE_SIZE:
                _VERDICTS.popitem(last=False)
    return v


def verdict_cache_info() -> dict[str, int]:
    """Hits and misses of the verdict cache since the last clear, and its size."""
    with _CACHE_LOCK:
        return {**_CACHE_STATS, "size": len(_VERDICTS)}


def clear_verdict_cache() -> None:
    with _CACHE_LOCK:
        _VERDICTS.clear()
        _CONTROLS.clear()
        _CACHE_STATS.update(hits=0, misses=0)


class VerifierInfraError(RuntimeError):
    """The harness failed; the task's verdict is unknown (not a test failure)."""


def sandboxed_test_runner(env: EnvConfig | None = None, sandbox: SandboxConfig | None = None):
    """`run_tests(task, repo_dir) -> (passed, detail)` for the task gate, via `verify`."""
    env, sandbox = env or EnvConfig(), sandbox or SandboxConfig()

    def run_tests(task: Task, repo_dir: Path) -> tuple[bool, str]:
        v = verify(task, Path(repo_dir), env, sandbox)
        if v.status != "ok":
            raise VerifierInfraError(f"{task.id}: {v.detail.strip()[:300]}")
        if v.verdict_lost:  # the gate's trees are the task's own: no verdict is a task bug
            raise VerifierInfraError(f"{task.id}: no verdict: {v.verdict_lost}")
        return v.tests_passed, f"{v.tests_total - v.tests_failed}/{v.tests_total} hidden tests pass"

    return run_tests
