"""QuixBugs (https://github.com/jkoppel/QuixBugs, MIT) to task folders: all 40 programs.

A checkout holds, per program, `python_programs/<name>.py` (buggy, one-line defect),
`correct_python_programs/<name>.py` (fixed) and its tests: `json_testcases/<name>.json`
(one `[input, expected]` per line; 31 programs) or, for the graph programs, a pytest file
`python_testcases/test_<name>.py` that builds `node.Node` objects. Programs run only
through the injected `RunPython` (the sandbox, from `agentrl tasks import --from quixbugs`).

JSON programs go through components/tasks/external.py: generators are compared as
lists, expected lists are read as the tuples the fix returns (hanoi), and a program whose
upstream test compares with `pytest.approx(expected, abs=input_data[-1])` (sqrt) is
compared that way. Graph programs keep upstream's test file with its import switch
(`if pytest.use_correct: ...`) replaced by `from <name> import <name>`, and node.py as a
protected helper; tests that fail on the fixed program are removed, and so are tests that
hang on the buggy one when others fail. See docs/tasks.md for the rules.
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import tokenize
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from components import pyast, shutdown
from components.tasks.external import (
    BOUNDED_CASES,
    PROTECTED_PATHS,
    TASK_PYPROJECT,
    TEST_TIMEOUT_S,
    Comparison,
    ConversionError,
    FunctionTask,
    RunPython,
    evaluate_cases,
    explain_no_failing_case,
    loop_budgets,
    select_cases,
    write_function_task,
)
from components.tasks.folder_safety import UnsafeTaskFolder, refuse_unsafe_entries
from components.tasks.generate import instruction_text, unified_diff
from components.tasks.task import DEFAULT_TEST_COMMAND, Task, TaskMetadata, write_task_folder

ATTRIBUTION = {
    "benchmark": "QuixBugs",
    "url": "https://github.com/jkoppel/QuixBugs",
    "license": "MIT",
    "authors": "Derrick Lin, James Koppel, Angela Chen, Armando Solar-Lezama",
    "note": "program, fix and test cases taken verbatim from QuixBugs; see its LICENSE",
}
# Upstream README: the graph-based programs, whose tests are Python files.
GRAPH_PROGRAMS = (
    "breadth_first_search", "depth_first_search", "detect_cycle", "minimum_spanning_tree",
    "reverse_linked_list", "shortest_path_length", "shortest_path_lengths", "shortest_paths",
    "topological_ordering",
)  # fmt: skip
# Our names for a few defects; the others are classified from the reference diff.
BUG_CLASSES = {
    "bucketsort": "wrong_variable",
    "gcd": "swapped_args",
    "get_factors": "wrong_return_value",
    "pascal": "bound_off_by_one",
    "possible_change": "missing_condition",
    "to_base": "operand_swap",
}
HELPER_DIRS = ("python_testcases", "python_programs")  # where `import node` is looked up
# Every folder of a checkout that conversion reads.
READ_FOLDERS = ("python_programs", "correct_python_programs", "json_testcases", "python_testcases")
HELPER_MODULES = ("node",)  # upstream helper modules next to the programs, not programs


# ----------------------------------------------------------------------------- sources


def _split_trailing_docstring(text: str) -> tuple[str, str]:
    """(code, trailing module-level string): QuixBugs keeps its spec in a string at the end."""
    tree = pyast.parse(text)
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


def read_json_cases(path: Path) -> list[tuple[tuple, object]]:
    """json_testcases/<name>.json: one `[input, expected]` per line; a non-list input is a
    single argument (as in QuixBugs' own tester.py)."""
    cases = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            inp, expected = json.loads(line)
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            raise ConversionError(f"{path.name}:{n}: not an [input, expected] pair ({e})") from e
        args = tuple(inp) if isinstance(inp, list) else (inp,)
        cases.append((args, expected))
    if not cases:
        raise ConversionError(f"{path.name}: no test cases")
    return cases


def _parse(text: str, rel: str) -> ast.Module:
    try:
        return pyast.parse(text)
    except SyntaxError as e:
        raise ConversionError(f"{rel} does not parse: {e.msg} (line {e.lineno})") from e


def approx_tolerance_arg(test_source: str | None) -> int | None:
    """The argument index of `pytest.approx(expected, abs=input_data[i])` in an upstream
    test (sqrt's), None when the test compares exactly."""
    if test_source is None:
        return None
    for node in ast.walk(pyast.parse(test_source)):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.approx"):
            continue
        for kw in node.keywords:
            value = kw.value
            if (kw.arg == "abs" and isinstance(value, ast.Subscript)
                    and isinstance(value.slice, ast.UnaryOp | ast.Constant)):  # fmt: skip
                index = ast.literal_eval(value.slice)
                if isinstance(index, int):
                    return index
    return None


def classify_fix(buggy: str, fixed: str) -> str:
    """A name for a one-line defect, from the tokens the fix changes."""
    a, b = buggy.splitlines(), fixed.splitlines()
    ops = [op for op in difflib.SequenceMatcher(None, a, b).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1:
        return "multi_line_defect"
    tag, i1, i2, j1, j2 = ops[0]
    if tag != "replace":
        return "missing_code" if tag == "insert" else "extra_code"

    def tokens(lines: list[str]) -> list[tuple[int, str]]:
        text = "\n".join(line.strip() for line in lines) + "\n"
        try:
            return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
                    if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)]  # fmt: skip
        except (tokenize.TokenError, IndentationError):
            return []

    old, new = tokens(a[i1:i2]), tokens(b[j1:j2])
    changed = [
        op for op in difflib.SequenceMatcher(None, old, new).get_opcodes() if op[0] != "equal"
    ]
    kinds = {t[0] for op in changed for t in old[op[1] : op[2]] + new[op[3] : op[4]]}
    if old != new and sorted(old) == sorted(new):
        return "swapped_operands"
    names = {tokenize.NAME: "wrong_variable", tokenize.OP: "wrong_operator",
             tokenize.NUMBER: "wrong_constant"}  # fmt: skip
    return names.get(kinds.pop(), "one_line_defect") if len(kinds) == 1 else "one_line_defect"


# ----------------------------------------------------------------------------- JSON programs


@dataclass(frozen=True)
class Program:
    """One QuixBugs program's upstream files, read."""

    name: str
    buggy: str
    correct: str
    upstream_files: tuple[str, ...]


def _fixed_source(program: Program) -> str:
    """merge_fix of the two upstream files, once both parse."""
    _parse(program.buggy, f"python_programs/{program.name}.py")
    _parse(program.correct, f"correct_python_programs/{program.name}.py")
    return merge_fix(program.buggy, program.correct)


def _task_spec(program: Program, fixed: str, split: str) -> FunctionTask:
    name = program.name
    return FunctionTask(
        task_id=f"quixbugs-{name}",
        module=name,
        function=name,
        buggy_source=program.buggy,
        fixed_source=fixed,
        family=f"quixbugs/{name}",
        bug_class=BUG_CLASSES.get(name) or classify_fix(program.buggy, fixed),
        source="quixbugs",
        split=split,
        extra={"attribution": ATTRIBUTION, "upstream_files": list(program.upstream_files)},
    )


def convert_json_program(
    program: Program, cases_path: Path, test_source: str | None, out: Path,
    run_python: RunPython, split: str = "test",
) -> Task:  # fmt: skip
    name = program.name
    fixed = _fixed_source(program)
    cases = read_json_cases(cases_path)
    args = [a for a, _ in cases]
    good = evaluate_cases(run_python, {f"{name}.py": fixed}, f"{name}.py", name, args)
    bad = evaluate_cases(run_python, {f"{name}.py": program.buggy}, f"{name}.py", name, args,
                         loop_budgets(good))  # fmt: skip
    cmp = Comparison(
        materialize=any(o.generator for o in good),
        abs_tol_arg=approx_tolerance_arg(test_source),
    )
    if any(o.kind == "not_plain" for o in good):
        kinds = sorted({o.detail for o in good if o.kind == "not_plain"})
        raise ConversionError(f"{name}: the fixed program returns {', '.join(kinds)} values, "
                              "which JSON cases cannot describe")  # fmt: skip
    sel = select_cases(name, cases, good, bad, cmp)
    if not sel.failing and not sel.bounded:
        raise ConversionError(explain_no_failing_case(name, sel, len(cases)))
    return write_function_task(out, _task_spec(program, fixed, split), sel, cmp)


# ----------------------------------------------------------------------------- graph programs


def rewrite_upstream_test(text: str, name: str) -> str:
    """Upstream's test with `if pytest.use_correct: from correct_python_programs.X import X
    else: from python_programs.X import X` (and any other import from those packages)
    replaced by `from X import X`; every other line verbatim."""
    tree = _parse(text, f"python_testcases/test_{name}.py")
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in tree.body:
        imports: list[ast.ImportFrom] = []
        if isinstance(node, ast.If) and "use_correct" in ast.unparse(node.test):
            imports = [n for n in node.orelse if isinstance(n, ast.ImportFrom)]
            if not imports:
                raise ConversionError(f"test_{name}.py: no import in the use_correct switch")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "python_programs", "correct_python_programs"
        ):  # fmt: skip
            imports = [node]
        else:
            continue
        text_ = "".join(
            ast.unparse(ast.ImportFrom(module=i.module.split(".")[-1], names=i.names, level=0))
            + "\n" for i in imports
        )  # fmt: skip
        edits.append((node.lineno - 1, node.end_lineno, text_))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new]
    out = "".join(lines)
    if "use_correct" in out:
        raise ConversionError(f"test_{name}.py uses pytest.use_correct outside its import switch")
    return out


def _imported_modules(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def helper_modules(src: Path, name: str, sources: list[str]) -> dict[str, tuple[str, str]]:
    """{module file: (upstream path, text)} of the upstream helper modules (node.py) that
    the program or its test imports."""
    wanted = set().union(*(_imported_modules(pyast.parse(s)) for s in sources)) - {name}
    found = {}
    for module in sorted(wanted):
        for folder in HELPER_DIRS:
            path = src / folder / f"{module}.py"
            if path.is_file():
                found[f"{module}.py"] = (f"{folder}/{module}.py", path.read_text())
                break
    return found


def _test_functions(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """test name -> (first line incl. decorators, last line), 1-based."""
    return {
        n.name: (min([n.lineno, *(d.lineno for d in n.decorator_list)]), n.end_lineno)
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
    }


def without_tests(text: str, names: set[str]) -> str:
    """The test file without the named test functions (and the blank lines after them)."""
    spans = _test_functions(pyast.parse(text))
    lines = text.splitlines(keepends=True)
    for name in sorted(names, key=lambda n: spans[n][0], reverse=True):
        start, end = spans[name]
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start - 1 : end]
    text = "".join(lines)
    return text.rstrip("\n") + "\n" if names else text


def run_test_file(
    run_python: RunPython, files: dict[str, str], test_rel: str, timeout_s: float
) -> dict[str, str]:
    """test function -> passed | failed | timeout, from one sandboxed pytest run."""
    with shutdown.temporary_folder("agentrl-convert-") as tmp:
        folder = Path(tmp)
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
        argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                f"--timeout={timeout_s:g}", "--junitxml=_agentrl_junit.xml", test_rel]  # fmt: skip
        n_tests = len(_test_functions(pyast.parse(files[test_rel])))
        _, output = run_python(folder, argv, 30 + n_tests * (timeout_s + 2))
        try:
            root = ET.parse(folder / "_agentrl_junit.xml").getroot()
        except (ET.ParseError, OSError):
            tail = output.strip()[-300:] or "no output"
            raise ConversionError(f"{test_rel} does not run: {tail}") from None
    results: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "").split("[")[0]
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        status = "passed"
        if bad is not None:
            message = (bad.get("message") or "") + (bad.text or "")
            status = "timeout" if "Timeout" in message else "failed"
        elif case.find("skipped") is not None:
            status = "failed"
        if results.get(name, "passed") == "passed":
            results[name] = status
    return results


def convert_graph_program(
    program: Program, test_path: Path, src: Path, out: Path, run_python: RunPython,
    split: str = "test", timeout_s: float = TEST_TIMEOUT_S,
) -> Task:  # fmt: skip
    name = program.name
    fixed = _fixed_source(program)
    test = rewrite_upstream_test(test_path.read_text(), name)
    helpers = helper_modules(src, name, [program.buggy, fixed, test])
    files = {rel: text for rel, (_, text) in helpers.items()}
    test_rel = f"tests/test_{name}.py"
    files.update({"pyproject.toml": TASK_PYPROJECT, test_rel: test})
    good = run_test_file(run_python, {**files, f"{name}.py": fixed}, test_rel, timeout_s)
    if not any(s == "passed" for s in good.values()):
        raise ConversionError(f"{name}: no upstream test passes on the fixed program ({good})")
    dropped = {
        "test fails on the fixed program": sorted(t for t, s in good.items() if s != "passed")
    }
    test = without_tests(test, set(dropped["test fails on the fixed program"]))
    bad = run_test_file(run_python, {**files, test_rel: test, f"{name}.py": program.buggy},
                        test_rel, timeout_s)  # fmt: skip
    failing = sorted(t for t, s in bad.items() if s == "failed")
    hanging = sorted(t for t, s in bad.items() if s == "timeout")
    if not failing and not hanging:
        raise ConversionError(f"{name}: the buggy program passes all {len(bad)} upstream tests "
                              "that pass on the fixed one")  # fmt: skip
    gone = hanging if failing else hanging[BOUNDED_CASES:]
    dropped["test hangs on the buggy program"] = gone
    test = without_tests(test, set(gone))
    extra = {
        "attribution": ATTRIBUTION,
        "upstream_files": sorted([*program.upstream_files, *(p for p, _ in helpers.values())]),
        "module": f"{name}.py",
        "function": name,
        "comparison": "upstream pytest file",
        "helper_modules": sorted(helpers),
        "dropped_tests": {k: v for k, v in dropped.items() if v},
        "n_bounded_tests": 0 if failing else len(hanging[:BOUNDED_CASES]),
        "hidden_cases": False,  # arguments are Node graphs, not plain values
    }
    spec = _task_spec(program, fixed, split)
    return write_task_folder(
        out,
        task_id=spec.task_id,
        instruction=instruction_text(name, DEFAULT_TEST_COMMAND),
        metadata=TaskMetadata(
            spec.family, spec.bug_class, split, "quixbugs", dict(sorted(extra.items()))
        ),  # fmt: skip
        repo_files={**files, test_rel: test, f"{name}.py": program.buggy},
        hidden_test_files={f"tests/test_{name}_hidden.py": test},
        reference_patch=unified_diff(f"{name}.py", program.buggy, fixed),
        test_command=DEFAULT_TEST_COMMAND,
        protected_paths=(*PROTECTED_PATHS, *sorted(helpers)),
    )


# ----------------------------------------------------------------------------- checkout


def list_programs(src: Path) -> list[str]:
    """Programs of a checkout: python_programs/*.py with a correct version (helpers and
    the old `*_test.py` drivers left out)."""
    return sorted(
        p.stem for p in (src / "python_programs").glob("*.py")
        if not p.stem.endswith("_test") and not p.stem.startswith("_")
        and p.stem not in HELPER_MODULES
        and (src / "correct_python_programs" / p.name).is_file()
    )  # fmt: skip


def convert_program(
    src: Path, name: str, out: Path, run_python: RunPython, split: str = "test",
    timeout_s: float = TEST_TIMEOUT_S,
) -> Task:  # fmt: skip
    """Convert one program into out/ (raises ConversionError saying what is wrong)."""
    buggy, correct = (
        src / "python_programs" / f"{name}.py",
        src / "correct_python_programs" / f"{name}.py",
    )
    cases, test = (
        src / "json_testcases" / f"{name}.json",
        src / "python_testcases" / f"test_{name}.py",
    )
    missing = [str(p.relative_to(src)) for p in (buggy, correct) if not p.is_file()]
    if missing:
        raise ConversionError(f"{name}: missing {', '.join(missing)}")
    files = [f"python_programs/{name}.py", f"correct_python_programs/{name}.py"]
    if cases.is_file():
        program = Program(name, buggy.read_text(), correct.read_text(),
                          (*files, f"json_testcases/{name}.json"))  # fmt: skip
        test_source = test.read_text() if test.is_file() else None
        return convert_json_program(program, cases, test_source, out, run_python, split)
    if test.is_file():
        program = Program(name, buggy.read_text(), correct.read_text(),
                          (*files, f"python_testcases/test_{name}.py"))  # fmt: skip
        return convert_graph_program(program, test, src, out, run_python, split, timeout_s)
    raise ConversionError(
        f"{name}: no tests (neither json_testcases/{name}.json nor python_testcases/test_{name}.py)"
    )


def convert_quixbugs(
    src_root: str | Path,
    out_root: str | Path,
    run_python: RunPython,
    programs: list[str] | None = None,
    split: str = "test",
    timeout_s: float = TEST_TIMEOUT_S,
) -> tuple[list[Task], list[str]]:
    """Convert the programs of a QuixBugs checkout (default: all it has) into
    out_root/<program>/. Returns (tasks, errors), one error line per program not converted."""
    src, out = Path(src_root), Path(out_root)
    if not (src / "python_programs").is_dir():
        return [], [f"{src}: not a QuixBugs checkout (no python_programs/)"]
    for folder in READ_FOLDERS:  # what conversion reads: links and special files refused first
        if (src / folder).exists() or (src / folder).is_symlink():
            try:
                refuse_unsafe_entries(src / folder, f"quixbugs {src.name}", named_from=src)
            except UnsafeTaskFolder as e:
                return [], [str(e)]
    tasks, errors = [], []
    for name in programs or list_programs(src):
        try:
            tasks.append(convert_program(src, name, out / name, run_python, split, timeout_s))
        except ConversionError as e:
            text = str(e)
            errors.append(f"quixbugs {text if text.startswith(f'{name}:') else f'{name}: {text}'}")
    return tasks, errors
