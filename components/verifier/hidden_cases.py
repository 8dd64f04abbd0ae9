"""The hidden cases: function calls whose expected values no run of the agent's code sees.

A task with a reference fix is checked by **differential cases**: argument tuples drawn for
the task (its family's own input generator for a generated task, else shape-keeping
perturbations of the arguments its tests and shipped cases use), with every tuple that
appears in the workspace's tests, the hidden tests or hidden_cases.json left out. Their
expected values come from running the reference fix (the task's repository with
reference.patch applied) under the case runner, in the sandbox though it is trusted code;
the task's own buggy repository runs them too, so the cases kept are first those on which
the bug shows (a lookup table that falls back to the buggy code fails them). Both runs are
cached per task and draw, so a verification pays only for the agent's own case run. A
buggy run that hits its whole-run limit (code that loops past every call's limit) is that
code's outcome: it answers no call and the cases keep draw order (issue 46: bounded, not
refused); a reference fix's run that does is no expected value, so no verdict.

The draw is a pure function of the task (a seed hashed from its id, reference fix and
tests): `agentrl rescore` and `reproduce` see the same cases, and the verdict cache stays
valid. The seed need not be secret: the arguments alone give nothing away (only the case
run sees them, and answering them takes a correct function), and the expected values exist
only in this process. The hidden-test run sees the hidden tests' own expected values (pytest
needs them); no case shares an argument tuple with them, so whatever that run carries to a
later one (host page cache, timing) answers no case.

A Harbor task's checks are its test.sh's own (no stated cases): with a reference fix (what
its solution/solve.sh changes), every repository function its tests call with literal
arguments gets differential cases the same way, run after test.sh passed.

A task without a reference fix keeps the older cases: its hidden_cases.json (compared with
exact types), else cases read off hidden tests that are plain `assert f(literals) ==
literal` lines (compared with ==); those the hidden-test run can see.

Either way, another fresh tree from the snapshot, without the hidden tests, runs each
function on the arguments only under the case runner (case_runner.py); the results are
compared here.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import json
import random
import secrets
import shutil
import threading
from pathlib import Path

from components import pyast, shutdown
from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult, run_sandboxed
from components.tasks.families import FAMILIES
from components.tasks.harbor import is_harbor_task
from components.tasks.patching import PatchError, apply_unified_diff
from components.tasks.task import Task, same_value
from components.verifier.checks import (
    Check,
    VerifierSettings,
    isolated_python,
    last_marker,
    limit_of,
    no_verdict,
    ran_after_verdict,
)

CASES_MARKER = "AGENTRL-CASES"
# The case runner program, shipped into each tree as it is (case_runner.py).
CASE_RUNNER = (Path(__file__).parent / "case_runner.py").read_text()


def _module_file(repo: Path, dotted: str, roots: tuple[str, ...] = ("",)) -> str | None:
    base = dotted.replace(".", "/")
    for rel in [f"{root}{base}{end}" for root in roots for end in (".py", "/__init__.py")]:
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


def _imported(
    tree: ast.Module, repo: Path, roots: tuple[str, ...] = ("",)
) -> dict[str, tuple[str, str]]:
    """name -> (module file, function) of every `from module import f` of a repo module
    (under one of `roots`: "" the repository's top, "src/" a src layout's)."""
    imported: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = _module_file(repo, node.module, roots)
            if module is not None:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (module, alias.name)
    return imported


def derive_cases(task: Task) -> list[dict]:
    """Hidden cases read off hidden tests whose every statement is `assert f(literals) ==
    literal` with f imported from a repository module (`from gcd import gcd`): the
    imported benchmarks' shape. Other tests stay pytest-only."""
    cases: list[dict] = []
    for rel in task.hidden_test_files():
        if not rel.endswith(".py"):
            continue
        tree = pyast.parse((task.hidden_tests_dir / rel).read_text())
        imported = _imported(tree, task.repo_dir)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
                continue
            body = node.body[1:] if ast.get_docstring(node) else node.body
            found = [_derived_case(stmt, imported) for stmt in body]
            if found and all(found):
                cases.extend(found)
    return cases


def shipped_cases(task: Task) -> tuple[list[dict], str]:
    """(cases, comparison) the task states: its hidden_cases.json compared with exact types,
    else the cases derived from its hidden tests compared with == (as the tests do)."""
    if task.hidden_cases_path is not None:
        spec = json.loads(task.hidden_cases_path.read_text())
        cases = [{"module": spec["module"], "function": spec["function"], **c}
                 for c in spec["cases"]]  # fmt: skip
        return cases, "exact"
    return derive_cases(task), "equal"


def hidden_cases(task: Task) -> tuple[list[dict], str]:
    """(cases, comparison): differential cases for a task with a reference fix (their
    expected values are computed by `cases_check`, see the module docstring), else the
    cases the task states (`shipped_cases`)."""
    if task.has_reference:
        drawn = differential_arguments(task)
        if drawn:
            return [{**c, "task": task} for c in drawn], "differential"
    return shipped_cases(task)


def _case_matches(result: dict, expected: str, comparison: str) -> bool:
    if "repr" not in result:
        return False
    try:
        got, want = ast.literal_eval(result["repr"]), ast.literal_eval(expected)
        # Both are plain values here (the runner refuses anything else), so == is ours.
        if comparison == "differential":
            return _differential_match(got, want)
        return same_value(got, want) if comparison == "exact" else bool(got == want)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def cases_check(
    cases: list[dict], comparison: str, tree: Path, env: VerifierSettings, cfg: SandboxConfig
) -> Check:
    """Run the cases' arguments in `tree` (which must not hold the hidden tests) and compare
    the results with the expected values here; differential cases get theirs from the
    reference fix first (`reference_cases`)."""
    if comparison == "differential":
        answered = reference_cases(cases[0]["task"], cases, env, cfg)
        if isinstance(answered, str):
            return Check(total=1, failed=1, lost=answered)
        if not answered:
            return Check(passed=True, detail="no drawn case has an answer of the reference fix")
        cases = answered
    calls = [[c["module"], c["function"], c["args"]] for c in cases]
    cmd, token = _runner_results(tree, calls, env.per_test_timeout_s, cfg)
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
        check.forged += [after for after in [ran_after_verdict(cmd)] if after]
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
    if comparison == "differential":  # a failed case answered as the bug does, or otherwise
        as_bug = sum(c["bug_shows"] and r.get("repr") == c["unfixed"]
                     for c, r in zip(cases, results, strict=True))  # fmt: skip
        check.detail += f" ({as_bug} answered as the unfixed code does)"
        lost = cases[0].get("unfixed_lost") if cases else ""  # the ranking's own run
        if lost:
            check.detail += f"; {lost}, so it answers none"
        check.answered_otherwise = sum(
            "repr" in r and r["repr"] != c["unfixed"] and not _case_matches(r, c["expected"], comparison)
            for c, r in zip(cases, results, strict=True)
        )  # fmt: skip
    return check


# ----------------------------------------------------------------- differential cases

DIFFERENTIAL_SALT = "agentrl-differential/1"  # a new salt draws new cases for every task
MAX_CANDIDATES = 32  # argument tuples the reference fix and the buggy code answer
MAX_DIFFERENTIAL = 12  # cases a verification runs: those the bug shows on first
UNFIXED_CALL_S = 0.5  # CPU seconds a call of the task's buggy code gets when ranking cases
ROOM_S = 30.0  # wall seconds a run of the task's own code gets beyond 2x its calls' limits
_REFERENCE: dict[tuple[str, ...], list[dict]] = {}  # (task, draw, interpreter) -> cases
_REFERENCE_LOCK = threading.Lock()


def _normal(text: str) -> str | None:
    """The canonical repr of an argument tuple's text (None: not a plain literal)."""
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _test_sources(task: Task) -> list[tuple[Path, Path]]:
    """(file, repository root its imports resolve in) of every Python file that can show
    the agent or the hidden-test run an argument: the hidden tests and the workspace's."""
    files = [(task.hidden_tests_dir / rel, task.repo_dir) for rel in task.hidden_test_files()]
    files += [(p, task.repo_dir) for p in sorted(task.repo_dir.rglob("*.py"))
              if p.is_file() and _is_test_file(p.relative_to(task.repo_dir))]  # fmt: skip
    return [(f, repo) for f, repo in files if f.suffix == ".py"]


def _is_test_file(rel: Path) -> bool:
    """Where a repository keeps expected values: test modules, conftest, test folders."""
    name = rel.name
    return (name.startswith("test") or name.endswith("_test.py") or name == "conftest.py"
            or any(part in ("test", "tests", "testing") for part in rel.parts[:-1]))  # fmt: skip


def _literal_calls(task: Task) -> dict[tuple[str, str], set[str]]:
    """(module, function) -> argument tuples (canonical reprs; "" for one that is not a
    plain literal) of every call with literal arguments of a repository function in the
    tests and the workspace."""
    calls: dict[tuple[str, str], set[str]] = {}
    for path, repo in _test_sources(task):
        try:
            tree = pyast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
            continue
        imported = _imported(tree, repo, ("", "src/"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in imported
                and not node.keywords
                and all(_literal(a) and not isinstance(a, ast.Starred) for a in node.args)
            ):
                text = _normal(ast.unparse(ast.Tuple(elts=list(node.args), ctx=ast.Load())))
                calls.setdefault(imported[node.func.id], set()).add(text or "")
    return calls


def _seen_calls(task: Task) -> dict[tuple[str, str], set[str]]:
    """(module, function) -> argument tuples (canonical reprs) that appear anywhere an
    agent's run can read them, for each function the task's stated cases call (a Harbor
    task states none of its own: each repository function its tests call with literal
    arguments): its literal calls in the tests and the workspace, and the stated cases."""
    calls = _literal_calls(task)
    stated = shipped_cases(task)[0]
    targets = {(c["module"], c["function"]) for c in stated}
    if is_harbor_task(task):  # test.sh's checks are its own: the functions they call
        targets |= set(calls)
    seen = {t: set(calls.get(t, ())) for t in targets}
    for case in stated:
        seen[(case["module"], case["function"])].add(_normal(case["args"]) or "")
    return seen


def _draw_seed(task: Task) -> str:
    """The draw's seed: the task's id, reference fix and tests, by their paths in the task
    folder (rescore and reproduce draw the same, wherever the folder lies)."""
    h = hashlib.sha256(f"{DIFFERENTIAL_SALT}\0{task.id}\0".encode())
    h.update((task.reference_patch() or "").encode())
    for path, _ in _test_sources(task):
        h.update(str(path.relative_to(task.root)).encode() + b"\0" + path.read_bytes())
    if task.hidden_cases_path is not None:
        h.update(task.hidden_cases_path.read_bytes())
    return h.hexdigest()


def _sign(x: int | float) -> int:
    return (x > 0) - (x < 0)


def _shape(value: object) -> object:
    """What a perturbed argument must keep of the example it came from: types, signs,
    sortedness, distinct elements, equal row lengths; a case outside the function's
    domain would hold an honest fix to whatever the reference happens to do there."""
    t = type(value)
    if t in (int, float):
        return (t.__name__, _sign(value))
    if t is str:
        return ("str", value == "", value.isalpha(), value.islower(), value.isupper(),
                value.isdigit(), value.isspace())  # fmt: skip
    if t in (list, tuple):
        kinds = tuple(sorted({_kind(x) for x in value}))
        rows = {len(x) for x in value if type(x) in (list, tuple, str)}
        try:
            ordered = all(a <= b for a, b in zip(value, value[1:], strict=False))  # type: ignore[operator]
        except TypeError:
            ordered = False
        distinct = len({repr(x) for x in value}) == len(value)
        signs = tuple(sorted({_sign(x) for x in value if type(x) in (int, float)}))
        fixed = len(value) if t is tuple else value == []
        return (t.__name__, kinds, len(rows) <= 1, ordered, distinct, signs, fixed)
    if t is dict:
        return ("dict", tuple(sorted({_kind(v) for v in value.values()})), value == {})
    return (t.__name__, repr(value))  # kept exactly: None, bool, bytes, sets...


def _kind(value: object) -> str:
    return type(value).__name__ + ("" if type(value) not in (list, tuple) else
                                   "/" + ",".join(sorted({_kind(x) for x in value})))  # fmt: skip


def _perturbed(value: object, rng: random.Random, alphabet: str) -> object:
    """One small change of a plain value (its shape is checked by the caller)."""
    t = type(value)
    if t is int:
        return value + rng.choice((1, 2, 3, 5, 10)) * rng.choice((-1, 1))
    if t is float:
        return round(value * rng.uniform(0.5, 1.5) + rng.choice((-1, 0, 1)), 3)
    if t is str:
        chars, op = list(value), rng.randrange(3)
        if op == 0 and chars:
            chars[rng.randrange(len(chars))] = rng.choice(alphabet)
        elif op == 1 or not chars:
            chars.insert(rng.randrange(len(chars) + 1), rng.choice(alphabet))
        else:
            del chars[rng.randrange(len(chars))]
        return "".join(chars)
    if t in (list, tuple) and value:
        items, op = list(value), rng.randrange(3 if t is list else 1)
        i = rng.randrange(len(items))
        if op == 0:
            items[i] = _perturbed(items[i], rng, alphabet)
        elif op == 1:
            items.insert(i, _perturbed(items[i], rng, alphabet))
        else:
            del items[i]
        if t is list and _shape(value)[3]:  # a sorted list stays sorted
            with contextlib.suppress(TypeError):
                items.sort()
        return t(items)
    if t is dict and value:
        key = rng.choice(sorted(value, key=repr))
        return {**value, key: _perturbed(value[key], rng, alphabet)}
    return value


def _perturbations(examples: list[tuple], rng: random.Random, n: int) -> list[tuple]:
    """Up to n argument tuples, each an example with one to three arguments changed and
    the same shape, argument by argument and in the order of its numbers."""
    alphabet = "".join(sorted({ch for e in examples for ch in repr(e) if ch.isalnum()})) or "ab"
    out: list[tuple] = []
    for _ in range(n * 8):
        if len(out) >= n or not examples:
            break
        example = rng.choice(examples)
        if not example:
            continue
        args = list(example)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(args))
            args[i] = _perturbed(args[i], rng, alphabet)
        order = [_sign(a - b) for a in example for b in example
                 if type(a) in (int, float) and type(b) in (int, float)]  # fmt: skip
        new = [_sign(a - b) for a in args for b in args
               if type(a) in (int, float) and type(b) in (int, float)]  # fmt: skip
        if order == new and [_shape(a) for a in args] == [_shape(a) for a in example]:
            out.append(tuple(args))
    return out


def _family_draws(task: Task, seed: str) -> list[tuple]:
    """Fresh inputs from a generated task's family (its own input generator, so they are
    inside the function's domain), under the draw's seed."""
    family = next((f for f in FAMILIES if f.name == task.metadata.family), None)
    if task.metadata.source != "builtin" or family is None:
        return []
    out: list[tuple] = []
    for k in range(6):
        rng = random.Random(f"{seed}/family/{k}")
        try:
            out += [tuple(c) for c in family.cases(rng, family.consts(rng))]
        except (KeyError, ValueError, TypeError, IndexError):
            break  # constants another rendering chose: the perturbations still apply
    return out


def differential_arguments(task: Task) -> list[dict]:
    """Argument tuples for each function the task's cases or tests call, none of them
    anywhere an agent's run can read (see the module docstring); expected values are the
    reference fix's (`reference_cases`)."""
    seen = _seen_calls(task)
    seed = _draw_seed(task)
    rng = random.Random(seed)
    drawn: list[dict] = []
    for (module, function), texts in sorted(seen.items()):
        examples = [ast.literal_eval(t) for t in sorted(texts) if t]
        examples = [e for e in examples if type(e) is tuple]
        if not examples:
            continue
        candidates = _family_draws(task, seed) + _perturbations(examples, rng, MAX_CANDIDATES)
        fresh: list[str] = []
        for args in candidates:
            text = _normal(repr(args))
            if text is not None and text not in texts and text not in fresh:
                fresh.append(text)
        drawn += [{"module": module, "function": function, "args": a, "expected": None}
                  for a in fresh[:MAX_CANDIDATES]]  # fmt: skip
    return drawn


def _runner_results(tree: Path, calls: list[list[str]], per_call_s: float,
                    cfg: SandboxConfig) -> tuple[CommandResult, str]:  # fmt: skip
    """The case runner on `calls` ([module, function, args]) in `tree`, each call limited to
    `per_call_s` of CPU and unstarved wall time: its command and the token of its line."""
    token = secrets.token_hex(8)
    tools = tree / f".agentrl-{token}"
    tools.mkdir()
    (tools / "runner.py").write_text(CASE_RUNNER)
    (tools / "args.json").write_text(json.dumps(calls))
    argv = [*isolated_python(cfg), f"{tools.name}/runner.py", token, f"{tools.name}/args.json",
            f"{per_call_s:g}"]  # fmt: skip
    return run_sandboxed(argv, tree, cfg, readonly=(tools,)), token


def _answers(tree: Path, calls: list[list[str]], per_call_s: float, cfg: SandboxConfig,
             what: str) -> list[str | None] | str:  # fmt: skip
    """The repr each call returns in the task's own tree (None: it raised, ran past its
    limit or gave no plain value), or why the run (`what` names it) gave none."""
    # The task's own code: room for every call to use its limit, so load costs no answer.
    wall = max(cfg.wall_time_s, ROOM_S + 2 * len(calls) * per_call_s)
    cfg = dataclasses.replace(cfg, wall_time_s=wall, cpu_time_s=max(cfg.cpu_time_s, int(wall)))
    cmd, token = _runner_results(tree, calls, per_call_s, cfg)
    _, got = last_marker(cmd.output, f"{CASES_MARKER} {token} ")
    if not isinstance(got, dict) or not isinstance(got.get("results"), list):
        return no_verdict(cmd, what)
    out = [r.get("repr") if isinstance(r, dict) else None for r in got["results"]]
    return (out + [None] * len(calls))[: len(calls)]


def reference_cases(task: Task, drawn: list[dict], env: VerifierSettings,
                    cfg: SandboxConfig) -> list[dict] | str:  # fmt: skip
    """The drawn cases with the reference fix's answers as expected values (those it
    answers twice alike; those the task's buggy code answers otherwise first), or why there
    are none. Two sandboxed runs, cached per task, draw and interpreter: a task's first
    verification in a process pays for them, every later one only for its own case run."""
    calls = [[c["module"], c["function"], c["args"]] for c in drawn]
    patch = task.reference_patch() or ""
    key = (str(task.root), hashlib.sha256(f"{patch}\0{calls!r}".encode()).hexdigest(),
           cfg.python_env, f"{env.per_test_timeout_s:g}")  # fmt: skip
    with _REFERENCE_LOCK:
        kept = _REFERENCE.get(key)
    if kept is not None:
        return [dict(c) for c in kept]
    with shutdown.temporary_folder("agentrl-reference-") as tmp:
        fixed, buggy = Path(tmp) / "fixed", Path(tmp) / "buggy"
        for tree in (fixed, buggy):
            shutil.copytree(task.repo_dir, tree, symlinks=True)
        try:
            apply_unified_diff(fixed, patch)
        except PatchError as e:
            return f"the reference fix does not apply: {e}"
        # The reference answers every call twice, in one process: an answer that changes
        # (time, randomness, state kept between calls) is no expected value.
        reference = "the reference fix's case run"
        twice = _answers(fixed, calls + calls, env.per_test_timeout_s, cfg, reference)
        if isinstance(twice, str):  # no expected value: the task cannot be checked
            return twice
        # The buggy code only ranks the cases (a bug that loops ends at a short limit).
        per_call = min(env.per_test_timeout_s, UNFIXED_CALL_S)
        once = _answers(buggy, calls, per_call, cfg, "the unfixed code's case run")
    # A buggy run that loops past the whole run's limit (or crashes) is the buggy code's
    # own outcome (issue 46: bounded, not refused): it answers none of the calls.
    unfixed_lost = once if isinstance(once, str) else ""
    if unfixed_lost:
        once = [None] * len(calls)
    fixed_out, again_out, buggy_out = twice[: len(calls)], twice[len(calls) :], once
    unfixed = {id(c): b for c, b in zip(drawn, buggy_out, strict=True)}
    answered = [(c, f, f != b) for c, f, g, b in zip(drawn, fixed_out, again_out, buggy_out,
                                                      strict=True) if f is not None and f == g]  # fmt: skip
    # Every case the bug shows on (up to the bound), then the others, in draw order.
    telling = [c for c, _, shows in answered if shows]
    chosen = (telling + [c for c, _, shows in answered if not shows])[:MAX_DIFFERENTIAL]
    # "unfixed": what the task's buggy code answers (None: it raised), for the detail.
    cases = [{**c, "expected": f, "bug_shows": shows, "unfixed": unfixed[id(c)],
              "unfixed_lost": unfixed_lost} for c, f, shows in answered if c in chosen]  # fmt: skip
    with _REFERENCE_LOCK:
        _REFERENCE[key] = [dict(c) for c in cases]
    return cases


def _differential_match(got: object, want: object) -> bool:
    """The reference's value and the code's agree: equal with the same types, except that
    numbers compare by value (2 == 2.0, as the tests' == does; a bool is no number here)."""
    numbers = (int, float)
    if type(got) in numbers and type(want) in numbers:
        return got == want or (got != got and want != want)  # NaN answers NaN
    if type(got) is not type(want):
        return False
    if type(got) in (list, tuple):
        return len(got) == len(want) and all(
            _differential_match(a, b) for a, b in zip(got, want, strict=True)
        )
    if type(got) is dict:
        return got.keys() == want.keys() and all(_differential_match(got[k], want[k]) for k in got)
    return bool(got == want)
