"""Candidate fixes offered by the environment: the `list_fixes` and `try_fix` tools.

Why: a tiny policy trained on a CPU cannot copy a file path and a buggy line out of its
context reliably (held-out identifiers split into rare tokens), so free-form `edit_file`
calls fail on form before they can fail on substance. These two tools move the copying
into the environment and leave the decision to the policy:

- `list_fixes` runs the task's tests, localises the module they blame (the traceback's
  deepest frame outside tests/, else the module the test imports), and lists every
  one-edit change of that module the bug-injection operators can make
  (components/tasks/mutations.py: operators swap, constants +-1, variables, returns,
  arguments...). Most of these operators are their own inverse, so for a one-edit bug
  the reference fix is usually in the list; which one is the policy's call. The listing
  groups the candidates by kind (render_listing); the module itself is not repeated.
- `try_fix {"id": "call-1"}` restores the module to its listed text, writes candidate k, reruns
  the tests and reports the outcome, so a wrong guess costs one turn and is undone by the
  next try.

Candidates are whole-module texts from `ast.unparse`, so on a module that is not already
in that canonical form (the generated suite is) a try also reformats the file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from components.tasks.mutations import enumerate_mutants

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
    source: str  # the whole module after the change


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


def candidate_fixes(source: str, limit: int) -> list[FixCandidate]:
    """One-edit variants of `source`, in reading order (line, then operator), at most `limit`.

    Raises SyntaxError if `source` does not parse (there is nothing to enumerate then)."""
    ast.parse(source)
    mutants = enumerate_mutants(source)
    order = sorted(range(len(mutants)), key=lambda i: (mutants[i].lineno, i))[:limit]
    seen: dict[str, int] = {}
    out = []
    for i in order:
        m = mutants[i]
        kind = KIND.get(m.operator, m.operator)
        seen[kind] = seen.get(kind, 0) + 1
        out.append(FixCandidate(f"{kind}-{seen[kind]}", m.lineno, m.description, m.source + "\n"))
    return out


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
