"""Families render valid, varied code; every operator yields valid mutants; screening."""

from __future__ import annotations

import ast
import builtins
import keyword
import random
import sys
from collections import Counter

import pytest

from components.tasks.families import FAMILIES, render
from components.tasks.generate import expected_cases, screen_mutant
from components.tasks.mutations import (
    OPERATORS,
    apply_edit,
    count_edits,
    enumerate_mutants,
    get_operator,
    random_mutant,
)

BUDGET = 20_000


def test_at_least_32_families_and_8_operators():
    assert len(FAMILIES) >= 32
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert len(OPERATORS) >= 8
    assert len({op.name for op in OPERATORS}) == len(OPERATORS)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_renders_correct_varied_code_with_valid_mutants(family):
    for mod in family.modules:
        assert mod.isidentifier() and mod not in sys.stdlib_module_names, mod
    reserved = set(dir(builtins)) | set(keyword.kwlist)
    for pool in [family.functions, *family.names.values()]:
        assert not reserved & set(pool), f"{family.name}: shadows a builtin/keyword"
    sources = set()
    for seed in range(4):
        v = render(family, random.Random(seed))
        sources.add(v.source)
        tree = ast.parse(v.source)
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        n_lines = fn.end_lineno - fn.lineno + 1
        assert 3 <= n_lines <= 22, f"{family.name}: {n_lines} lines"
        assert len(expected_cases(v, BUDGET)) >= 5
    assert len(sources) >= 3, f"{family.name}: renders are not varied enough"
    # At least one screened (failing, terminating) mutant from several operators.
    v = render(family, random.Random(0))
    cases = expected_cases(v, BUDGET)
    ok_ops = set()
    for op in OPERATORS:
        for k in range(min(count_edits(v.source, op), 4)):
            m = apply_edit(v.source, op, k)
            if m and screen_mutant(m.source, v, cases, BUDGET)[0] == "ok":
                ok_ops.add(op.name)
                break
    assert len(ok_ops) >= 3, f"{family.name}: only {ok_ops}"


def test_every_operator_produces_valid_mutants_on_many_families():
    per_op: Counter = Counter()
    for family in FAMILIES:
        v = render(family, random.Random(1))
        cases = expected_cases(v, BUDGET)
        for op in OPERATORS:
            for k in range(min(count_edits(v.source, op), 3)):
                m = apply_edit(v.source, op, k)
                if m is None:
                    continue
                compile(m.source, "<m>", "exec")
                assert m.source != v.source and m.operator == op.name
                if screen_mutant(m.source, v, cases, BUDGET)[0] == "ok":
                    per_op[op.name] += 1
                    break
    for op in OPERATORS:
        assert per_op[op.name] >= 3, f"{op.name} valid on only {per_op[op.name]} families"


SAMPLE = """
def f(xs, k):
    \"\"\"Doc 1 stays.\"\"\"
    total = 0
    for i in range(len(xs)):
        if xs[i] < k and not xs[i] == 0:
            total += xs[i] - 1
    best = max(total, k)
    return best
"""


@pytest.mark.parametrize(
    "name, expected",
    [
        ("arith_swap", "total += xs[i] + 1"),
        ("comparison_swap", "xs[i] <= k"),
        ("boolop_swap", "xs[i] < k or"),
        ("constant_off_by_one", "total = 1"),
        ("bound_off_by_one", "range(len(xs) + 1)"),
        ("wrong_variable", "total += k[i]"),
        ("negation_flip", "and xs[i] == 0"),
        ("missing_return", "best = max(total, k)"),
        ("early_return", "        return best"),
        ("swapped_args", "max(k, total)"),
        ("operand_swap", "1 - xs[i]"),
        ("wrong_init", "total = 1"),
        ("call_swap", "min(total, k)"),
    ],
)
def test_operator_sites(name, expected):
    op = get_operator(name)
    mutants = [apply_edit(SAMPLE, op, k) for k in range(count_edits(SAMPLE, op))]
    texts = [m.source for m in mutants if m is not None]
    assert texts, name
    assert any(expected in t for t in texts), (name, texts)
    if name == "missing_return":
        assert any("return" not in t for t in texts)
    assert all("Doc 1 stays." in t for t in texts)  # docstrings are never mutated


def test_mutants_are_deterministic():
    a = [m.source for m in enumerate_mutants(SAMPLE)]
    b = [m.source for m in enumerate_mutants(SAMPLE)]
    assert a == b and len(a) == len(set(a)) > 30
    m1 = random_mutant(SAMPLE, random.Random(3))
    m2 = random_mutant(SAMPLE, random.Random(3))
    assert m1 == m2 and m1 is not None


def test_screen_rejects_loops_and_equivalents():
    family = next(f for f in FAMILIES if f.name == "run_length_encode")
    v = render(family, random.Random(0))
    cases = expected_cases(v, BUDGET)
    verdicts = Counter(
        screen_mutant(m.source, v, cases, BUDGET)[0] for m in enumerate_mutants(v.source)
    )
    assert verdicts["timeout"] > 0 and verdicts["ok"] > 0
    assert screen_mutant(v.source, v, cases, BUDGET) == ("equivalent", [])
