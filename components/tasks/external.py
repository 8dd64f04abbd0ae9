"""Converting external bug-fix benchmarks into task folders (see docs/tasks.md).

A benchmark program of the shape "one buggy module, its fixed version, and (arguments,
expected result) cases" becomes a task in three steps:

1. `evaluate_cases` runs every case on one version of the program through an injected
   `RunPython`: the sandbox when called from the command line (components/tasks/__main__.py),
   so benchmark code never runs on the host. Each case gets a deterministic step budget
   (traced line events, not wall time), so "loops" means the same on every machine.
2. `select_cases` compares what came back with the expected values (in this process: the
   results are plain values): cases the fixed program disagrees with or runs past the
   budget on are dropped and listed by reason; cases on which the buggy program loops are
   dropped when other cases fail, else a few are kept, bounded by the per-test timeout.
3. `write_function_task` writes repo/, hidden_tests/, reference.patch, task.json and, when
   every kept case compares exactly as a plain value, hidden_cases.json.

Output is deterministic: same inputs, same bytes (no timings, addresses or host paths).
QuixBugs (components/tasks/quixbugs.py) is the worked example.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components import shutdown
from components.tasks.generate import instruction_text, unified_diff
from components.tasks.task import (
    DEFAULT_TEST_COMMAND,
    HIDDEN_CASES_FILE,
    Task,
    TaskMetadata,
    same_value,
    write_task_folder,
)

# `run_python(folder, args, wall_s) -> (exit code, output)`: run `python *args` with
# `folder` as working directory and only writable place, killed after wall_s seconds.
RunPython = Callable[[Path, list[str], float], tuple[int, str]]

PROTECTED_PATHS = ("tests/", "pyproject.toml", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg")
STEP_BUDGET = 5_000_000  # traced events per case on the fixed program (~3 s of CPU)
# On the buggy program a case "loops" past LOOP_FACTOR x the fixed program's steps (at
# least MIN_BUDGET): relative to the fix, so looping cases cost little to find.
LOOP_FACTOR, MIN_BUDGET = 10, 100_000
CASE_WALL_S = 10.0  # backstop for code the step budget cannot see (C loops)
BOUNDED_CASES = 2  # looping cases kept when no other case fails
TEST_TIMEOUT_S = 5  # pytest-timeout per test in the task's repo (visible runs)
# pythonpath: `from gcd import gcd` works however pytest starts; timeout: a test on which
# the bug loops fails after TEST_TIMEOUT_S instead of hanging the agent's test command.
TASK_PYPROJECT = f'[tool.pytest.ini_options]\npythonpath = ["."]\ntimeout = {TEST_TIMEOUT_S}\n'
LIST_WRAPPER = "tests/as_list.py"  # hidden cases of generator programs call this

# Dropped-case reasons (keys of metadata.dropped_cases).
FIXED_DISAGREES = "fixed program disagrees with the expected value"
FIXED_TOO_SLOW = "fixed program runs past the step budget"
BUGGY_LOOPS = "buggy program loops (other cases fail)"
BUGGY_CRASHES = "buggy program kills its process"


class ConversionError(ValueError):
    """The benchmark item cannot become a valid task (message names the item and why)."""


@dataclass(frozen=True)
class Outcome:
    """What one call gave: kind is value | error | loop | crash | not_plain."""

    kind: str
    value: object = None  # the returned plain value (kind "value")
    detail: str = ""  # exception or type name
    generator: bool = False  # the call returned a generator, materialised with list()
    steps: int = 0  # traced events the call took


# Runs inside the sandbox: loads one program, calls its function on each case's arguments
# (fresh literals every call) under the case's step budget and appends one JSON line per case to the
# results file. A case that defeats the budget (catches it) ends the process after a second
# alarm; the caller restarts after it.
EVAL_SCRIPT = r"""
import ast, importlib.util, json, os, signal, sys, types

PLAIN = (int, float, complex, str, bytes, bool, type(None))


class OutOfBudget(BaseException):
    pass


def plain(x, depth=0):
    t = type(x)
    if depth > 64:
        return False
    if t in PLAIN:
        return True
    if t in (list, tuple, set, frozenset):
        return all(plain(y, depth + 1) for y in x)
    if t is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
    return False


def main():
    module_file, function, cases_file, start, wall, out_file = sys.argv[1:7]
    start, wall = int(start), float(wall)
    sys.path.insert(0, os.getcwd())
    with open(cases_file) as f:
        cases = json.load(f)
    out = open(out_file, "a")
    name = os.path.splitext(os.path.basename(module_file))[0]
    try:
        spec = importlib.util.spec_from_file_location(name, module_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, function)
    except BaseException as e:
        out.write(json.dumps({"load_error": "%s: %s" % (type(e).__name__, e)}) + "\n")
        return
    state = {"steps": 0, "fired": False, "index": start}

    def tracer(frame, event, arg):
        state["steps"] += 1
        if state["steps"] > state["budget"]:
            raise OutOfBudget
        return tracer

    def on_alarm(signum, frame):
        if state["fired"]:
            out.write(json.dumps({"index": state["index"], "kind": "loop"}) + "\n")
            out.flush()
            os._exit(0)
        state["fired"] = True
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        raise OutOfBudget

    signal.signal(signal.SIGALRM, on_alarm)
    for index in range(start, len(cases)):
        text, budget = cases[index]
        state.update(steps=0, fired=False, index=index, budget=budget)
        record = {"index": index}
        try:
            args = ast.literal_eval(text)
            signal.setitimer(signal.ITIMER_REAL, wall)
            sys.settrace(tracer)
            try:
                value = fn(*args)
                if isinstance(value, types.GeneratorType):
                    record["generator"] = True
                    value = list(value)
            finally:
                sys.settrace(None)
                signal.setitimer(signal.ITIMER_REAL, 0)
            if plain(value):
                record.update(kind="value", repr=repr(value))
            else:
                record.update(kind="not_plain", type=type(value).__name__)
        except OutOfBudget:
            record["kind"] = "loop"
        except BaseException as e:
            record.update(kind="error", type=type(e).__name__)
        record["steps"] = state["steps"]
        out.write(json.dumps(record) + "\n")
        out.flush()


main()
"""
_SCRIPT, _CASES, _RESULTS = "_agentrl_eval.py", "_agentrl_cases.json", "_agentrl_results.jsonl"


def _outcome(record: dict) -> Outcome:
    kind, generator = record.get("kind", "crash"), bool(record.get("generator"))
    steps = int(record.get("steps", 0))
    if kind == "value":
        try:
            value = ast.literal_eval(record["repr"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return Outcome("not_plain", detail="value without a literal repr", steps=steps)
        return Outcome("value", value, generator=generator, steps=steps)
    return Outcome(kind, detail=record.get("type", ""), generator=generator, steps=steps)


def loop_budgets(fixed: list[Outcome]) -> list[int]:
    """Per-case step budgets for the buggy program, from what the fixed one took."""
    return [min(STEP_BUDGET, max(MIN_BUDGET, LOOP_FACTOR * o.steps)) for o in fixed]


def evaluate_cases(
    run_python: RunPython,
    files: dict[str, str],
    module_file: str,
    function: str,
    cases: list[tuple],
    budgets: list[int] | None = None,
    case_wall_s: float = CASE_WALL_S,
) -> list[Outcome]:
    """One Outcome per case (argument tuple) of `function` in `module_file` (one of
    `files`, written with the others into a fresh folder that run_python runs in); each
    case under its step budget (default STEP_BUDGET)."""
    budgets = budgets or [STEP_BUDGET] * len(cases)
    texts = [[repr(tuple(args)), b] for args, b in zip(cases, budgets, strict=True)]
    results: dict[int, Outcome] = {}
    with shutdown.temporary_folder("agentrl-convert-") as tmp:
        folder = Path(tmp)
        for rel, text in {**files, _SCRIPT: EVAL_SCRIPT, _CASES: json.dumps(texts)}.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
        start = 0
        while start < len(texts):
            wall = (len(texts) - start) * (case_wall_s + 2) + 30
            argv = [_SCRIPT, module_file, function, _CASES, str(start), f"{case_wall_s:g}",
                    _RESULTS]  # fmt: skip
            _, output = run_python(folder, argv, wall)
            path = folder / _RESULTS
            for line in path.read_text().splitlines() if path.exists() else []:
                record = json.loads(line)
                if "load_error" in record:
                    raise ConversionError(f"{module_file} does not load: {record['load_error']}")
                results.setdefault(record["index"], _outcome(record))
            if start not in results:  # the process died on this case (memory, signal, ...)
                tail = output.strip().splitlines()[-1:] or ["no output"]
                results[start] = Outcome("crash", detail=tail[0][:200])
            start = max(results) + 1
    return [results[i] for i in range(len(texts))]


# ----------------------------------------------------------------------------- selection


def retype(expected: object, like: object) -> object:
    """`expected` (read from JSON, so lists only) with a tuple wherever `like` (what the
    fixed program returned) has a tuple of the same length."""
    if isinstance(expected, list) and isinstance(like, list | tuple) and len(like) == len(expected):
        items = [retype(e, x) for e, x in zip(expected, like, strict=True)]
        return tuple(items) if isinstance(like, tuple) else items
    return expected


@dataclass(frozen=True)
class Comparison:
    """How a result is compared with its expected value (and how the tests assert it)."""

    materialize: bool = False  # the function returns a generator: compare list(result)
    abs_tol_arg: int | None = None  # pytest.approx(expected, abs=args[abs_tol_arg])

    def matches(self, outcome: Outcome, args: tuple, expected: object) -> bool:
        if outcome.kind != "value":
            return False
        got = outcome.value
        if self.abs_tol_arg is not None:
            numbers = all(isinstance(v, int | float) and not isinstance(v, bool)
                          for v in (got, expected))  # fmt: skip
            return numbers and abs(got - expected) <= args[self.abs_tol_arg]
        if expected is None or isinstance(expected, bool):
            return got is expected
        return bool(got == expected)

    def describe(self) -> str:
        if self.abs_tol_arg is not None:
            return f"pytest.approx(expected, abs=args[{self.abs_tol_arg}])"
        return "list(result) == expected" if self.materialize else "result == expected"


@dataclass
class Selection:
    """The cases a task keeps (in benchmark order) and the ones it leaves out, by reason."""

    hidden: list[tuple[tuple, object]] = field(default_factory=list)
    failing: list[tuple[tuple, object]] = field(default_factory=list)
    passing: list[tuple[tuple, object]] = field(default_factory=list)
    bounded: list[tuple[tuple, object]] = field(default_factory=list)  # buggy loops, kept
    exact: bool = True  # every kept case equals its expected value with exact types
    retyped: bool = False  # some expected value was read as the tuples the fix returns
    dropped: dict[str, list[str]] = field(default_factory=dict)

    def visible(self, n_failing: int = 2, n_passing: int = 1) -> list[tuple[tuple, object]]:
        shown = (self.failing or self.bounded)[:n_failing] + self.passing[:n_passing]
        return [c for c in self.hidden if c in shown]


def _call_text(function: str, args: tuple) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fixed_verdict(outcome: Outcome, expected: object, args: tuple, cmp: Comparison):
    """(the expected value the tests will use, "") or (None, why the case is dropped)."""
    if outcome.kind == "loop":
        return None, FIXED_TOO_SLOW
    want = retype(expected, outcome.value) if outcome.kind == "value" else expected
    if cmp.matches(outcome, args, want):
        return want, ""
    return None, FIXED_DISAGREES


def _gave(outcome: Outcome) -> str:
    if outcome.kind == "value":
        return _short(repr(outcome.value))
    return f"{outcome.kind} {outcome.detail}".strip()


def select_cases(
    function: str,
    cases: list[tuple[tuple, object]],
    fixed: list[Outcome],
    buggy: list[Outcome],
    cmp: Comparison,
    bounded: int = BOUNDED_CASES,
) -> Selection:
    """Sort each case by what the fixed and buggy programs did with it (see module doc)."""
    sel = Selection()
    kind: dict[int, str] = {}  # case index -> failing | passing | looping
    wanted: dict[int, object] = {}
    for i, ((args, expected), good, bad) in enumerate(zip(cases, fixed, buggy, strict=True)):
        call = _short(_call_text(function, args))
        want, reason = _fixed_verdict(good, expected, args, cmp)
        if want is None:
            text = f"{call}: expected {_short(repr(expected))}, fixed gives {_gave(good)}"
            sel.dropped.setdefault(reason, []).append(text if reason == FIXED_DISAGREES else call)
        elif bad.kind == "crash":
            sel.dropped.setdefault(BUGGY_CRASHES, []).append(call)
        else:
            wanted[i] = want
            sel.retyped |= repr(want) != repr(expected)
            sel.exact &= cmp.abs_tol_arg is None and same_value(good.value, want)
            kind[i] = ("looping" if bad.kind == "loop" else
                       "passing" if cmp.matches(bad, args, want) else "failing")  # fmt: skip
    looping = [i for i in sorted(kind) if kind[i] == "looping"]
    keep_looping = [] if "failing" in kind.values() else looping[:bounded]
    for i in looping:
        if i not in keep_looping:
            reason = BUGGY_LOOPS if not keep_looping else f"buggy program loops ({bounded} kept)"
            sel.dropped.setdefault(reason, []).append(_short(_call_text(function, cases[i][0])))
    for i in sorted(kind):
        if kind[i] == "looping" and i not in keep_looping:
            continue
        case = (cases[i][0], wanted[i])
        sel.hidden.append(case)
        {"failing": sel.failing, "passing": sel.passing, "looping": sel.bounded}[kind[i]].append(
            case
        )
    return sel


def explain_no_failing_case(name: str, sel: Selection, n_cases: int) -> str:
    """Why a program gives no task, in terms of what its programs did with its cases."""
    n_kept = len(sel.passing)
    parts = [f"{len(v)} {k}" for k, v in sorted(sel.dropped.items())]
    if n_kept == 0:
        detail = "; ".join(parts) or "no cases"
        return f"{name}: no usable case among {n_cases} ({detail})"
    extra = f" ({'; '.join(parts)})" if parts else ""
    return (f"{name}: the buggy program passes all {n_kept} usable cases of {n_cases}{extra}: "
            "its bug is not exercised by the test data")  # fmt: skip


# ----------------------------------------------------------------------------- writing


def _assertion(function: str, args: tuple, expected: object, cmp: Comparison) -> str:
    call = _call_text(function, args)
    if cmp.materialize:
        call = f"list({call})"
    if cmp.abs_tol_arg is not None:
        return f"assert {call} == pytest.approx({expected!r}, abs={args[cmp.abs_tol_arg]!r})"
    if expected is None or isinstance(expected, bool):
        return f"assert {call} is {expected!r}"
    return f"assert {call} == {expected!r}"


def render_tests(module: str, function: str, cases, cmp: Comparison, hidden: bool) -> str:
    lines = ["import pytest", ""] if cmp.abs_tol_arg is not None else []
    lines += [f"from {module} import {function}", ""]
    for i, (args, expected) in enumerate(cases, 1):
        name = f"test_{function}_{'hidden_' if hidden else ''}{i}"
        lines += ["", f"def {name}():", f"    {_assertion(function, args, expected, cmp)}", ""]
    return "\n".join(lines)


def _list_wrapper(module: str, function: str) -> str:
    return (
        f'"""What {function} yields, as a list: the hidden cases call this (do not edit)."""\n\n'
        f"from {module} import {function} as _{function}\n\n\n"
        f"def {function}(*args):\n    return list(_{function}(*args))\n"
    )


def hidden_cases_spec(module_file: str, function: str, cases) -> dict:
    """hidden_cases.json: arguments and expected values as Python literals (repr)."""
    return {
        "module": module_file,
        "function": function,
        "cases": [{"args": repr(tuple(a)), "expected": repr(e)} for a, e in cases],
    }


@dataclass(frozen=True)
class FunctionTask:
    """Everything `write_function_task` needs besides the case selection."""

    task_id: str
    module: str  # file stem of the program, e.g. "gcd"
    function: str
    buggy_source: str
    fixed_source: str
    family: str
    bug_class: str
    source: str
    split: str = "test"
    extra: dict = field(default_factory=dict)


def write_function_task(
    out: str | Path, spec: FunctionTask, sel: Selection, cmp: Comparison
) -> Task:
    """Write one task folder: repo/<module>.py (buggy), visible tests (failing cases
    first), hidden tests (every kept case), reference.patch, task.json and hidden_cases.json
    when the kept cases compare exactly as plain values."""
    module_file = f"{spec.module}.py"
    repo_files = {
        module_file: spec.buggy_source,
        f"tests/test_{spec.module}.py": render_tests(
            spec.module, spec.function, sel.visible(), cmp, False
        ),
        "pyproject.toml": TASK_PYPROJECT,
    }
    cases_module = module_file
    if cmp.materialize:
        repo_files[LIST_WRAPPER] = _list_wrapper(spec.module, spec.function)
        cases_module = LIST_WRAPPER
    with_cases = sel.exact and cmp.abs_tol_arg is None
    extra = {
        **spec.extra,
        "module": module_file,
        "function": spec.function,
        "comparison": cmp.describe(),
        "n_visible_cases": len(sel.visible()),
        "n_hidden_cases": len(sel.hidden),
        "n_bounded_cases": len(sel.bounded),
        "dropped_cases": sel.dropped,
        "expected_retyped": sel.retyped,
        "hidden_cases": with_cases,
    }
    task = write_task_folder(
        Path(out),
        task_id=spec.task_id,
        instruction=instruction_text(spec.module, DEFAULT_TEST_COMMAND),
        metadata=TaskMetadata(
            spec.family, spec.bug_class, spec.split, spec.source, dict(sorted(extra.items()))
        ),  # fmt: skip
        repo_files=repo_files,
        hidden_test_files={
            f"tests/test_{spec.module}_hidden.py": render_tests(
                spec.module, spec.function, sel.hidden, cmp, True
            )
        },
        reference_patch=unified_diff(module_file, spec.buggy_source, spec.fixed_source),
        test_command=DEFAULT_TEST_COMMAND,
        protected_paths=PROTECTED_PATHS,
    )
    if with_cases:
        data = hidden_cases_spec(cases_module, spec.function, sel.hidden)
        (Path(out) / HIDDEN_CASES_FILE).write_text(
            json.dumps(data, indent=1, sort_keys=True) + "\n"
        )
    return task
