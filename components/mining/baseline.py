"""Setup of a repository to mine: its copy, its environment and the traced baseline run of
its unmutated suite (each test's outcome, which functions each test file calls), with
the tests that fail, hang or are flaky deselected or the repository refused."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from components.mining.config import MineConfig, MineError
from components.mining.layout import (
    HARNESS_MODULES,
    TOOLS,
    add_src_path,
    check_source,
    copy_repo,
    discover,
    distribution,
    top_modules,
)
from components.sandbox.config import SandboxConfig
from components.sandbox.process import run_sandboxed
from components.tasks.environments import PrepareConfig, TaskEnvironmentError, build_environment
from components.tasks.folder_safety import UnsafeTaskFolder
from components.tasks.task import EditableInstall, TaskEnvironment


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
    try:  # before anything in it is read: no host file enters a task through a link
        check_source(repo)
    except UnsafeTaskFolder as e:
        raise MineError(str(e)) from e
    tests, modules = discover(repo)
    if not tests:
        raise MineError("no test files (test_*.py or *_test.py)")
    if not modules:
        raise MineError("no source modules outside the tests")
    clash = top_modules(repo, modules) & HARNESS_MODULES
    if clash:
        raise MineError(f"its package {sorted(clash)[0]!r} would collide with the test harness")
    root = work / "repo"
    copy_repo(repo, root)
    src_layout = (root / "src").is_dir() and all(Path(m).parts[0] == "src" for m in modules
                                                 if "/" in m)  # fmt: skip
    if src_layout:
        add_src_path(root)
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
