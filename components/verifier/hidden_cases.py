"""The hidden cases: function calls whose expected values never enter the sandbox.

A task ships cases (`hidden_cases.json`, compared with exact types), or its hidden tests are
plain `assert f(literals) == literal` lines, read off here (`derive_cases`, compared with
==). When the hidden tests passed, another fresh tree from the snapshot, without the hidden
tests, runs each function on the arguments only under the case runner (case_runner.py); the
results are compared here. Answers the code gathered while the hidden tests ran cannot reach
this run: under bwrap nothing a sandboxed process writes outlives it except its tree, and
this tree is new.
"""

from __future__ import annotations

import ast
import json
import secrets
from pathlib import Path

from components import pyast
from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult, run_sandboxed
from components.tasks.task import Task, same_value
from components.verifier.checks import (
    ISOLATED_PYTHON,
    Check,
    VerifierSettings,
    last_marker,
    limit_of,
    no_verdict,
    ran_after_verdict,
)

CASES_MARKER = "AGENTRL-CASES"
# The case runner program, shipped into each tree as it is (case_runner.py).
CASE_RUNNER = (Path(__file__).parent / "case_runner.py").read_text()


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


def cases_check(
    cases: list[dict], comparison: str, tree: Path, env: VerifierSettings, cfg: SandboxConfig
) -> Check:
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


def _judge_cases(cmd: CommandResult, token: str, cases: list[dict], comparison: str) -> Check:
    """The hidden-case verdict from the runner's line (see the module docstring)."""
    check = Check(total=len(cases), failed=len(cases), command=cmd, limit=limit_of(cmd))
    n, got = last_marker(cmd.output, f"{CASES_MARKER} {token} ")
    if got is None:
        check.lost = no_verdict(cmd, "the hidden-case run")
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
    after = ran_after_verdict(cmd)
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
