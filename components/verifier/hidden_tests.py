"""The hidden tests: run under the harness (harness.py) in a fresh tree, and judged.

The tree holds the hidden tests and a canary test that must fail (both read-only under
bwrap); the harness runs them under an isolated interpreter start with pytest plugins given
explicitly (autoload off; pytest-timeout, its limit counted in CPU time and unstarved wall
time, components/sandbox/harness_plugins/; the harness's recorder passed as an object). A
pass needs pytest's reports and the recorder to agree, the canary reported as failed, every
hidden test present and none skipped; anything else that bends the run is a forged verdict.
"""

from __future__ import annotations

import ast
import secrets
from pathlib import Path

from components import pyast
from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult, run_sandboxed
from components.tasks.task import Task
from components.verifier.checks import (
    Check,
    VerifierSettings,
    isolated_python,
    last_marker,
    limit_of,
    no_verdict,
    ran_after_verdict,
)

VERDICT_MARKER = "AGENTRL-VERDICT"
# The harness program, shipped into each tree as it is (harness.py).
HARNESS = (Path(__file__).parent / "harness.py").read_text()


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


def tests_check(task: Task, tree: Path, env: VerifierSettings, cfg: SandboxConfig) -> Check:
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
    argv = [*isolated_python(cfg), f"{tools.name}/harness_{token}.py", token, str(tree),
            f"{env.per_test_timeout_s:g}", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "--continue-on-collection-errors", f"--timeout={env.per_test_timeout_s:g}",
            *hidden, canary]  # fmt: skip
    readonly = (tools, *(tree / rel for rel in hidden))
    cmd = run_sandboxed(argv, tree, cfg, readonly=readonly)
    check = _judge_tests(cmd, token, set(hidden), count_hidden_tests(task))
    check.command, check.limit = cmd, check.limit or limit_of(cmd)
    marker = cmd.output.rfind(f"{VERDICT_MARKER} {token} ")
    check.detail = (cmd.output[:marker] if marker >= 0 else cmd.output)[-2000:]
    return check


def _judge_tests(cmd: CommandResult, token: str, hidden: set[str], expected: int) -> Check:
    """The hidden-test verdict from the harness's record (see the module docstring)."""
    check = Check(total=max(expected, 1), failed=max(expected, 1))
    n, record = last_marker(cmd.output, f"{VERDICT_MARKER} {token} ")
    if not isinstance(record, dict):
        check.lost = no_verdict(cmd, "the hidden-test run")
        return check
    problem = _record_problem(record)
    if problem:  # the harness writes one shape only: another was written by the code
        check.forged.append(f"a malformed verdict record ({problem})")
        return check
    if n > 1:
        check.forged.append(f"the harness's verdict line appeared {n} times")
    after = ran_after_verdict(cmd)
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
