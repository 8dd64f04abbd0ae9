"""Hidden cases of a kept mutant: the function's calls recorded while its covering tests
run on the unmutated repository, kept when the verifier's own case runner reproduces them
there and at least one fails on the mutant."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

from components import pyast
from components.mining.baseline import Repo
from components.mining.candidates import Candidate, covering_tests, first_lines, function_nodes
from components.mining.config import MineConfig
from components.mining.layout import TOOLS, copy_repo
from components.sandbox.config import SandboxConfig
from components.sandbox.process import run_sandboxed
from components.verifier.hidden_cases import CASE_RUNNER, CASES_MARKER

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
    node = next(n for name, n in function_nodes(pyast.parse((repo.root / cand.module).read_text()))
                if name == cand.function)  # fmt: skip
    tools = repo.root / TOOLS
    tools.mkdir(exist_ok=True)
    (tools / "calls.py").write_text(CALLS_RUNNER)
    out = tools / "calls.json"
    out.unlink(missing_ok=True)
    argv = ["python", "-B", f"{TOOLS}/calls.py", str(out), cand.module,
            ",".join(map(str, sorted(first_lines(node)))), cand.function,
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
    copy_repo(repo.root, tree)
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
