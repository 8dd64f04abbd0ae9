"""A generic one-edit neighbourhood of a Python module, from its grammar, ranked by a cheap
score: the candidate fixes behind `list_fixes` (components/env/tool_sets/fix_search/fixes.py).

Why not the generator's operators: the inverses of components/tasks/mutations.py hold the
reference fix of most generated tasks, but a real bug is whatever one edit a programmer got
wrong, not one of thirteen injected classes. So every edit here is named by the grammar
node it changes, applied wherever that node occurs inside a function body (docstrings
skipped, module-level code not touched), and nothing reads the generator:

| kind  | edit |
|-------|------|
| cmp   | a comparison operator -> any other of its family (< <= > >= == !=; in / not in; is / is not) |
| arith | a binary or augmented operator -> any other of its family (+ - * / // % **; << >>; & pipe ^) |
| bool  | `and` <-> `or` |
| not   | a `not` dropped; an if / while / ternary / assert / comprehension condition negated |
| const | an integer literal +-1; True <-> False; 0 <-> None |
| bound | an index, slice bound or range() argument e -> e + 1 / e - 1; an `e +- 1` there -> e |
| var   | a name read -> any other name bound in the function (parameters, assignments, loop and comprehension targets, enclosing functions') |
| args  | two positional arguments of a call exchanged |
| swap  | the operands of a binary operator other than * & pipe ^ exchanged |
| call  | a call to a name or method -> its dual (min/max, any/all, lower/upper, ...); a one-argument call dropped (f(x) -> x) |
| ret   | `return v` for a bound name v added where a function falls off its end, or in place of `pass` / a bare `return` |
| del   | one statement deleted (`pass` where it was a block's only statement) |

The call duals are Python's own antonym pairs (builtins and str methods), the one table here.

Ranking. A module's neighbourhood has hundreds of edits (every name read times every bound
name), too many to list for a small policy, so candidates are ordered by

    score = prior(edit) + 3 * traceback_share(line) + 3 * in_blamed_function

and the listing keeps the top `limit`, ties in reading order. `prior` is the table
`PRIORS` (fix_search/edits.py): higher for the smaller, commoner slips (an operator to
its neighbour, an off-by-one) than for the edits that are many per site (`var`, `del`); it
was set by hand from the grammar and checked on the generated suite's train split, never
on QuixBugs.
`traceback_share(line)`: the share of the module's traceback frames, over every failing
test in the output (not only the deepest frame), that point at that line. `in_blamed_function`:
the edit is inside a function that a failing assertion calls or a traceback frame names.
Without test output both bonus terms are 0 and the order is the prior's.
"""

from __future__ import annotations

import ast
import itertools
import re
import warnings
from collections import Counter
from dataclasses import dataclass

from components import pyast
from components.env.tool_sets.fix_search.edits import (
    FUNCTIONS,
    PRIORS,
    Edit,
    Scope,
    enumerate_edits,
    line_of,
)

# Localisation outweighs the priors (which span 0.3 .. 3.0): in a module of many functions,
# every candidate of a function the failing tests call outranks those of the others, and
# the lines their tracebacks name come first within it.
# Edits scored per listing, at most: a module the agent wrote (run_command can) with
# thousands of names in one function would otherwise cost names x reads edits (millions)
# in the environment's process. Real modules have a few thousand (textwrap.py: 2,191).
MAX_EDITS = 50_000
TRACEBACK_WEIGHT = 3.0
FUNCTION_WEIGHT = 3.0


@dataclass(frozen=True)
class Neighbour:
    """One edit of the module: what it is, where, and the module after it."""

    kind: str  # the id prefix shown to the policy: cmp, var, ...
    lineno: int
    description: str  # "line 5: < -> <="
    source: str  # the whole module after the edit, canonical (ast.unparse + "\n")
    score: float


@dataclass(frozen=True)
class Blame:
    """What failing tests say about a module: traceback frames per line, blamed functions."""

    lines: dict[int, float]  # line -> share of the module's traceback frames on it
    functions: frozenset[str]


NO_BLAME = Blame({}, frozenset())


def blame(test_output: str, path: str | None, functions: set[str]) -> Blame:
    """Every traceback frame in `path`, over every failing test of a pytest output (not only
    the deepest), and the functions of `functions` that a failing line calls (`>` lines of
    the tracebacks) or that a frame in `path` is in."""
    if not test_output:
        return NO_BLAME
    frames: Counter = Counter()
    named: set[str] = set()
    if path:
        pattern = rf"^(?:\S*/)?{re.escape(path)}:(\d+): (?:in (\w+))?"
        for m in re.finditer(pattern, test_output, re.MULTILINE):
            frames[int(m.group(1))] += 1
            if m.group(2):
                named.add(m.group(2))
    for m in re.finditer(r"^>\s+(.*)$", test_output, re.MULTILINE):
        named |= set(re.findall(r"\b(\w+)\s*\(", m.group(1)))
    total = sum(frames.values())
    return Blame({k: v / total for k, v in frames.items()}, frozenset(named & functions))


def _render(tree: ast.Module, edit: Edit) -> str | None:
    holder, key = edit.holder, edit.key
    old = holder[key] if isinstance(holder, list) else getattr(holder, key)
    if isinstance(holder, list):
        holder[key] = edit.new
    else:
        setattr(holder, key, edit.new)
    try:
        return ast.unparse(tree) + "\n"
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    finally:
        if isinstance(holder, list):
            holder[key] = old
        else:
            setattr(holder, key, old)


def function_names(source: str) -> set[str]:
    """The functions a module defines (what `blame` may blame)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in ast.walk(tree) if isinstance(n, FUNCTIONS)}


def neighbourhood(
    source: str, limit: int | None = None, hints: Blame = NO_BLAME
) -> list[Neighbour]:
    """The module's one-edit neighbours, best score first (ties in reading order), distinct
    and each different from the module, at most `limit` (None: all). Raises SyntaxError if
    `source` does not parse."""
    tree = pyast.parse(source)
    scope = Scope(tree)
    original = ast.unparse(tree) + "\n"
    scored = []
    for order, edit in enumerate(itertools.islice(enumerate_edits(scope), MAX_EDITS)):
        prior = PRIORS[edit.prior] if isinstance(edit.prior, str) else edit.prior
        line = line_of(edit.node)
        fn = scope.function.get(id(edit.node), edit.node)
        score = (prior + TRACEBACK_WEIGHT * hints.lines.get(line, 0.0)
                 + FUNCTION_WEIGHT * (getattr(fn, "name", None) in hints.functions))  # fmt: skip
        scored.append((-score, line, order, edit, score))
    scored.sort(key=lambda s: s[:3])
    out: list[Neighbour] = []
    seen = {original}
    descriptions: Counter = Counter()
    for *_, edit, score in scored:
        if limit is not None and len(out) >= limit:
            break
        text = _render(tree, edit)
        if text is None or text in seen:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)  # `x is 1`: valid, and listed
                compile(text, "<candidate>", "exec")
        except (SyntaxError, ValueError):
            continue  # e.g. a `break` left outside its loop
        seen.add(text)
        descriptions[edit.description] += 1
        n = descriptions[edit.description]
        description = edit.description + (f" #{n}" if n > 1 else "")
        out.append(Neighbour(edit.kind, line_of(edit.node), description, text, score))
    return out
