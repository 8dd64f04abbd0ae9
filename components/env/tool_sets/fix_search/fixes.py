"""Candidate fixes offered by the environment: the `list_fixes` and `try_fix` tools.

Why: a tiny policy trained on a CPU cannot copy a file path and a buggy line out of its
context reliably (held-out identifiers split into rare tokens), so free-form `edit_file`
calls fail on form before they can fail on substance. These two tools move the copying
into the environment and leave the decision to the policy:

- `list_fixes` runs the task's tests, localises the module they blame (the traceback's
  deepest frame outside tests/, else the module the test imports), and lists one-edit
  changes of that module: a generic neighbourhood from Python's grammar (operator swaps,
  +-1 on constants and bounds, a name for another bound name, argument order, a missing or
  extra return / negation / call / statement; components/env/tool_sets/fix_search/neighbourhood.py), ranked by
  a cheap score (a prior per edit, plus the lines every failing test's traceback names and
  the functions the failing assertions call, when the test output is passed) and cut at
  `limit`. The listing groups the candidates by kind (render_listing); the module itself
  is not repeated. `operator_fixes` keeps the earlier listing, the inverses of the bug
  generator's operators (components/tasks/mutations.py), for comparison
  (bench/fix_coverage.py).
- `try_fix {"id": "call-1"}` restores the module to its listed text, writes candidate k, reruns
  the tests and reports the outcome, so a wrong guess costs one turn and is undone by the
  next try.

A candidate is found on the parsed module, but what `try_fix` writes is the module's own
text with only the changed node's span rewritten (`edit_in_place`): comments, blank lines
and formatting elsewhere survive, so on external code (not in `ast.unparse`'s canonical
form, as the generated suite is) the stored diff, and the patch-size metrics read off it,
show the one line that was fixed. Candidates are still compared, and deduplicated, by their
canonical text (`source`), which is how the oracle matches the reference fix.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from components import pyast
from components.env.tool_sets.fix_search.neighbourhood import blame, function_names
from components.env.tool_sets.fix_search.neighbourhood import neighbourhood as grammar_neighbourhood
from components.tasks.mutations import enumerate_mutants, normalize

# pytest's own lines worth keeping in a short observation.
_KEEP = re.compile(r"^(FAILED|ERROR|E   |>   |\S+\.py:\d+: |=+ .*(passed|failed|error).* =+$)")


# Candidate ids say what kind of change they are ("call-1": the first call swap in reading
# order), so a policy can learn which kinds of fix tend to be right from the id it writes,
# without having to map a row number back to the row's text.
KIND = {
    "arith_swap": "arith", "comparison_swap": "cmp", "boolop_swap": "bool",
    "constant_off_by_one": "const", "bound_off_by_one": "bound", "wrong_variable": "var",
    "negation_flip": "not", "missing_return": "ret", "early_return": "loop",
    "swapped_args": "args", "operand_swap": "swap", "wrong_init": "init", "call_swap": "call",
}  # fmt: skip


@dataclass(frozen=True)
class FixCandidate:
    id: str  # "<kind>-<n>", as shown to the policy
    lineno: int
    description: str  # "line 5: entries -> v"
    source: str  # the whole module after the change, canonical (ast.unparse): for comparing
    text: str  # the module's own text with only the changed code rewritten: what try_fix writes
    score: float = 0.0  # the ranking score (components/env/tool_sets/fix_search/neighbourhood.py); 0 for operators


@dataclass
class FixListing:
    """What the last `list_fixes` showed: the module, its text then, and the candidates."""

    path: str
    base_text: str
    candidates: list[FixCandidate]
    tried: list[str]

    def get(self, fix_id: str) -> FixCandidate | None:
        return next((c for c in self.candidates if c.id == fix_id), None)

    def untried_ids(self) -> list[str]:
        return [c.id for c in self.candidates if c.id not in self.tried]


def locate(test_output: str, files: list[str]) -> tuple[str | None, int | None, str | None]:
    """(module, deepest traceback line in it or None, failing function or None)."""
    module, line = None, None
    for m in re.finditer(r"^(\S+\.py):(\d+): ", test_output, re.MULTILINE):
        path = m.group(1)
        if not path.startswith("tests/") and (not files or path in files):
            module, line = path, int(m.group(2))  # later frames are deeper
    function = None
    assertion = re.search(r"^>\s+assert\s+(?:not\s+)?(\w+)\(", test_output, re.MULTILINE)
    if assertion:
        function = assertion.group(1)
    if module is None:
        imported = re.search(r"from (\w+) import", test_output)
        if imported and f"{imported.group(1)}.py" in files:
            module = f"{imported.group(1)}.py"
    return module or (files[0] if files else None), line, function


def fix_kind(fix_id: str) -> str:
    """The kind a candidate id names: `cmp` of `cmp-2` (ids are `kind-number`)."""
    return str(fix_id).rsplit("-", 1)[0]


NEIGHBOURHOODS = ("grammar", "operators")


def candidate_fixes(
    source: str,
    limit: int,
    test_output: str = "",
    path: str | None = None,
    neighbourhood: str = "grammar",
) -> list[FixCandidate]:
    """One-edit variants of `source`, at most `limit`, best first.

    "grammar" (the default): the generic neighbourhood of components/env/tool_sets/fix_search/neighbourhood.py,
    ranked by its score; `test_output` (the tests' pytest output) and `path` (the module's
    path in it) add the localisation terms. Ids number each kind in rank order (`cmp-1` is
    the best-ranked comparison swap). "operators": `operator_fixes`.
    Raises SyntaxError if `source` does not parse (there is nothing to enumerate then)."""
    if neighbourhood == "operators":
        return operator_fixes(source, limit)
    if neighbourhood != "grammar":
        raise ValueError(f"unknown neighbourhood {neighbourhood!r}: one of {NEIGHBOURHOODS}")
    hints = blame(test_output, path, function_names(source))
    canonical = source == normalize(source) + "\n"
    tree = None if canonical else pyast.parse(source)
    seen: dict[str, int] = {}
    out = []
    for n in grammar_neighbourhood(source, limit, hints):
        seen[n.kind] = seen.get(n.kind, 0) + 1
        text = n.source if canonical else _edit_in_place(_Text(source), tree, n.source[:-1])
        out.append(FixCandidate(f"{n.kind}-{seen[n.kind]}", n.lineno, n.description, n.source,
                                text, n.score))  # fmt: skip
    return out


def operator_fixes(source: str, limit: int) -> list[FixCandidate]:
    """The earlier listing: the bug generator's operators applied to `source` (most are
    their own inverse), in reading order (line, then operator), at most `limit`."""
    tree = pyast.parse(source)
    mutants = enumerate_mutants(source)
    order = sorted(range(len(mutants)), key=lambda i: (mutants[i].lineno, i))[:limit]
    # A module already in canonical form (the generated suite) needs no search: its mutant's
    # canonical text differs from it only where the edit is.
    canonical = source == normalize(source) + "\n"
    seen: dict[str, int] = {}
    out = []
    for i in order:
        m = mutants[i]
        kind = KIND.get(m.operator, m.operator)
        seen[kind] = seen.get(kind, 0) + 1
        text = m.source + "\n" if canonical else _edit_in_place(_Text(source), tree, m.source)
        out.append(FixCandidate(f"{kind}-{seen[kind]}", m.lineno, m.description,
                                m.source + "\n", text))  # fmt: skip
    return out


# ----------------------------------------------------------------------------- in-place edits


class _Text:
    """A module's text, addressed the way `ast` locates nodes (line, UTF-8 byte column)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = re.split(r"(?<=\n)", source)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),
                self.offset(node.end_lineno, node.end_col_offset))  # fmt: skip

    def outer_span(self, node: ast.AST) -> tuple[int, int]:
        """The node's span with the parentheses around it (`(a + b)`, which `ast` leaves
        out): what moves with the node when it trades places with a sibling."""
        start, end = self.span(node)
        while True:
            before = self.source[:start].rstrip()
            after = self.source[end:]
            gap = len(after) - len(after.lstrip())
            if not (before.endswith("(") and after[gap : gap + 1] == ")"):
                return start, end
            start, end = len(before) - 1, end + gap + 1

    def indent(self, node: ast.AST) -> str | None:
        """The whitespace before `node` on its first line; None if code precedes it there."""
        before = self.source[self.starts[node.lineno - 1] : self.span(node)[0]]
        return before if not before.strip() else None

    def replace(self, edits: list[tuple[int, int, str]]) -> str:
        out = self.source
        for start, end, new in sorted(edits, reverse=True):
            out = out[:start] + new + out[end:]
        return out


def _dump(value: object) -> str:
    if isinstance(value, ast.AST):
        return ast.dump(value)
    if isinstance(value, list):
        return repr([_dump(v) for v in value])
    return repr(value)


def _change(a: object, b: object) -> tuple[list[tuple], list[tuple]] | None:
    """Where trees `a` and `b` differ (None: nowhere): the path of node pairs from the roots
    down to the deepest pair that holds every difference, and the differing (a, b) field
    values there (two for a swap; a pair of lists of unequal length for an added or removed
    statement). One walk over both trees."""
    if not isinstance(a, ast.AST) or type(a) is not type(b):
        return None if type(a) is type(b) and a == b else ([(a, b)], [])
    diffs: list[tuple] = []
    for name, va in ast.iter_fields(a):
        vb = getattr(b, name, None)
        if isinstance(va, list) and isinstance(vb, list) and len(va) != len(vb):
            diffs.append((va, vb, None))
            continue
        pairs = (
            zip(va, vb, strict=True)
            if isinstance(va, list) and isinstance(vb, list)
            else [(va, vb)]
        )
        diffs += [(x, y, d) for x, y in pairs if (d := _change(x, y)) is not None]
    if not diffs:
        return None
    if len(diffs) == 1 and isinstance(diffs[0][0], ast.AST) and isinstance(diffs[0][1], ast.AST):
        path, inner = diffs[0][2]
        return [(a, b), *path], inner
    return [(a, b)], [(x, y) for x, y, _ in diffs]


def _unparse_at(node: ast.AST, indent: str) -> str:
    return ast.unparse(node).replace("\n", "\n" + indent)


def _swap_edits(text: _Text, diffs: list[tuple]):
    """Children that traded places, each rewritten with the original text of the sibling it
    equals (swapped arguments or operands keep their own spelling): with their parentheses,
    then without, then parenthesized."""
    if len(diffs) < 2 or not all(isinstance(x, ast.expr) and isinstance(y, ast.AST)
                                 for x, y in diffs):  # fmt: skip
        return
    for span, wrap in ((text.outer_span, "{}"), (text.span, "{}"), (text.span, "({})")):
        own = {_dump(x): text.source[slice(*span(x))] for x, _ in diffs}
        yield text.replace(
            [(*span(x), wrap.format(own.get(_dump(y)) or ast.unparse(y))) for x, y in diffs]
        )


def _statement_edit(text: _Text, diffs: list[tuple]) -> str | None:
    """One statement removed (its lines deleted) or added (a line inserted at the
    indentation of its neighbour), when the neighbours own their lines."""
    if len(diffs) != 1 or not all(isinstance(v, list) for v in diffs[0]):
        return None
    old, new = diffs[0]
    if abs(len(old) - len(new)) != 1 or not old or not all(isinstance(s, ast.stmt) for s in old):
        return None
    pairs = enumerate(zip(old, new, strict=False))
    p = next((i for i, (x, y) in pairs if _dump(x) != _dump(y)), min(len(old), len(new)))
    if len(new) < len(old):  # removed: old[p]
        node = old[p]
        tail = text.lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode()
        if (
            _dump(old[p + 1 :]) != _dump(new[p:])
            or text.indent(node) is None
            or (tail.strip() and not tail.strip().startswith("#"))
        ):
            return None
        return text.replace([(text.starts[node.lineno - 1], text.starts[node.end_lineno], "")])
    if _dump(old[p:]) != _dump(new[p + 1 :]):
        return None
    anchor = old[p] if p < len(old) else old[-1]
    indent = text.indent(anchor)
    if indent is None:
        return None
    line = indent + _unparse_at(new[p], indent) + "\n"
    if p < len(old):
        at = text.starts[anchor.lineno - 1]
    else:
        at = text.starts[anchor.end_lineno]
        line = ("" if text.source[:at].endswith("\n") else "\n") + line
    return text.replace([(at, at, line)])


# How an operator is spelled in source (AugAssign adds "=").
_SPELLING = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
    ast.BitAnd: "&", ast.MatMult: "@", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is",
    ast.IsNot: "is not", ast.And: "and", ast.Or: "or",
}  # fmt: skip


def _operator_gaps(node: ast.AST, op: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """The (left, right) operands between which `op`, an operator of `node`, is written."""
    if isinstance(node, ast.BinOp):
        return [(node.left, node.right)]
    if isinstance(node, ast.AugAssign):
        return [(node.target, node.value)]
    if isinstance(node, ast.BoolOp):
        return list(zip(node.values, node.values[1:], strict=False))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return [(operands[i], operands[i + 1]) for i, o in enumerate(node.ops) if o is op]
    return []


def _operator_edit(text: _Text, path: list[tuple]) -> str | None:
    """Only the operator's token rewritten, wherever the expression's lines break."""
    if len(path) < 2 or type(path[-1][0]) not in _SPELLING or type(path[-1][1]) not in _SPELLING:
        return None
    (node, _), (old, new) = path[-2], path[-1]
    suffix = "=" if isinstance(node, ast.AugAssign) else ""
    pattern = r"\s+".join(map(re.escape, (_SPELLING[type(old)] + suffix).split()))
    edits = []
    for left, right in _operator_gaps(node, old):
        start, end = text.span(left)[1], text.span(right)[0]
        gap = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), text.source[start:end])
        found = re.search(pattern, gap)
        if found is None:
            return None
        edits.append((start + found.start(), start + found.end(), _SPELLING[type(new)] + suffix))
    return text.replace(edits) if edits else None


def _in_place_texts(text: _Text, original: ast.Module, mutant: ast.Module):
    """Candidate texts, smallest edit first; the caller keeps the first that is right."""
    found = _change(original, mutant)
    if found is None:
        return
    path, diffs = found
    small = [_operator_edit(text, path), *_swap_edits(text, diffs), _statement_edit(text, diffs)]
    yield from (candidate for candidate in small if candidate is not None)
    for a, b in reversed(path):  # the deepest node holding the change, then its ancestors
        if isinstance(a, ast.expr):
            span = text.span(a)
            yield text.replace([(*span, ast.unparse(b))])
            yield text.replace([(*span, f"({ast.unparse(b)})")])
        elif isinstance(a, ast.stmt):
            indent = text.indent(a)
            if indent is not None or "\n" not in ast.unparse(b):  # `if x: return y`
                yield text.replace([(*text.span(a), _unparse_at(b, indent or ""))])


def _edit_in_place(text: _Text, original: ast.Module, mutant: str) -> str:
    for candidate in _in_place_texts(text, original, pyast.parse(mutant)):
        try:
            if normalize(candidate) == mutant:
                return candidate
        except (SyntaxError, ValueError):
            continue
    return mutant + "\n"  # no span edit gives the mutant: the whole module, canonical


def edit_in_place(source: str, mutant: str) -> str:
    """`source` turned into `mutant` (a canonical module text, `ast.unparse`'s, one edit away
    from `source`) by rewriting only the text of the node that changed: the smallest span
    whose rewrite parses to `mutant`. Comments, blank lines and formatting elsewhere stay.
    Falls back to `mutant` itself when no span rewrite reproduces it."""
    return _edit_in_place(_Text(source), pyast.parse(source), mutant)


def summarize_test_output(output: str, max_lines: int = 5) -> str:
    """The failing test ids, the first assertion lines and pytest's summary line."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    keep = [ln for ln in lines if _KEEP.match(ln)]
    summary = [ln for ln in keep if ln.startswith("=") or ln.startswith(("FAILED", "ERROR"))]
    detail = [ln for ln in keep if ln not in summary][: max(0, max_lines - len(summary))]
    tail = next((ln for ln in reversed(lines) if ln.strip()), "")
    out = detail + summary[-max_lines:]
    if not out:
        out = [tail] if tail else ["(no test output)"]
    return "\n".join(out)


def render_listing(listing: FixListing, tests_text: str) -> str:
    """The test summary, then the candidates grouped by kind: one line per kind, in reading
    order of first appearance, e.g. `cmp (2): 1) line 5: <= -> < | 2) line 5: < -> <=`, whose
    ids are cmp-1 and cmp-2. The module itself is not repeated (read_file shows it): on CPU
    every observation token costs training time.

    Why grouped: each kind's name appears once, at the start of a line, so it tokenizes as it
    does in the `try_fix` call (`"id": "cmp-1"`; with a leading space byte-level BPE gives a
    different token, `Ġcmp` vs `cmp`), and a kind with 20 candidates is not named 20 times.
    A small policy that copies a kind from a flat one-row-per-id listing copies the most
    frequent one (bench/results/fix-tools-design.md)."""
    groups: dict[str, list[str]] = {}
    for c in listing.candidates:
        kind, number = c.id.rsplit("-", 1)
        groups.setdefault(kind, []).append(f"{number}) {c.description}")
    lines = [f"{kind} ({len(items)}): " + " | ".join(items) for kind, items in groups.items()]
    return (
        f"{tests_text}\n\nCandidate fixes of {listing.path} ({len(listing.candidates)}; "
        "try_fix an id, kind-number):\n" + "\n".join(lines)
    )


_KIND_LINE = re.compile(r"^(\w+) \((\d+)\): ", re.MULTILINE)


def listed_ids(observation: str) -> list[str]:
    """The candidate ids a `list_fixes` observation shows (render_listing's format)."""
    listing = observation.split("Candidate fixes of", 1)
    if len(listing) < 2:
        return []
    return [
        f"{k}-{n}" for k, count in _KIND_LINE.findall(listing[1]) for n in range(1, int(count) + 1)
    ]


def listed_id(observation: str, kind: str, description: str) -> str | None:
    """The id a `list_fixes` observation gives the candidate of `kind` described as
    `description` (None if it is not listed): how a policy that knows which edit it wants
    finds its number, which depends on the ranking (and so on the test output)."""
    listing = observation.split("Candidate fixes of", 1)
    row = re.search(rf"^{re.escape(kind)} \(\d+\): (.*)$", listing[-1], re.MULTILINE)
    if len(listing) < 2 or row is None:
        return None
    found = re.search(rf"(?:^| \| )(\d+)\) {re.escape(description)}(?= \| \d+\) |$)", row.group(1))
    return f"{kind}-{found.group(1)}" if found else None
