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
   changed code rewritten (components/env/tool_sets/fix_search/fixes.py: edit_in_place), so the reverse patch is
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

import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from components import shutdown
from components.mining.baseline import Repo, run_suite, setup_repo
from components.mining.candidates import Candidate, candidates, covering_tests, mutant_text
from components.mining.config import MineConfig, MineError, MineReport
from components.mining.hidden_cases import derive_hidden_cases
from components.mining.layout import copy_repo
from components.mining.task_folder import hidden_texts, write_task
from components.sandbox.config import SandboxConfig, SandboxError
from components.tasks.environments import PrepareConfig, TaskEnvironmentError, harness_versions
from components.tasks.gate import RunTests, check_task
from components.tasks.task import TaskFormatError


def _drop(report: MineReport, cand: Candidate, reason: str) -> None:
    key = reason.split(":", 1)[0]
    report.dropped[key] = report.dropped.get(key, 0) + 1
    report.drops.append({"candidate": cand.name, "reason": reason})


# long: the per-candidate gate, each way out with its reason for the report
def try_candidate(repo: Repo, cand: Candidate, work: Path, sandbox: SandboxConfig,
                  config: MineConfig) -> tuple[str | None, list[str], str]:  # fmt: skip
    """(the buggy module text or None, the tests that fail on it, why it was dropped)."""
    source = (repo.root / cand.module).read_text()
    buggy = mutant_text(source, cand)
    if buggy is None:
        return None, [], "no one-edit text for the mutant (no change, or not in place)"
    tests = covering_tests(repo, cand)
    if not tests:
        return None, [], "no test file calls the function"
    tree = work / "mutant"
    shutil.rmtree(tree, ignore_errors=True)
    copy_repo(repo.root, tree)
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


@dataclass(frozen=True)
class RepoSource:
    """One repository to mine, and what is known of it besides its files."""

    path: Path
    name: str | None = None  # starts every family (default: the folder's name)
    requirements: tuple[str, ...] = ()  # installed in its environment for its tests
    upstream: dict | None = None  # where it came from, kept in each task's metadata


def mine_repository(source: RepoSource, out: Path, *, config: MineConfig, sandbox: SandboxConfig,
                    run_tests: RunTests, prepare: PrepareConfig | None = None) -> MineReport:  # fmt: skip
    """Mine one repository into `out` (one folder per kept task). Never raises for a bad
    repository: the report's `error` says what is wrong (any exception the repository
    causes, with its type when it was not foreseen) and nothing of it is left in `out`."""
    start = time.monotonic()
    report = MineReport(repository=source.name or str(source.path))
    prepare = prepare or PrepareConfig()
    try:
        with shutdown.temporary_folder("agentrl-mine-") as tmp:  # a signal removes it too
            _mine(source, out, Path(tmp), report, config, sandbox, run_tests, prepare)
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


def _mine(source: RepoSource, out: Path, work: Path, report: MineReport, config: MineConfig,
          sandbox: SandboxConfig, run_tests: RunTests, prepare: PrepareConfig) -> None:  # fmt: skip
    """The mining loop with its three bounds and the per-task data gate."""
    start = time.monotonic()
    repo = setup_repo(Path(source.path), work, source.requirements, config, sandbox, prepare)
    repo.name = source.name or repo.name
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
            task = write_task(repo, cand, buggy, failing, cases, out, config,
                              source.upstream or {})  # fmt: skip
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
