"""The generic one-edit neighbourhood behind list_fixes: each grammar kind reaches the fix
of a hand-written slip of its kind, edits are distinct and parse, the score ranks the lines
the failing tests' tracebacks name first, and listed ids map back to their candidates."""

import ast
import itertools

import pytest

from components.env.tool_sets.fix_search.fixes import (
    FixListing,
    candidate_fixes,
    listed_id,
    render_listing,
)
from components.env.tool_sets.fix_search.neighbourhood import NO_BLAME, blame, neighbourhood

CORRECT = '''def stats(items, k):
    """Docstring: never edited."""
    total = 0
    best = None
    for i in range(1, len(items)):
        if items[i] < 0 and not k:
            continue
        total += items[i] - k
        if best is None or items[i] > best:
            best = max(best or 0, items[i])
    words = " ".join(str(x) for x in items[:k])
    return total, best, words.upper()
'''


def _reaches(buggy: str, correct: str = CORRECT) -> str:
    """The kind of the neighbour of `buggy` that is `correct` (fails if none is)."""
    target = ast.unparse(ast.parse(correct)) + "\n"
    found = [n for n in neighbourhood(buggy) if n.source == target]
    assert found, f"no neighbour of the buggy module is the fix:\n{buggy}"
    return found[0].kind


@pytest.mark.parametrize(
    ("right", "slip", "kind"),
    [
        ("items[i] < 0", "items[i] <= 0", "cmp"),
        ("items[i] - k", "items[i] + k", "arith"),
        ("items[i] - k", "k - items[i]", "swap"),
        ("< 0 and not", "< 0 or not", "bool"),
        ("and not k", "and k", "not"),
        ("and not k", "and not not k", "not"),
        ("range(1, len(items))", "range(2, len(items))", "const"),
        ("best = None", "best = 0", "const"),
        ("range(1, len(items))", "range(1, len(items) - 1)", "bound"),
        ("items[:k]", "items[:k + 1]", "bound"),
        ("total += items[i]", "total += items[k]", "var"),
        ("max(best or 0, items[i])", "max(items[i], best or 0)", "args"),
        ("max(best", "min(best", "call"),
        (".upper()", ".lower()", "call"),
        ("x in items[:k]", "x in list(items[:k])", "call"),
        ("            continue\n", "            continue\n            return total\n", "del"),
        ("total = 0\n", "total = 0\n    total = 1\n", "del"),
    ],
)
def test_each_kind_reaches_the_fix_of_a_slip_of_its_kind(right, slip, kind):
    assert right in CORRECT
    assert _reaches(CORRECT.replace(right, slip, 1)) == kind


def test_each_part_of_a_multi_dimensional_index_is_a_bound():
    fixed = "def f(dp, i, j):\n    return dp[i - 1, j - 1] + 1\n"
    assert _reaches("def f(dp, i, j):\n    return dp[i - 1, j] + 1\n", fixed) == "bound"
    fixed = "def g(grid, r, c):\n    return grid[r, c + 1]\n"
    assert _reaches("def g(grid, r, c):\n    return grid[r, c]\n", fixed) == "bound"


def test_missing_returns_are_added_with_a_bound_name_or_a_returned_literal():
    fixed = "def count(xs):\n    n = 0\n    for x in xs:\n        n += x\n    return n\n"
    assert _reaches("def count(xs):\n    n = 0\n    for x in xs:\n        n += x\n", fixed) == "ret"
    fixed = "def p(n):\n    if n < 2:\n        return False\n    return True\n"
    assert _reaches("def p(n):\n    if n < 2:\n        pass\n    return True\n", fixed) == "ret"


def test_neighbours_are_distinct_parse_and_skip_docstrings():
    neighbours = neighbourhood(CORRECT)
    sources = [n.source for n in neighbours]
    assert (
        len(set(sources)) == len(sources) and ast.unparse(ast.parse(CORRECT)) + "\n" not in sources
    )
    for n in neighbours:
        compile(n.source, "<n>", "exec")
        assert "Docstring: never edited." in n.source
    assert {n.kind for n in neighbours} >= {"cmp", "arith", "bool", "not", "const", "bound",
                                            "var", "args", "swap", "call", "del"}  # fmt: skip
    descriptions = [n.description for n in neighbours]
    assert len(set(descriptions)) == len(descriptions)  # an id's row says which edit it is
    assert [n.source for n in neighbourhood(CORRECT, limit=10)] == sources[:10]
    scores = [n.score for n in neighbours]
    assert scores == sorted(scores, reverse=True)


PYTEST_OUTPUT = """\
    def test_a():
>       assert stats([1, 2], 0) == (3, 2, '12')

tests/test_s.py:4:
_ _ _ _
stats.py:8: in stats
    total += items[i] - k
E   TypeError: unsupported operand
    def test_b():
>       assert stats([5], 1) == (0, 5, '5')

tests/test_s.py:8:
_ _ _ _
stats.py:8: in stats
    total += items[i] - k
E   TypeError: unsupported operand
stats.py:10: TypeError
FAILED tests/test_s.py::test_a
FAILED tests/test_s.py::test_b
"""


def test_blame_counts_frames_of_every_failing_test_and_the_called_functions():
    hints = blame(PYTEST_OUTPUT, "stats.py", {"stats", "other"})
    assert hints.lines == pytest.approx({8: 2 / 3, 10: 1 / 3})
    assert hints.functions == {"stats"}
    assert blame("", "stats.py", {"stats"}) == NO_BLAME


def test_the_blamed_lines_rank_first():
    ranked = neighbourhood(CORRECT, hints=blame(PYTEST_OUTPUT, "stats.py", {"stats"}))
    assert ranked[0].lineno == 8
    plain = neighbourhood(CORRECT)
    assert {n.source for n in ranked} == {n.source for n in plain}  # only the order moved
    assert [n.lineno for n in plain[:3]] != [8, 8, 8]


def test_listed_ids_find_a_candidate_by_its_description():
    fixes = candidate_fixes(CORRECT, 40, test_output=PYTEST_OUTPUT, path="stats.py")
    text = render_listing(FixListing("stats.py", CORRECT, fixes, []), "E   TypeError")
    for f in fixes:
        assert listed_id(text, f.id.rsplit("-", 1)[0], f.description) == f.id
    assert listed_id(text, "cmp", "line 99: nothing") is None
    assert listed_id("no listing", "cmp", fixes[0].description) is None


def test_a_blamed_function_outranks_the_others():
    module = CORRECT + "\n\ndef other(a, b):\n    return a < b and a + 1 > b\n"
    output = ">       assert other(1, 2)\nE   assert False\n"
    ranked = neighbourhood(module, hints=blame(output, "m.py", {"stats", "other"}))
    lines = [n.lineno for n in ranked]
    in_other = [i for i, line in enumerate(lines) if line >= 15]
    assert in_other == list(range(len(in_other)))  # every candidate of `other` first
    assert neighbourhood(module)[0].lineno < 15  # without the output, the priors decide


def test_a_module_with_thousands_of_names_costs_a_bounded_enumeration():
    """Attack: the agent writes (run_command) a module whose one function binds and reads
    hundreds of names, so names x reads is ~10^5 edits; list_fixes must stay cheap."""
    import time

    from components.env.tool_sets.fix_search import edits as ed
    from components.env.tool_sets.fix_search import neighbourhood as nb

    body = "".join(f"    v{i} = v{i - 1} + 1\n" for i in range(1, 400))
    module = "def f(v0):\n" + body + "    return v399\n"
    started = time.monotonic()
    listed = nb.neighbourhood(module, limit=64)
    assert len(listed) == 64 and time.monotonic() - started < 60
    edits = ed.enumerate_edits(ed.Scope(ast.parse(module)))
    assert len(list(itertools.islice(edits, nb.MAX_EDITS + 1))) > nb.MAX_EDITS  # it was cut
