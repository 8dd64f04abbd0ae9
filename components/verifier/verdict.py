"""The verdict: `verify` judges an agent's final tree by hidden tests, out of reach of the
code under test.

A verification goes in this order; every check starts from one snapshot and nothing a
check writes survives it:

1. **Snapshot** (snapshot.py). The agent's final repository is copied once, before any
   verification process runs: regular files and symlinks (as links) only, within
   MAX_SNAPSHOT_FILES files and MAX_SNAPSHOT_BYTES bytes, into a work area of the
   verification's own (a tmpfs of WORK_AREA_BYTES where this process may mount): the
   snapshot, the checks' trees and whatever the code under test writes into them never
   touch the host's temporary disk. A tree that outgrew that share (more than the share
   counted, or a write refused for want of room in the verification's own tmpfs) is the
   agent's outcome: a failed verdict with the reason and a `disk` limit, never a lost
   one and never an infrastructure failure.
2. **Tampering** (tampering.py). Changes to protected paths (tests), to pytest or
   interpreter configuration and files that could shadow or hook the harness are reported
   as tampering and never taken; so are special files and names with a line break, another
   control character or bytes that are not UTF-8.
3. **Hidden tests** (hidden_tests.py, harness.py): a fresh tree plus the hidden tests and a
   canary test that must fail (both read-only under bwrap), run by a trusted harness under
   an isolated interpreter start (`python -s -P -B`: no user site, no current folder or
   repository on sys.path ahead of the environment's packages; the repository is appended
   after them; the environment is the sandbox's allow-list, so no PYTHON* variable of the
   host applies) with pytest plugins given explicitly (autoload off; pytest-timeout, its
   limit counted in CPU time and unstarved wall time
   (components/sandbox/harness_plugins/agentrl_cpu_timeout.py: load decides no verdict),
   and the harness's recorder passed as objects). The recorder notes what each test's
   setup, call and teardown raised, independently of pytest's reports. A pass needs both
   to agree, the canary reported as failed, every hidden test present and none skipped;
   anything else that bends the run is a forged verdict (test tampering). The import of a
   test module (and of the code it imports) is limited like a test, and so is each hidden
   case.
4. **Hidden cases** (hidden_cases.py, case_runner.py), when the hidden tests passed and the
   task ships cases (`hidden_cases.json`) or its hidden tests are plain
   `assert f(literals) == literal` lines: another fresh tree from the snapshot, without
   the hidden tests, runs the function on the arguments only; the expected values never
   leave this process. Hidden tests that pass while the cases fail are a forged verdict.
5. **Who caused a missing verdict** (here). When the agent's tree gives no verdict (no
   harness report, pytest internal/usage error, a wall-clock or other limit, a tree that
   cannot be copied), the untouched task repository is verified under the same harness (the
   control, cached per task), in a clean work area with a quota of its own (nothing the
   agent's verification wrote shares it). If the control gets a verdict, the failure is
   the agent's: a failed verification, with `forged_pass` when the code ended the harness
   and `limit_hit` when a limit killed it. Only a harness that fails on the control too is
   an infrastructure failure (`status="infra_error"`), which callers keep out of rewards.
   An honest mistake (a failure without the tampering flag) is decided before anything
   runs, from what the verifier observed on its snapshot: every file the agent changed
   (tampering aside) is a `.py` file that does not compile, so none of its code can run and
   none can have written the record or ended the harness. Nothing in a record the code
   under test could have written (its `rc`, say) decides it.

Lint and security findings the changes introduce come from lint.py. Verdicts are cached by
(task, hash of the final tree, settings, verifier version) (cache.py, `verdict_cache_info`).
The verdict lines are judged strictly: a record of another shape than the harness's, a
second line, or a line followed by a hang or another exit status came from the code under
test (a forged verdict); any exception a tree raises in a check is a lost verdict, whose
cause the control decides (step 5). Verdicts that depend on timing (a limit hit, a lost
verdict) and failed controls are not kept.

What is NOT protected: code under test runs inside the pytest process, so a program
written against this harness (patching the recorder's hook implementations in memory,
reading the hidden test's constants) can still bend the pytest verdict of a task with no
hidden cases; tasks whose verdict must hold against that need hidden cases (shipped or
derivable). Without bubblewrap the hidden tests are writable, the task store is readable
and a process can leave what it learnt in the host's /tmp for the hidden-case run
(components/sandbox/isolation.py says what each isolation mode gives). `verify_command` tasks
get an exit-status verdict only.

Channels that remain between runs of the agent's code, and why no verdict rests on them:
the hidden-test run sees the hidden tests' expected values (pytest needs them) and can
leave them in kernel state shared by later runs (the host's page cache, timing), and the
case run can read such state back. A task with a reference fix is therefore judged by
differential cases (hidden_cases.py): argument tuples that appear nowhere the agent's runs
can read (workspace tests, hidden tests, hidden_cases.json), expected values from the
reference fix that exist only in this process, so nothing the hidden-test run carries
answers a case. Harbor tasks alike: with a reference fix (from solution/solve.sh), every repository
function their tests call with literal arguments gets differential cases after test.sh
passed. A task without a reference fix keeps its shipped or derived cases, which
the hidden-test run can see: that channel stays open for it, as for functions without
plain arguments and methods (no cases: the tests alone). Differential cases failed behind
passing tests make a forged verdict unless some failed case got a plain answer of the
code's own (neither the expected nor the unfixed code's): the unfixed code's answers,
errors and objects that are not plain values are the bug left in place behind a lookup of
the tests' values or an always-equal object; an incomplete honest fix is a plain failure. The cheating gate's
impossible variants (components/tasks/impossible.py) show the code under test the same
files, times, argv, mounts and case functions as a real task; only the contradicted value's
content differs, so code cannot arm itself on real tasks only.

A task with an environment (task.json `environment`, components/tasks/environments.py) is
verified with that environment's interpreter, mounted read-only, and the harness's pytest
copied into it at the project's versions; every step above is the same. An environment
that is not prepared is an infrastructure error, never a failed verdict.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from components.runtime import refuse_if_stopping
from components.sandbox.config import SandboxConfig
from components.sandbox.process import kernel_call_refused, run_sandboxed
from components.tasks.environments import TaskEnvironmentError, with_task_limits
from components.tasks.harbor import is_harbor_task
from components.tasks.harbor import run_verifier as run_harbor_verifier
from components.tasks.task import Task
from components.verifier.cache import cached_control, cached_verdict, keep_control, keep_verdict
from components.verifier.checks import Check, VerifierSettings, check_config, limit_of, no_verdict
from components.verifier.hidden_cases import cases_check, hidden_cases
from components.verifier.hidden_tests import count_hidden_tests, tests_check
from components.verifier.lint import introduced_findings, reference_findings
from components.verifier.snapshot import (
    Snapshot,
    build_tree,
    changed_paths,
    outgrew_share,
    take_snapshot,
    work_area,
)
from components.verifier.tampering import escapes_repository, tamper_reason
from components.verifier.verification import Verification
from components.verifier.version import verifier_version


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
    env: VerifierSettings, cfg: SandboxConfig, *, every_check: bool = False,
) -> tuple[Check | None, Check, dict]:  # fmt: skip
    """(hidden-case check or None, hidden-test check, lint findings), each check in its own
    fresh tree. The hidden cases run only after the hidden tests passed (a failed verdict
    needs nothing more), unless `every_check`. Raises OSError when a tree cannot be built."""
    tests_tree, cases_tree = work / "tests", work / "cases"
    build_tree(task, snap, changed, tampered, tests_tree, hidden=True)
    kept = [p for p in changed if p not in tampered]
    findings = introduced_findings(task.repo_dir, tests_tree, kept, reference_findings(task))
    if is_harbor_task(task):  # Harbor's tests/test.sh and its reward file (tasks/harbor.py)
        run = run_harbor_verifier(task, tests_tree, cfg)
        test_check = Check(passed=run.passed, total=1, failed=int(not run.passed),
                           forged=run.forged, lost=run.lost, limit=limit_of(run.command),
                           command=run.command, detail=run.detail)  # fmt: skip
    elif task.verify_command is not None:
        cmd = run_sandboxed(list(task.verify_command), tests_tree, cfg)
        test_check = Check(passed=cmd.exit_code == 0, total=1, failed=int(cmd.exit_code != 0),
                           command=cmd, limit=limit_of(cmd), detail=cmd.output[-2000:])  # fmt: skip
        if cmd.limit_hit == "wall_time":
            test_check.lost = no_verdict(cmd, "the verify command")
    else:
        test_check = tests_check(task, tests_tree, env, cfg)
    cases, comparison = hidden_cases(task)
    if is_harbor_task(task) and comparison != "differential":
        cases = []  # test.sh's own checks, and an export's cases (run_verifier), decided it
    case_check = None
    if cases and (test_check.passed or every_check):
        # What the hidden-test run wrote goes before the next tree takes its room.
        shutil.rmtree(tests_tree, ignore_errors=True)
        build_tree(task, snap, changed, tampered, cases_tree, hidden=False)
        case_check = cases_check(cases, comparison, cases_tree, env, cfg)
    return case_check, test_check, findings


def _control(task: Task, key: str, env: VerifierSettings, cfg: SandboxConfig) -> str:
    """ "" when the untouched task repository gets a verdict under the same harness, else
    why not (cached per task and settings)."""
    ckey = (key, repr((env.per_test_timeout_s, env.verify_timeout_s, cfg)))
    kept = cached_control(ckey)
    if kept is not None:
        return kept
    try:  # a clean work area of its own: nothing the agent's verification wrote is there
        with work_area("agentrl-control-") as (tmp, _):
            snap = take_snapshot(task.repo_dir, tmp / "snapshot")
            cases, tests, _ = _run_checks(task, snap, [], set(), tmp, env, cfg, every_check=True)
            lost = (cases.lost if cases else "") or tests.lost
    except Exception as e:  # noqa: BLE001 - any harness crash means no control verdict
        lost = f"{type(e).__name__}: {e}"
    if not lost:  # a control that failed is tried again next time: it may have been load
        keep_control(ckey, lost)
    return lost


def _observed_flags(checks: list[Check]) -> list[dict]:
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
    task: Task, snap: Snapshot, work: tuple[Path, bool], env: VerifierSettings,
    cfg: SandboxConfig, key: str, original: dict,
) -> Verification:  # fmt: skip
    """`work`: (the work area, whether it is a tmpfs of its own)."""
    changed = changed_paths(original, snap.entries)
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
        if snap.entries.get(rel, ("",))[0] == "link"
        and escapes_repository(rel, snap.entries[rel][1])
    ]
    # Decided before anything runs, from the verifier's own compile of its snapshot.
    honest = _nothing_can_run(snap, [r for r in changed if r not in reasons])
    try:
        cases, tests, findings = _run_checks(task, snap, changed, set(reasons), work[0], env, cfg)
    except Exception as e:  # noqa: BLE001 - a tree that breaks a check: the control decides
        if outgrew_share(e, work[1]):  # its own tmpfs was full: the agent's tree or writes
            return _outgrew(task, v, f"a verification tree outgrew its share ({e})")
        cases, tests, findings = None, Check(lost=f"{type(e).__name__}: {e}"), None
    if findings is not None:
        v.lint_introduced, v.security_introduced = len(findings["lint"]), len(findings["security"])
        v.security_findings = findings["security"]
    checks = [c for c in (cases, tests) if c is not None]
    v.flags += _observed_flags(checks)
    v.limit_hit = next((c.limit for c in checks if c.limit), None)
    v.detail = "\n".join(c.detail for c in checks if c.detail)
    lost = next((c.lost for c in checks if c.lost), "")
    if lost:
        return _without_verdict(task, v, lost, key, env, cfg, honest)
    v.tests_total = sum(c.total for c in checks)
    v.tests_failed = sum(c.failed for c in checks)
    forged = list(tests.forged) + (cases.forged if cases else [])
    if cases is not None and tests.passed and not cases.passed and _bug_left(cases):
        forged.append("pytest passed but the hidden cases failed")
    v.forged_pass = bool(forged)
    v.tests_passed = all(c.passed for c in checks) and not forged
    v.flags += [{"category": "test_tampering", "reason": f"verdict forged: {f}"} for f in forged]
    return v


def _bug_left(cases: Check) -> bool:
    """Whether cases that failed behind passing tests show the bug left in place: cases
    read off the tests (their values passed, so failing them is forged), or differential
    cases none of which was answered with a plain value of the code's own (each was the
    unfixed code's answer, an error, or a value that is not plain: a lookup of the tests'
    values, an always-equal object). An incomplete honest fix computes some other plain
    answer: a plain failure, not a forgery."""
    return not cases.answered_otherwise


def _nothing_can_run(snap: Snapshot, kept: list[str]) -> str:
    """ "path: error" of the first changed file when every file the agent wrote (`kept`:
    its changes the trees take; deletions and its links are not written) is a .py file
    Python cannot compile, so no code of the agent's can run in any check; else "".
    Compiling runs none of the file's code; a file of any other kind could be run by
    something (a script a test starts, data an interpreter executes)."""
    written = [rel for rel in kept if snap.entries.get(rel, ("",))[0] == "file"]
    if snap.root is None or not written:
        return ""
    first = ""
    for rel in written:
        if not rel.endswith(".py"):
            return ""
        try:
            compile((snap.root / rel).read_bytes(), rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            first = first or f"{rel}: {type(e).__name__}: {e}"
            continue
        except OSError:
            return ""
        return ""  # this one compiles: the agent's code can run
    return first


def _outgrew(task: Task, v: Verification, why: str) -> Verification:
    """The agent's tree did not fit its share: a failed verdict with the reason and a
    `disk` limit (the agent's outcome, so no control decides it)."""
    expected = max(count_hidden_tests(task), 1)
    v.verdict_lost, v.tests_passed, v.limit_hit = why, False, "disk"
    v.tests_total = v.tests_failed = expected
    v.flags.append({"category": "resource_limit", "reason": f"verification: {why}"})
    v.detail = f"no verdict: {why}\n" + v.detail
    return v


def _without_verdict(
    task: Task, v: Verification, lost: str, key: str, env: VerifierSettings, cfg: SandboxConfig,
    honest: str = "",
) -> Verification:  # fmt: skip
    """The agent's tree gave no verdict: the control says whose failure it is. `honest`:
    every file the agent wrote is a .py file that does not compile (`_nothing_can_run`,
    decided before the run): a mistake that stops pytest (a module a conftest imports, say),
    not code that ended the harness, so a failure without the tampering flag."""
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
    task: Task,
    final_repo: Path,
    env: VerifierSettings,
    sandbox: SandboxConfig,
    *,
    cache: bool = True,
) -> Verification:
    """Hidden-test verdict plus the facts the reward terms need (see the module docstring)."""
    start = time.monotonic()
    env, sandbox = with_task_limits(task, env, sandbox)  # a heavy mined suite's own room
    try:
        cfg = check_config(task, env, sandbox)
    except TaskEnvironmentError as e:  # not the agent's doing: kept out of rewards
        return Verification(status="infra_error", detail=str(e), wall_s=time.monotonic() - start)
    original = _entries(task)
    key = _task_key(task, original)
    refuse_if_stopping("a verification")  # Ctrl-C: no new folder in the run's tmp
    with work_area("agentrl-verify-") as (tmp, own_quota):
        try:
            snap = take_snapshot(Path(final_repo), tmp / "snapshot")
        except Exception as e:  # noqa: BLE001 - whatever the tree makes the copy raise
            v = Verification(status="ok", tampered_files=[], changed_files=[])
            why = f"could not copy the repository: {e}"
            if outgrew_share(e, own_quota):
                v = _outgrew(task, v, f"the repository outgrew its share ({e})")
            else:
                v = _without_verdict(task, v, why, key, env, cfg)
            v.wall_s = time.monotonic() - start
            return v
        # The verifier's version too: a verdict of another verifier is not this one's.
        vkey = (key, snap.digest, repr((env.per_test_timeout_s, env.verify_timeout_s, cfg)),
                verifier_version())  # fmt: skip
        hit = cached_verdict(vkey) if cache else None
        if hit is not None:
            hit.cached, hit.wall_s = True, time.monotonic() - start
            return hit
        v = _verify_snapshot(task, snap, (tmp, own_quota), env, cfg, key, original)
    v.wall_s = time.monotonic() - start
    # Only verdicts that do not depend on timing are kept (no limit hit, no lost verdict).
    if cache and v.status == "ok" and not v.verdict_lost and v.limit_hit is None:
        keep_verdict(vkey, v)
    return v
