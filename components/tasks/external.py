"""Converting external bug-fix benchmarks into task folders (see docs/tasks.md).

`write_function_task` is the generic path for benchmarks of the shape "one buggy module,
its fixed version, and (arguments, expected result) cases"; `convert_quixbugs` applies it
to a QuixBugs checkout (https://github.com/jkoppel/QuixBugs, MIT). The conversion only
uses the public task format: it writes repo/, hidden_tests/, reference.patch and task.json
with write_task_folder, and checks each case in-process before writing, so a converted
task is expected to pass the data gate (components/tasks/gate.py) as well.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from components.tasks.generate import (
    REPO_PYPROJECT,
    TIMEOUT,
    call_with_budget,
    instruction_text,
    load_function,
    render_test_file,
    unified_diff,
)
from components.tasks.task import DEFAULT_TEST_COMMAND, Task, TaskMetadata, write_task_folder

PROTECTED_PATHS = ("tests/", "pyproject.toml", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg")

QUIXBUGS_ATTRIBUTION = {
    "benchmark": "QuixBugs",
    "url": "https://github.com/jkoppel/QuixBugs",
    "license": "MIT",
    "authors": "Derrick Lin, James Koppel, Angela Chen, Armando Solar-Lezama",
    "note": "program, fix and test cases taken verbatim from QuixBugs; see its LICENSE",
}

# Our names for the one-line defect of each converted program (QuixBugs has 40; graph
# programs and ones whose buggy version loops forever on most inputs are left out).
QUIXBUGS_BUG_CLASSES = {
    "bucketsort": "wrong_variable",
    "gcd": "swapped_args",
    "get_factors": "wrong_return_value",
    "pascal": "bound_off_by_one",
    "possible_change": "missing_condition",
    "to_base": "operand_swap",
}


class ConversionError(ValueError):
    """The benchmark item cannot become a valid task (message names the item)."""


def _split_trailing_docstring(text: str) -> tuple[str, str]:
    """(code, trailing module-level string) — QuixBugs keeps its spec in a string at the end."""
    tree = ast.parse(text)
    last = tree.body[-1] if tree.body else None
    if (
        len(tree.body) > 1
        and isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Constant)
        and isinstance(last.value.value, str)
    ):
        lines = text.splitlines(keepends=True)
        return "".join(lines[: last.lineno - 1]), "".join(lines[last.lineno - 1 :])
    return text, ""


def _leading_comments(code: str) -> str:
    lines = code.splitlines(keepends=True)
    n = 0
    while n < len(lines) and (not lines[n].strip() or lines[n].lstrip().startswith("#")):
        n += 1
    return "".join(lines[:n])


def merge_fix(buggy: str, correct: str) -> str:
    """The buggy file with its code replaced by the correct file's code.

    Upstream fixed files drop the spec docstring (and sometimes keep alternative fixes in a
    trailing string); keeping the buggy file's header and spec makes reference.patch the
    minimal code change instead of a rewrite of the whole file.
    """
    buggy_code, buggy_doc = _split_trailing_docstring(buggy)
    correct_code, _ = _split_trailing_docstring(correct)
    head = _leading_comments(buggy_code)
    buggy_body = buggy_code[len(head) :]
    trailing = buggy_body[len(buggy_body.rstrip()) :]
    correct_body = correct_code[len(_leading_comments(correct_code)) :]
    return head + correct_body.rstrip() + trailing + buggy_doc


def write_function_task(
    out_root: str | Path,
    *,
    task_id: str,
    module: str,
    function: str,
    buggy_source: str,
    fixed_source: str,
    cases: list[tuple[tuple, object]],
    family: str,
    bug_class: str,
    source: str,
    split: str = "test",
    extra: dict | None = None,
    visible_failing: int = 2,
    visible_passing: int = 1,
    budget: int = 5_000_000,
    drop_inconsistent: bool = False,
) -> Task:
    """Write one task whose repo is `<module>.py` (buggy) plus visible tests.

    Every case must pass on fixed_source (else ConversionError; with drop_inconsistent the
    case is left out and listed in metadata 'inconsistent_cases' instead) and at least one
    must fail on buggy_source. Cases on which the buggy code runs past `budget` trace events
    are dropped (a hanging hidden test would only cost verification time).
    """
    fixed_fn = load_function(fixed_source, module, function)
    buggy_fn = load_function(buggy_source, module, function)
    failing, passing, dropped, inconsistent = [], [], 0, []
    for args, expected in cases:
        got = call_with_budget(fixed_fn, args, budget)
        if got is TIMEOUT or got[0] != "ok" or got[1] != expected:
            message = f"fixed code gives {got!r} for {args!r}, expected {expected!r}"
            if not drop_inconsistent:
                raise ConversionError(f"{task_id}: {message}")
            inconsistent.append(message)
            continue
        bad = call_with_budget(buggy_fn, args, budget)
        if bad is TIMEOUT:
            dropped += 1
        elif bad[0] == "ok" and bad[1] == expected:
            passing.append((args, expected))
        else:
            failing.append((args, expected))
    if not failing:
        raise ConversionError(f"{task_id}: no case fails on the buggy code")
    kept = [c for c in cases if c in failing or c in passing]
    visible = [c for c in kept if c in failing[:visible_failing] or c in passing[:visible_passing]]
    module_file = f"{module}.py"
    return write_task_folder(
        Path(out_root),
        task_id=task_id,
        instruction=instruction_text(module, DEFAULT_TEST_COMMAND),
        metadata=TaskMetadata(
            family=family,
            bug_class=bug_class,
            split=split,
            source=source,
            extra={
                **(extra or {}),
                "module": module_file,
                "function": function,
                "n_visible_cases": len(visible),
                "n_hidden_cases": len(kept),
                "n_dropped_cases": dropped,
                "inconsistent_cases": inconsistent,
            },
        ),
        repo_files={
            module_file: buggy_source,
            f"tests/test_{module}.py": render_test_file(module, function, visible, False),
            "pyproject.toml": REPO_PYPROJECT,
        },
        hidden_test_files={
            f"tests/test_{module}_hidden.py": render_test_file(module, function, kept, True)
        },
        reference_patch=unified_diff(module_file, buggy_source, fixed_source),
        test_command=DEFAULT_TEST_COMMAND,
        protected_paths=PROTECTED_PATHS,
    )


def read_quixbugs_cases(path: Path) -> list[tuple[tuple, object]]:
    """json_testcases/<name>.json: one `[input, expected]` per line; a non-list input is a
    single argument (as in QuixBugs' own tester.py)."""
    cases = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            inp, expected = json.loads(line)
        except (json.JSONDecodeError, ValueError) as e:
            raise ConversionError(f"{path}:{n}: not an [input, expected] pair ({e})") from e
        args = tuple(inp) if isinstance(inp, list) else (inp,)
        cases.append((args, expected))
    return cases


def convert_quixbugs(
    src_root: str | Path,
    out_root: str | Path,
    programs: list[str] | None = None,
    split: str = "test",
) -> tuple[list[Task], list[str]]:
    """Convert QuixBugs programs (default: those in QUIXBUGS_BUG_CLASSES) found under a
    checkout with python_programs/, correct_python_programs/ and json_testcases/.
    Writes out_root/<program>/; returns (tasks, errors), one error line per program."""
    src, out = Path(src_root), Path(out_root)
    tasks, errors = [], []
    for name in programs or sorted(QUIXBUGS_BUG_CLASSES):
        files = {
            "buggy": src / "python_programs" / f"{name}.py",
            "correct": src / "correct_python_programs" / f"{name}.py",
            "cases": src / "json_testcases" / f"{name}.json",
        }
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            errors.append(f"quixbugs {name}: missing {', '.join(missing)}")
            continue
        try:
            buggy = files["buggy"].read_text()
            fixed = merge_fix(buggy, files["correct"].read_text())
            task = write_function_task(
                out / name,
                task_id=f"quixbugs-{name}",
                module=name,
                function=name,
                buggy_source=buggy,
                fixed_source=fixed,
                cases=read_quixbugs_cases(files["cases"]),
                family=f"quixbugs/{name}",
                bug_class=QUIXBUGS_BUG_CLASSES.get(name, "unknown"),
                source="quixbugs",
                split=split,
                # Upstream data has a few expected values its own fix disagrees with
                # (pascal: n=1 expects [1], not [[1]]); those cases are listed, not tested.
                drop_inconsistent=True,
                extra={
                    "attribution": QUIXBUGS_ATTRIBUTION,
                    "upstream_files": [
                        f"python_programs/{name}.py",
                        f"correct_python_programs/{name}.py",
                        f"json_testcases/{name}.json",
                    ],
                },
            )
        except (ConversionError, SyntaxError) as e:
            errors.append(f"quixbugs {name}: {e}")
            continue
        tasks.append(task)
    return tasks, errors
