"""Mining tasks from a real repository: `agentrl tasks mine --repo PATH` (SWE-smith's recipe).

For one Python repository with a pytest suite:

1. **Setup** (any failure here is the repository's one-line error; nothing is written):
   find its test files and source modules, attach its environment (a Python version and
   the requirements given, components/tasks/environments.py) and build it, then run the
   whole suite once in the sandbox with that interpreter under a call tracer. Every test
   must pass (skips allowed): no tests, a failing test, a suite that runs past
   `suite_timeout_s` or a module that cannot be imported (a missing dependency) is an error.
   The trace says which functions of which modules the suite calls, and from which test files.
2. **Candidates**: every edit of the bug operators (components/tasks/mutations.py) that
   falls inside a covered function, written into the module's own text with only the
   changed code rewritten (components/env/fixes.py: edit_in_place), so the reverse patch is
   the one line a developer would fix. The order is a seeded shuffle, interleaved across
   functions (one candidate per function per round), so the same repository and seed try
   the same candidates in the same order.
3. **The gate, per candidate**: the covering test files run on the mutant in the sandbox;
   a mutant is kept only if at least one test that passed before now fails, none of them
   hangs (the per-test timeout) and every test file still imports. Tests of those files
   that were skipped before are cut out of the hidden copies (the verifier counts a skipped
   hidden test as a forged verdict); a mutant whose failing test has skipped instances, or
   whose skipped tests cannot be cut out, is dropped.
   **Hidden cases** (`derive_hidden_cases`): the covering tests run once more on the
   unmutated repository with a tracer on the mutated function, recording each call's
   arguments and its (correct) result as plain-value reprs; the verifier's own case runner
   must reproduce them on the unmutated tree and at least one must fail on the mutant. A
   mutant with no such case (a method, arguments or results that are not plain values,
   no call that tells the bug from the fix) is dropped with the reason: its verdict could
   only come from pytest in the process of the code under test, which that code can
   forge (a printed verdict line). Candidates in methods are passed over untried
   (`methods_passed_over`): they could never get cases. A kept mutant becomes a
   task folder (docs/tasks.md): `repo/` = the mutated repository (every test visible),
   `hidden_tests/` = the test files that failed, verbatim, `hidden_cases.json` = the
   recorded cases, `reference.patch` = the reverse
   edit, the environment attached, family = `<repository>/<module>`. The task then goes
   through the data gate (components/tasks/gate.py: check_task with the sandboxed
   verifier) and is removed again if it fails it.
4. **Bounds**: at most `max_candidates` candidates and `max_tasks` tasks (both decide what
   is mined: deterministic), and a wall-clock `budget_s` per repository as a safety net
   (the report says when it, not the counts, ended the run).

Splits: `split="auto"` puts each family (repository + module) in train, val or test by a
salted hash of its name, so val and test hold modules never seen in train; a fixed split
puts the whole repository there (a held-out repository).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from components import pyast
from components.env.fixes import edit_in_place
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.process import run_sandboxed
from components.tasks.environments import (
    PrepareConfig,
    TaskEnvironmentError,
    build_environment,
    harness_versions,
)
from components.tasks.gate import RunTests, check_task
from components.tasks.mutations import OPERATORS, apply_edit, get_operator, normalize
from components.tasks.task import (
    ENVIRONMENT_PYTHON_MIN,
    HIDDEN_CASES_FILE,
    SPLITS,
    EditableInstall,
    Task,
    TaskEnvironment,
    TaskFormatError,
    TaskLimits,
    TaskMetadata,
    load_task,
    parse_editable,
    task_spec,
)
from components.typed_config import doc
from components.verifier.hidden_cases import CASE_RUNNER, CASES_MARKER

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


class MineError(RuntimeError):
    """The repository cannot be mined (one line: what is wrong with it)."""


@dataclass(frozen=True)
class MineConfig:
    seed: int = field(default=0, metadata=doc("seed of the candidate order"))
    max_candidates: int = field(default=60, metadata=doc("mutants tried per repository"))
    max_tasks: int = field(default=20, metadata=doc("tasks kept per repository"))
    max_per_function: int = field(default=2, metadata=doc("tasks kept per function"))
    budget_s: float = field(default=900.0, metadata=doc("wall-clock bound per repository"))
    suite_timeout_s: float = field(
        default=300.0, metadata=doc("bound on one run of the repository's tests (a hang)")
    )
    per_test_timeout_s: float = field(
        default=10.0,
        metadata=doc("pytest-timeout per test; kept in each task's `limits` for verification"),
    )
    memory_mb: int = field(
        default=0,
        metadata=doc(
            "address space per test process, MiB (0 = the sandbox's); kept in each task's "
            "`limits` for verification"
        ),
    )
    baseline_runs: int = field(
        default=2,
        metadata=doc("runs of the unmutated suite: a test whose outcome differs is flaky"),
    )
    deselect_failing: bool = field(
        default=True,
        metadata=doc(
            "deselect tests that fail, hang or are flaky before mutation (and test files "
            "that do not import), with the reason in the report; False: refuse the repository"
        ),
    )
    python: str = field(default="3.11", metadata=doc("the environment's Python version"))
    split: str = field(
        default="auto", metadata=doc("auto (by family hash) | train | val | test (whole repo)")
    )
    val_fraction: float = field(default=0.2, metadata=doc("auto: share of families in val"))
    test_fraction: float = field(default=0.2, metadata=doc("auto: share of families in test"))
    split_salt: str = field(default="mined-v1", metadata=doc("salt of the family hash"))
    operators: tuple[str, ...] = field(default=(), metadata=doc("operator names (() = all)"))
    max_hidden_cases: int = field(
        default=64, metadata=doc("hidden cases kept per task (recorded calls, distinct args)")
    )

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "max_candidates",
            "max_tasks",
            "max_per_function",
            "baseline_runs",
            "max_hidden_cases",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.memory_mb, bool)
            or not isinstance(self.memory_mb, int)
            or not (self.memory_mb == 0 or self.memory_mb >= 32)
        ):
            problems.append(f"memory_mb must be 0 or an integer >= 32, got {self.memory_mb!r}")
        for name in ("budget_s", "suite_timeout_s", "per_test_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0 < value < float("inf"))
            ):
                problems.append(f"{name} must be a positive number, got {value!r}")
        fractions = (self.val_fraction, self.test_fraction)
        if not all(isinstance(f, int | float) and 0 <= f <= 1 for f in fractions) or (
            sum(fractions) > 1
        ):
            problems.append("val_fraction and test_fraction must be in [0, 1] with sum <= 1")
        parts = self.python.split(".") if isinstance(self.python, str) else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            problems.append(f"python must be MAJOR.MINOR, got {self.python!r}")
        elif tuple(int(p) for p in parts) < ENVIRONMENT_PYTHON_MIN:
            least = ".".join(map(str, ENVIRONMENT_PYTHON_MIN))
            problems.append(
                f"python must be {least} or newer (task environments), got {self.python}"
            )
        if self.split not in ("auto", *SPLITS):
            problems.append(f"split must be auto or one of {', '.join(SPLITS)}, got {self.split!r}")
        if problems:
            raise ValueError("MineConfig: " + "; ".join(problems))
        for name in self.operators:
            get_operator(name)


@dataclass
class MineReport:
    repository: str
    ok: bool = False
    error: str = ""  # the one-line reason nothing was mined
    source_modules: int = 0
    test_files: int = 0
    tests: int = 0
    covered_functions: int = 0  # functions the suite calls that hold a candidate
    candidates: int = 0  # edits inside covered functions
    tried: int = 0
    kept: list[str] = field(default_factory=list)  # task ids
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count
    drops: list[dict] = field(default_factory=list)  # {"candidate", "reason"}
    # test node id or test file -> why it was left out before mutation (fails, hangs, flaky)
    deselected: dict[str, str] = field(default_factory=dict)
    distribution: str = ""  # NAME==VERSION installed editable ("" = path only)
    stopped_by: str = ""  # "budget_s" when the clock ended the run, else ""
    environment: dict = field(default_factory=dict)
    setup_s: float = 0.0
    mutant_tests_s: float = 0.0
    gate_s: float = 0.0
    cases_s: float = 0.0  # recording and checking the hidden cases of kept mutants
    methods_passed_over: int = 0  # candidates in methods, left untried: no hidden cases
    seconds: float = 0.0

    def line(self) -> str:
        if not self.ok:
            return f"MINE ERROR {self.repository}: {self.error}"
        return (f"mined {self.repository}: {len(self.kept)} task(s) from {self.tried} "
                f"mutant(s) tried ({self.candidates} candidates) in {self.seconds:.1f}s")  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    module: str  # path relative to the repository root
    function: str
    operator: str
    index: int
    lineno: int

    @property
    def name(self) -> str:
        return f"{self.module}:{self.function}:{self.operator}#{self.index}"


@dataclass
class Repo:
    """What setup found out about a repository (a prepared copy lives in `root`)."""

    name: str
    root: Path
    test_files: list[str]
    modules: list[str]
    env: TaskEnvironment
    python_env: str
    src_layout: bool
    tests: dict[str, str]  # nodeid -> outcome at baseline ("deselected": left out)
    coverage: dict[str, dict[str, list[str]]]  # module -> function -> test files
    deselected: dict[str, str] = field(default_factory=dict)  # nodeid or file -> reason


# ----------------------------------------------------------------------------- discovery


def _walk_py(root: Path) -> list[str]:
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
    files = [f for f in _walk_py(root) if not _vendored(f)]
    tests = [f for f in files if is_test_file(f)]
    modules = [
        f for f in files
        if not is_test_file(f) and not _in_test_dir(f)
        and os.path.basename(f) not in ("conftest.py", "setup.py", "noxfile.py", "__main__.py")
    ]  # fmt: skip
    return tests, modules


def _top_modules(root: Path, modules: list[str]) -> set[str]:
    tops = set()
    for m in modules:
        parts = Path(m).parts
        if parts[0] == "src" and len(parts) > 1:
            parts = parts[1:]
        tops.add(parts[0].removesuffix(".py"))
    return tops


# ----------------------------------------------------------------------------- running tests

# Runs pytest in the sandbox and writes what happened to a JSON file: each test's outcome
# and, with tracing, which functions of the repository each test file called.
RUNNER = r"""
import json, os, sys, threading
import pytest

out, trace = sys.argv[1], sys.argv[2] == "trace"
args = sys.argv[3:]
sys.path[0] = os.getcwd()  # as `python -m pytest` in the repository root has it
root = os.getcwd() + os.sep
tools = os.path.join(root, ".agentrl-mine")
outcomes, collect_errors, covered, current = {}, [], {}, [None]
seen = {}

def profile(frame, event, arg):
    if event != "call":
        return
    code = frame.f_code
    f = code.co_filename
    keep = seen.get(f)
    if keep is None:
        keep = seen[f] = f.startswith(root) and not f.startswith(tools)
    if keep and current[0] is not None:
        covered.setdefault((f[len(root):], code.co_firstlineno, code.co_name), set()).add(current[0])

class Recorder:
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid, location):
        current[0] = nodeid.split("::")[0]

    def pytest_collectstart(self, collector):
        current[0] = getattr(collector, "nodeid", "").split("::")[0] or None

    def pytest_runtest_logreport(self, report):
        old = outcomes.get(report.nodeid, "passed")
        text = report.longreprtext if report.failed else ""
        now = report.outcome
        if report.failed and "Timeout" in text:
            now = "timeout"
        rank = {"passed": 0, "skipped": 1, "failed": 2, "timeout": 3}
        outcomes[report.nodeid] = max(old, now, key=rank.get)

    def pytest_collectreport(self, report):
        if report.failed:
            collect_errors.append([report.nodeid, report.longreprtext[-600:]])

if trace:
    threading.setprofile(profile)
    sys.setprofile(profile)
rc = pytest.main(args, plugins=[Recorder()])
sys.setprofile(None)
with open(out, "w") as fh:
    json.dump({"rc": int(rc), "tests": outcomes, "collect_errors": collect_errors,
               "covered": [[f, line, name, sorted(t)] for (f, line, name), t in covered.items()]},
              fh)
"""


@dataclass
class SuiteRun:
    rc: int
    tests: dict[str, str]
    collect_errors: list[list[str]]
    covered: list[list]
    timed_out: bool
    output: str


def run_suite(tree: Path, test_files: list[str], python_env: str, sandbox: SandboxConfig,
              config: MineConfig, *, trace: bool, deselect: tuple[str, ...] = ()) -> SuiteRun:  # fmt: skip
    """The repository's tests (these files, less the `deselect`ed node ids) in the sandbox
    with the environment's python."""
    tools = tree / TOOLS
    tools.mkdir(exist_ok=True)
    (tools / "runner.py").write_text(RUNNER)
    out = tools / "result.json"
    out.unlink(missing_ok=True)
    argv = ["python", "-B", f"{TOOLS}/runner.py", str(out), "trace" if trace else "plain",
            "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--timeout={config.per_test_timeout_s:g}",
            *(f"--deselect={n}" for n in deselect), *test_files]  # fmt: skip
    cfg = replace(sandbox, python_env=python_env, wall_time_s=config.suite_timeout_s,
                  cpu_time_s=max(sandbox.cpu_time_s, int(config.suite_timeout_s) + 1),
                  memory_mb=config.memory_mb or sandbox.memory_mb,
                  max_output_bytes=max(sandbox.max_output_bytes, 1 << 16))  # fmt: skip
    cmd = run_sandboxed(argv, tree, cfg, workspace=tree)
    data = json.loads(out.read_text()) if out.is_file() else {}
    return SuiteRun(rc=int(data.get("rc", -1)), tests=data.get("tests", {}),
                    collect_errors=data.get("collect_errors", []),
                    covered=data.get("covered", []),
                    timed_out=cmd.limit_hit == "wall_time", output=cmd.output)  # fmt: skip


# Runs the covering tests on the unmutated repository and records every call of one
# function: its arguments when it is entered (before it can change them) and what it
# returned, each as a repr that reads back as the same plain value, else the call is left
# out with the reason. A call that raised (or returned None after an exception inside it:
# the two look alike to a tracer) is left out too.
CALLS_RUNNER = r"""
import ast, json, os, sys, threading
import pytest

out, target, first_lines, function = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
args = sys.argv[5:]
sys.path[0] = os.getcwd()
target = os.path.join(os.getcwd(), target)
first_lines = {int(x) for x in first_lines.split(",")}
PLAIN = (int, float, complex, str, bytes, bool, type(None))
GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # generator, coroutine, async generator
calls, skipped, LIMIT = [], {}, 5000


def plain(x, depth=0):
    t = type(x)
    if depth > 32:
        return False
    if t in PLAIN:
        return True
    if t in (list, tuple, set, frozenset):
        return all(plain(y, depth + 1) for y in x)
    if t is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
    return False


def literal(x):
    # the repr of a plain value that reads back as itself, else None
    if not plain(x):
        return None
    try:
        text = repr(x)
        return text if len(text) <= 4000 and repr(ast.literal_eval(text)) == text else None
    except Exception:
        return None


def skip(why):
    skipped[why] = skipped.get(why, 0) + 1


def arguments(frame):
    code, loc = frame.f_code, frame.f_locals
    if code.co_kwonlyargcount:
        return None, "keyword-only parameters (the case runner passes arguments by position)"
    names = code.co_varnames
    n = code.co_argcount
    values = [loc[name] for name in names[:n]]
    extra = n
    if code.co_flags & 0x04:  # *args
        values += list(loc[names[extra]])
        extra += 1
    if code.co_flags & 0x08 and loc[names[extra]]:  # **kwargs given
        return None, "called with **kwargs"
    text = literal(tuple(values))
    return text, "" if text is not None else "arguments are not plain values"


def tracer(frame, event, arg):
    code = frame.f_code
    if (code.co_filename != target or code.co_qualname != function
            or code.co_firstlineno not in first_lines):
        return None
    if code.co_flags & GENERATOR_FLAGS:
        skip("a generator or coroutine (its calls return no value)")
        return None
    if len(calls) >= LIMIT:
        return None
    text, why = arguments(frame)
    if text is None:
        skip(why)
        return None
    state = {"raised": False}

    def local(frame, event, arg):
        if event == "exception":
            state["raised"] = True
        elif event == "return":
            if state["raised"] and arg is None:
                skip("raised an exception")
            else:
                result = literal(arg)
                if result is None:
                    skip("result is not a plain value")
                else:
                    calls.append([text, result])
        return local

    return local


threading.settrace(tracer)
sys.settrace(tracer)
rc = pytest.main(args)
sys.settrace(None)
with open(out, "w") as fh:
    json.dump({"rc": int(rc), "calls": calls, "skipped": skipped}, fh)
"""


def recorded_calls(repo: Repo, cand: Candidate, tests: list[str], sandbox: SandboxConfig,
                   config: MineConfig) -> tuple[list[tuple[str, str]], dict[str, int]]:  # fmt: skip
    """(args repr, result repr) of every call of the candidate's function while its covering
    tests run on the unmutated repository, and why other calls were left out."""
    node = next(n for name, n in _functions(pyast.parse((repo.root / cand.module).read_text()))
                if name == cand.function)  # fmt: skip
    tools = repo.root / TOOLS
    tools.mkdir(exist_ok=True)
    (tools / "calls.py").write_text(CALLS_RUNNER)
    out = tools / "calls.json"
    out.unlink(missing_ok=True)
    argv = ["python", "-B", f"{TOOLS}/calls.py", str(out), cand.module,
            ",".join(map(str, sorted(_first_lines(node)))), cand.function,
            "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--timeout={config.per_test_timeout_s:g}",
            *(f"--deselect={n}" for n in repo.deselected if "::" in n), *tests]  # fmt: skip
    cfg = replace(sandbox, python_env=repo.python_env, wall_time_s=config.suite_timeout_s,
                  cpu_time_s=max(sandbox.cpu_time_s, int(config.suite_timeout_s) + 1),
                  memory_mb=config.memory_mb or sandbox.memory_mb)  # fmt: skip
    run_sandboxed(argv, repo.root, cfg, workspace=repo.root)
    data = json.loads(out.read_text()) if out.is_file() else {}
    out.unlink(missing_ok=True)
    return [tuple(c) for c in data.get("calls", [])], data.get("skipped", {})


def run_cases(tree: Path, module: str, function: str, args: list[str], python_env: str,
              sandbox: SandboxConfig, timeout_s: float) -> list[str | None]:  # fmt: skip
    """The repr each call returns in `tree` (None: it raised or gave no plain value), by the
    verifier's own hidden-case runner."""
    token = hashlib.sha256(os.urandom(16)).hexdigest()[:16]
    tools = tree / TOOLS
    tools.mkdir(exist_ok=True)
    (tools / "cases.py").write_text(CASE_RUNNER)
    (tools / "args.json").write_text(json.dumps([[module, function, a] for a in args]))
    argv = ["python", "-s", "-P", "-B", f"{TOOLS}/cases.py", token, f"{TOOLS}/args.json",
            f"{timeout_s:g}"]  # fmt: skip
    wall = 30 + timeout_s * len(args)
    cfg = replace(sandbox, python_env=python_env, wall_time_s=wall,
                  cpu_time_s=max(sandbox.cpu_time_s, int(wall) + 1),
                  max_output_bytes=max(sandbox.max_output_bytes, 1 << 20))  # fmt: skip
    cmd = run_sandboxed(argv, tree, cfg, workspace=tree)
    marker = f"{CASES_MARKER} {token} "
    at = cmd.output.rfind(marker)
    try:
        results = json.loads(cmd.output[at + len(marker) :].splitlines()[0])["results"]
    except (ValueError, IndexError, KeyError, TypeError):
        return [None] * len(args)
    return [r.get("repr") if isinstance(r, dict) else None for r in results][: len(args)]


# long: record, filter and check the cases, each way out with its reason
def derive_hidden_cases(repo: Repo, cand: Candidate, buggy: str, work: Path,
                        sandbox: SandboxConfig, config: MineConfig) -> dict | str:  # fmt: skip
    """hidden_cases.json for a kept mutant (the generated tasks' format: module file,
    function, [{"args", "expected"}] as reprs): the function's calls while its covering tests
    run on the unmutated repository, with the results it gave then. Kept: distinct
    arguments that always gave the same result, that the verifier's case runner reproduces
    on the unmutated tree; at least one must fail on the mutant, or the cases could not
    tell the bug from the fix (a verdict line printed by the mutant would still pass). A
    string says why there are none."""
    if "." in cand.function:
        return "no hidden cases: a method or nested function (cases call module functions)"
    sandbox = replace(sandbox, memory_mb=config.memory_mb or sandbox.memory_mb)
    calls, skipped = recorded_calls(repo, cand, covering_tests(repo, cand), sandbox, config)
    results: dict[str, set[str]] = {}
    for args, result in calls:
        results.setdefault(args, set()).add(result)
    stable = [(a, next(iter(r))) for a, r in results.items() if len(r) == 1]
    if not stable:
        why = max(skipped, key=skipped.get) if skipped else "the tests never call it directly"
        return f"no hidden cases: no call with plain, repeatable arguments and result ({why})"
    stable = stable[: config.max_hidden_cases * 4]
    args = [a for a, _ in stable]
    timeout = config.per_test_timeout_s
    clean = run_cases(repo.root, cand.module, cand.function, args, repo.python_env, sandbox,
                      timeout)  # fmt: skip
    stable = [(a, e) for (a, e), got in zip(stable, clean, strict=True) if got == e]
    tree = work / "mutant"
    shutil.rmtree(tree, ignore_errors=True)
    _copy_repo(repo.root, tree)
    (tree / cand.module).write_text(buggy)
    on_mutant = run_cases(tree, cand.module, cand.function, [a for a, _ in stable],
                          repo.python_env, sandbox, timeout)  # fmt: skip
    telling = [c for c, got in zip(stable, on_mutant, strict=True) if got != c[1]]
    if not telling:
        return "no hidden cases: none of the recorded calls tells the bug from the fix"
    # Every case that tells them apart, then the others, up to the bound (in test order).
    kept = telling + [c for c in stable if c not in telling]
    kept = sorted(kept[: config.max_hidden_cases], key=stable.index)
    return {"module": cand.module, "function": cand.function,
            "cases": [{"args": a, "expected": e} for a, e in kept]}  # fmt: skip


def _missing_module(text: str) -> str | None:
    m = re.search(r"No module named '([^']+)'", text)
    return m.group(1) if m else None


def _baseline_error(run: SuiteRun, config: MineConfig) -> str:
    """Why a repository's unmutated suite cannot be mined from ("" = it can)."""
    if run.timed_out:
        return f"its tests hang (did not finish in {config.suite_timeout_s:g}s)"
    for nodeid, text in run.collect_errors:
        missing = _missing_module(text)
        if missing:
            return f"missing dependency: No module named {missing!r} (in {nodeid or 'collection'})"
    if run.collect_errors:
        nodeid, text = run.collect_errors[0]
        last = text.strip().splitlines()[-1] if text.strip() else "?"
        return f"{len(run.collect_errors)} test file(s) fail to import before mutation ({nodeid}: {last})"
    if run.rc == -1:
        tail = run.output.strip().splitlines()[-1:] or ["no output"]
        return f"the test run ended without a result ({tail[0][:200]})"
    if run.rc in (2, 3, 4):  # interrupted, internal error, usage error
        lines = [line for line in run.output.strip().splitlines() if line.strip()]
        last = next((x for x in reversed(lines) if "Error" in x or "error" in x), "?")
        return f"pytest ended with exit code {run.rc} before mutation ({last.strip()[:200]})"
    bad = sorted(n for n, o in run.tests.items() if o in ("failed", "timeout"))
    if bad:
        return f"{len(bad)} test(s) fail before mutation (e.g. {bad[0]})"
    if run.tests and all(o == "deselected" for o in run.tests.values()):
        return f"every test fails, hangs or is flaky before mutation (e.g. {min(run.tests)})"
    if not any(o == "passed" for o in run.tests.values()):
        return "no tests collected" if not run.tests else "every test is skipped"
    if run.rc not in (0,) and not any(o == "deselected" for o in run.tests.values()):
        return f"pytest exited with code {run.rc} before mutation"
    return ""


def _collect_reason(text: str) -> str:
    last = text.strip().splitlines()[-1] if text.strip() else "?"
    last = last.removeprefix("E ").strip()  # pytest's error-line prefix
    return f"does not import before mutation ({last[:160]})"


def baseline(root: Path, tests: list[str], python_env: str, sandbox: SandboxConfig,
             config: MineConfig) -> tuple[SuiteRun, list[str], dict[str, str]]:  # fmt: skip
    """The traced run of the unmutated suite, the test files kept and what was deselected
    (node id or file -> reason): test files that do not import, tests that fail or hang,
    tests whose outcome changes over `baseline_runs` runs. Raises MineError when the suite
    as a whole cannot be mined from (it hangs, pytest cannot run, nothing passes), or, with
    `deselect_failing` off, on the first test that is not green."""
    run = run_suite(root, tests, python_env, sandbox, config, trace=True)
    deselected: dict[str, str] = {}
    if run.collect_errors and config.deselect_failing and not run.timed_out:
        broken = {nodeid.split("::")[0]: text for nodeid, text in run.collect_errors}
        # A missing dependency is the caller's to give (--requirements), not the library's
        # flaw; a conftest or plugin that breaks is not one test file's.
        missing = any(_missing_module(text) for text in broken.values())
        if missing or "" in broken or not set(broken) <= set(tests):
            raise MineError(_baseline_error(run, config))
        deselected.update({f: _collect_reason(t) for f, t in sorted(broken.items())})
        tests = [t for t in tests if t not in broken]
        if not tests:
            raise MineError(
                f"no test file imports before mutation ({next(iter(deselected.values()))})"
            )
        run = run_suite(root, tests, python_env, sandbox, config, trace=True)
    if (
        config.deselect_failing
        and not run.timed_out
        and not run.collect_errors
        and run.rc in (0, 1)
    ):
        limit = f"{config.per_test_timeout_s:g}s"
        for nodeid, outcome in sorted(run.tests.items()):
            if outcome == "failed":
                deselected[nodeid] = "fails before mutation"
            elif outcome == "timeout":
                deselected[nodeid] = f"hangs before mutation (past the {limit} per-test timeout)"
        for k in range(2, config.baseline_runs + 1):
            again = run_suite(root, tests, python_env, sandbox, config, trace=False,
                              deselect=tuple(n for n in deselected if "::" in n))  # fmt: skip
            if again.timed_out or again.collect_errors or again.rc not in (0, 1, 5):
                raise MineError(f"the suite is not repeatable: run {k} " + (
                    _baseline_error(again, config) or f"ended with exit code {again.rc}"))  # fmt: skip
            for nodeid, outcome in sorted(again.tests.items()):
                first = run.tests.get(nodeid)
                if (
                    nodeid not in deselected
                    and outcome != first
                    and "skipped" not in (outcome, first)
                ):
                    deselected[nodeid] = (
                        f"flaky before mutation: {first} in run 1, {outcome} in run {k}"
                    )
        for nodeid in deselected:
            if nodeid in run.tests:
                run.tests[nodeid] = "deselected"
    error = _baseline_error(run, config)
    if error:
        raise MineError(error)
    return run, tests, deselected


# ----------------------------------------------------------------------------- setup


def _copy_repo(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=False,
                    ignore=shutil.ignore_patterns(*SKIP_DIRS - {"docs", "doc", "examples",
                                                                "benchmarks"}, "*.pyc"))  # fmt: skip


def _add_src_path(root: Path) -> None:
    """src/ layout: the repository's packages are not at its root, where the tests' python
    finds them; a root conftest.py (protected, like every pytest configuration) adds src/."""
    conftest = root / "conftest.py"
    head = (f"{SRC_LAYOUT_NOTE}\nimport os as _os, sys as _sys\n"
            "_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "
            "'src'))\n")  # fmt: skip
    old = conftest.read_text() if conftest.is_file() else ""
    conftest.write_text(head + ("\n" + old if old else ""))


def _coverage(run: SuiteRun, modules: list[str]) -> dict[str, dict[str, list[str]]]:
    """module -> covered function (qualified name) -> test files that call it."""
    wanted = set(modules)
    by_module: dict[str, dict[int, set[str]]] = {}
    for f, line, _name, tests in run.covered:
        if f in wanted:
            by_module.setdefault(f, {}).setdefault(int(line), set()).update(tests)
    return {m: {str(k): sorted(v) for k, v in lines.items()} for m, lines in by_module.items()}


# long: the setup steps in the order a reader checks them, each with its one-line error
def setup_repo(repo: Path, work: Path, requirements: tuple[str, ...], config: MineConfig,
               sandbox: SandboxConfig, prepare: PrepareConfig) -> Repo:  # fmt: skip
    """Check, copy and baseline a repository (raises MineError with its one-line reason)."""
    repo = repo.resolve()
    if not repo.is_dir():
        raise MineError(f"not a folder: {repo}")
    tests, modules = discover(repo)
    if not tests:
        raise MineError("no test files (test_*.py or *_test.py)")
    if not modules:
        raise MineError("no source modules outside the tests")
    clash = _top_modules(repo, modules) & HARNESS_MODULES
    if clash:
        raise MineError(f"its package {sorted(clash)[0]!r} would collide with the test harness")
    root = work / "repo"
    _copy_repo(repo, root)
    src_layout = (root / "src").is_dir() and all(Path(m).parts[0] == "src" for m in modules
                                                 if "/" in m)  # fmt: skip
    if src_layout:
        _add_src_path(root)
    name, version = distribution(repo)
    editable = EditableInstall(path="src" if src_layout else ".", name=name, version=version)
    env = TaskEnvironment(python=config.python, requirements=requirements, editable=editable)
    try:
        built = build_environment(env, replace(prepare, cache_dir=sandbox.environments_dir))
    except TaskEnvironmentError as e:
        raise MineError(f"environment: {e}") from e
    run, tests, deselected = baseline(root, tests, built.path, sandbox, config)
    coverage = _coverage(run, modules)
    return Repo(name=repo.name, root=root, test_files=tests, modules=modules, env=env,
                python_env=built.path, src_layout=src_layout, tests=run.tests,
                coverage=coverage, deselected=deselected)  # fmt: skip


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


# ----------------------------------------------------------------------------- candidates


def _functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, outer before inner."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def _first_lines(node: ast.AST) -> set[int]:
    """The lines a code object of this function may report as its first (decorators)."""
    return {node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))}


def candidates(repo: Repo, config: MineConfig) -> list[Candidate]:
    """Every operator edit inside a covered function, in the seeded, interleaved order."""
    ops = [get_operator(n) for n in config.operators] if config.operators else list(OPERATORS)
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for module in sorted(repo.coverage):
        source = (repo.root / module).read_text()
        try:
            tree = pyast.parse(source)
        except SyntaxError:
            continue
        covered_lines = {int(k) for k in repo.coverage[module]}
        spans = [(name, node.lineno, node.end_lineno) for name, node in _functions(tree)
                 if _first_lines(node) & covered_lines]  # fmt: skip
        for op in ops:
            for k, edit in enumerate(op.edits(pyast.parse(source))):
                inside = [s for s in spans if s[1] <= edit.lineno <= s[2]]
                if inside:  # the innermost covered function holding the edit
                    name = max(inside, key=lambda s: s[1])[0]
                    groups.setdefault((module, name), []).append(
                        Candidate(module, name, op.name, k, edit.lineno)
                    )
    rng = random.Random(config.seed)
    keys = sorted(groups)
    rng.shuffle(keys)
    for key in keys:
        rng.shuffle(groups[key])
    order = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        order += [groups[k][i] for k in keys if i < len(groups[k])]
    return order


def covering_tests(repo: Repo, cand: Candidate) -> list[str]:
    source = (repo.root / cand.module).read_text()
    files: set[str] = set()
    for name, node in _functions(pyast.parse(source)):
        if name == cand.function or name.startswith(cand.function + "."):
            for line in _first_lines(node):
                files.update(repo.coverage[cand.module].get(str(line), []))
    return sorted(f for f in files if f in repo.test_files)


# ----------------------------------------------------------------------------- tasks


def _test_name(nodeid: str) -> tuple[str, ...]:
    """("test_f",) or ("TestC", "test_m") for a node id (parameters dropped)."""
    return tuple(p.split("[", 1)[0] for p in nodeid.split("::")[1:])


def trim_skipped(text: str, names: set[tuple[str, ...]]) -> str | None:
    """The test file without the tests named (module functions or methods of module-level
    classes, decorators included); None when one cannot be found in the source (a test
    made by a base class, a generated one)."""
    tree = pyast.parse(text)
    spans = []
    for name in names:
        body, node = tree.body, None
        for part in name:
            node = next((n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef
                                                     | ast.ClassDef) and n.name == part), None)  # fmt: skip
            if node is None:
                return None
            body = node.body if isinstance(node, ast.ClassDef) else []
        if isinstance(node, ast.ClassDef):
            return None
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        spans.append((start, node.end_lineno))
    lines = text.splitlines(keepends=True)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    try:
        pyast.parse("".join(lines))
    except SyntaxError:  # a class left without a body
        return None
    return "".join(lines)


def hidden_texts(
    repo: Repo, failing: list[str]
) -> tuple[dict[str, str], dict[str, list[str]]] | str:
    """The hidden test files (path -> text) for these failing tests, each without the tests
    that were skipped or deselected before mutation (the verifier counts a skipped hidden
    test as a forged verdict, and a deselected one fails with the reference fix too), and
    what was removed; or why there is none."""
    files = sorted({n.split("::")[0] for n in failing})
    failing_names = {(n.split("::")[0], _test_name(n)) for n in failing}
    texts, removed = {}, {}
    for rel in files:
        text = (repo.root / rel).read_text()
        cut = {_test_name(n): o for n, o in repo.tests.items()
               if o in ("skipped", "deselected") and n.split("::")[0] == rel}  # fmt: skip
        both = set(cut) & {name for f, name in failing_names if f == rel}
        if both:
            kind = "skips" if "skipped" in {cut[n] for n in both} else "deselected"
            return f"{kind}: a failing test has {cut[min(both)]} instances before mutation ({rel})"
        if cut:
            trimmed = trim_skipped(text, set(cut))
            if trimmed is None:
                return f"skips: {rel} has skipped or deselected tests that cannot be cut out of it"
            text, removed[rel] = trimmed, sorted("::".join(n) for n in cut)
        texts[rel] = text
    return texts, removed


def family_split(family: str, config: MineConfig) -> str:
    if config.split != "auto":
        return config.split
    u = int(hashlib.sha256(f"{config.split_salt}:{family}".encode()).hexdigest()[:8], 16) / 2**32
    if u < config.test_fraction:
        return "test"
    return "val" if u < config.test_fraction + config.val_fraction else "train"


def _protected(repo: Repo) -> list[str]:
    """Every test file (or whole test folder) and every pytest configuration file."""
    out: set[str] = set()
    module_dirs = {os.path.dirname(m) for m in repo.modules}
    for t in repo.test_files:
        folder = os.path.dirname(t)
        out.add(f"{folder}/" if folder and folder not in module_dirs else t)
    for rel in _walk_py(repo.root) + [p for p in os.listdir(repo.root)]:
        if os.path.basename(rel) in CONFIG_NAMES:
            out.add(rel)
    out.update(n for n in CONFIG_NAMES if (repo.root / n).exists())
    return sorted(out)


def _patch(rel: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 f"a/{rel}", f"b/{rel}")  # fmt: skip
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)  # fmt: skip


def _instruction(failing: list[str], command: list[str]) -> str:
    shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
    return (f"Tests of this repository fail: {shown}. Run `{' '.join(command)}` to see the "
            "failures, find the bug in the library's source code and fix it. Do not modify "
            "the tests or the test configuration.")  # fmt: skip


# long: one task folder, field by field (docs/tasks.md is the contract it follows)
def write_task(repo: Repo, cand: Candidate, buggy: str, failing: list[str], cases: dict,
               out: Path, config: MineConfig, upstream: dict) -> Task:  # fmt: skip
    original = (repo.root / cand.module).read_text()
    dotted = cand.module.removesuffix(".py").removeprefix("src/").replace("/", ".")
    family = f"{repo.name}/{dotted}"
    digest = hashlib.sha256(f"{family}\0{cand.name}\0{buggy}".encode()).hexdigest()[:10]
    task_id = f"mined-{re.sub(r'[^A-Za-z0-9_.-]', '-', repo.name)}-{digest}"
    folder = out / task_id
    if folder.exists():
        shutil.rmtree(folder)
    _copy_repo(repo.root, folder / "repo")
    shutil.rmtree(folder / "repo" / TOOLS, ignore_errors=True)
    (folder / "repo" / cand.module).write_text(buggy)
    hidden, removed = hidden_texts(repo, failing)  # try_candidate checked it gives some
    hidden_files = sorted(hidden)
    for rel, text in hidden.items():
        dst = folder / "hidden_tests" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
    (folder / "reference.patch").write_text(_patch(cand.module, buggy, original))
    (folder / HIDDEN_CASES_FILE).write_text(json.dumps(cases, indent=1) + "\n")
    reqs: str | list[str] = list(repo.env.requirements)
    if reqs:
        (folder / "environment").mkdir()
        (folder / "environment" / "requirements.txt").write_text("\n".join(reqs) + "\n")
        reqs = "environment/requirements.txt"
    # The agent's view of the failure leaves out what was deselected before mutation.
    deselect = [f"--deselect={n}" for n in sorted(repo.deselected)
                if "::" in n and n.split("::")[0] in hidden]  # fmt: skip
    command = ["python", "-m", "pytest", "-q", "-o", "addopts=", *deselect, *hidden_files]
    meta = TaskMetadata(family=family, bug_class=cand.operator, split=family_split(family, config),
                        source="mined", extra={
        "repository": repo.name, "module": cand.module, "function": cand.function,
        "mutation": f"{cand.operator}#{cand.index} line {cand.lineno}",
        "failing_tests": failing, "hidden_tests_removed": removed,
        "n_hidden_cases": len(cases["cases"]),
        "src_layout": repo.src_layout, "upstream": upstream,
        "deselected_before_mutation": {n: r for n, r in repo.deselected.items()
                                       if n.split("::")[0] in hidden},
        "mine_seed": config.seed})  # fmt: skip
    limits = TaskLimits(memory_mb=config.memory_mb, per_test_timeout_s=config.per_test_timeout_s)
    task = Task(id=task_id, instruction=_instruction(failing, command), metadata=meta,
                root=folder.resolve(), test_command=tuple(command),
                protected_paths=tuple(_protected(repo)), has_reference=True,
                environment=replace(repo.env, requirements_file=reqs if isinstance(reqs, str) else ""),
                limits=limits)  # fmt: skip
    spec = task_spec(task)
    (folder / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    return load_task(folder)


# ----------------------------------------------------------------------------- mining


def _drop(report: MineReport, cand: Candidate, reason: str) -> None:
    key = reason.split(":", 1)[0]
    report.dropped[key] = report.dropped.get(key, 0) + 1
    report.drops.append({"candidate": cand.name, "reason": reason})


def _mutant_text(source: str, cand: Candidate) -> str | None:
    mutant = apply_edit(source, get_operator(cand.operator), cand.index)
    if mutant is None:
        return None
    text = edit_in_place(source, mutant.source)
    try:
        return text if normalize(text) == mutant.source and text != source else None
    except SyntaxError:
        return None


# long: the per-candidate gate, each way out with its reason for the report
def try_candidate(repo: Repo, cand: Candidate, work: Path, sandbox: SandboxConfig,
                  config: MineConfig) -> tuple[str | None, list[str], str]:  # fmt: skip
    """(the buggy module text or None, the tests that fail on it, why it was dropped)."""
    source = (repo.root / cand.module).read_text()
    buggy = _mutant_text(source, cand)
    if buggy is None:
        return None, [], "no one-edit text for the mutant (no change, or not in place)"
    tests = covering_tests(repo, cand)
    if not tests:
        return None, [], "no test file calls the function"
    tree = work / "mutant"
    shutil.rmtree(tree, ignore_errors=True)
    _copy_repo(repo.root, tree)
    (tree / cand.module).write_text(buggy)
    deselect = tuple(n for n in repo.deselected if "::" in n)
    run = run_suite(tree, tests, repo.python_env, sandbox, config, trace=False, deselect=deselect)
    if run.timed_out or any(o == "timeout" for o in run.tests.values()):
        return None, [], "hangs: a test ran past its timeout on the mutant"
    if run.collect_errors:
        return None, [], "breaks import: a test file no longer imports"
    if run.rc == -1:
        return None, [], "no result: the test run ended without a report"
    failing = sorted(n for n, o in run.tests.items()
                     if o == "failed" and repo.tests.get(n) == "passed")  # fmt: skip
    if not failing:
        return None, [], "survives: every covering test still passes"
    hidden = hidden_texts(repo, failing)
    if isinstance(hidden, str):
        return None, [], hidden
    return buggy, failing, ""


def mine_repository(repo_path: Path, out: Path, *, config: MineConfig, sandbox: SandboxConfig,
                    run_tests: RunTests, prepare: PrepareConfig | None = None,
                    requirements: tuple[str, ...] = (), upstream: dict | None = None,
                    name: str | None = None) -> MineReport:  # fmt: skip
    """Mine one repository into `out` (one folder per kept task); `name` (default: the
    folder's) starts every family. Never raises for a bad repository: the report's `error`
    says what is wrong (any exception the repository causes, with its type when it was not
    foreseen) and nothing of it is left in `out`."""
    start = time.monotonic()
    report = MineReport(repository=name or str(repo_path))
    prepare = prepare or PrepareConfig()
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-mine-") as tmp:
            _mine(Path(repo_path), out, Path(tmp), report, config, sandbox, run_tests, prepare,
                  requirements, upstream or {}, name)  # fmt: skip
        report.ok = True
    except (MineError, SandboxError, TaskEnvironmentError, OSError) as e:
        report.error = " ".join(str(e).split())[:300]
    except Exception as e:  # noqa: BLE001 - one library's failure never ends a run of many
        report.error = f"unexpected {type(e).__name__}: " + " ".join(str(e).split())[:260]
    if not report.ok:
        for task_id in report.kept:
            shutil.rmtree(out / task_id, ignore_errors=True)
        report.kept = []
    report.seconds = time.monotonic() - start
    return report


# long: the mining loop with its three bounds and the per-task data gate
def _mine(repo_path: Path, out: Path, work: Path, report: MineReport, config: MineConfig,
          sandbox: SandboxConfig, run_tests: RunTests, prepare: PrepareConfig,
          requirements: tuple[str, ...], upstream: dict, name: str | None) -> None:  # fmt: skip
    start = time.monotonic()
    repo = setup_repo(repo_path, work, requirements, config, sandbox, prepare)
    repo.name = name or repo.name
    report.setup_s = time.monotonic() - start
    report.environment = {"python": repo.env.python, "requirements": list(repo.env.requirements),
                          "key": Path(repo.python_env).name, "harness": harness_versions()}  # fmt: skip
    report.deselected = dict(repo.deselected)
    editable = repo.env.editable
    report.distribution = (
        f"{editable.name}=={editable.version}" if editable and editable.name else ""
    )
    report.source_modules, report.test_files = len(repo.modules), len(repo.test_files)
    report.tests = sum(o != "deselected" for o in repo.tests.values())
    order = candidates(repo, config)
    report.covered_functions = len({(c.module, c.function) for c in order})
    report.candidates = len(order)
    per_function: Counter = Counter()
    seen: set[str] = set()
    for cand in order:
        if report.tried >= config.max_candidates or len(report.kept) >= config.max_tasks:
            break
        if time.monotonic() - start > config.budget_s:
            report.stopped_by = "budget_s"
            break
        if per_function[(cand.module, cand.function)] >= config.max_per_function:
            continue  # enough from this function; not a try
        if "." in cand.function:  # a method gets no hidden cases (derive_hidden_cases)
            report.methods_passed_over += 1  # so it could never be a task: not a try
            continue
        report.tried += 1
        t0 = time.monotonic()
        buggy, failing, reason = try_candidate(repo, cand, work, sandbox, config)
        report.mutant_tests_s += time.monotonic() - t0
        if buggy is None:
            _drop(report, cand, reason)
            continue
        if buggy in seen:
            _drop(report, cand, "duplicate: the same buggy text as a kept task")
            continue
        t0 = time.monotonic()
        cases = derive_hidden_cases(repo, cand, buggy, work, sandbox, config)
        report.cases_s += time.monotonic() - t0
        if isinstance(cases, str):
            _drop(report, cand, cases)
            continue
        try:
            task = write_task(repo, cand, buggy, failing, cases, out, config, upstream)
        except (TaskFormatError, OSError, UnicodeError) as e:  # this mutant's task, not the run
            _drop(report, cand, f"write: {' '.join(str(e).split())[:200]}")
            continue
        t0 = time.monotonic()
        check = check_task(task, run_tests)
        report.gate_s += time.monotonic() - t0
        if not check.ok:
            shutil.rmtree(task.root, ignore_errors=True)
            _drop(report, cand, f"gate: {check.reason[:200]}")
            continue
        seen.add(buggy)
        per_function[(cand.module, cand.function)] += 1
        report.kept.append(task.id)


def report_dict(reports: list[MineReport]) -> dict:
    return {"repositories": [asdict(r) for r in reports],
            "kept": sum(len(r.kept) for r in reports),
            "errors": {r.repository: r.error for r in reports if not r.ok}}  # fmt: skip
