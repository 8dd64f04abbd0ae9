"""A scripted baseline that needs no learning: one random single-operator edit on the line
the failing test points at.

The plan, through the same tools a model uses (so its transcript is a valid trajectory):
1. run the tests;
2. read the module under test (a non-test .py file: the one the traceback names, else the
   one the failing test imports from, else the first listed);
3. pick the line: the deepest traceback frame inside the module if there is one (a crash
   points at its line), else a random line of the failing function's body that has an
   operator or an integer constant to change;
4. apply ONE random token mutation on that line (comparison / arithmetic / boolean swap,
   +-1 on an integer constant) with `edit_file`;
5. rerun the tests, finish.
One attempt per episode (pass@1); the choices come from an RNG seeded by (seed, task id),
so a seed replays exactly. It is the floor a learned policy has to beat: it knows the
fault localisation heuristics an engineer would use, but not which edit is right.
"""

from __future__ import annotations

import random
import re
import shlex
import zlib
from dataclasses import dataclass, field

from components.env.episode import Action
from components.env.tool_sets.fix_search.fixes import fix_kind, listed_ids, locate
from components.tasks.task import Task

# Token swaps, longest first so "<=" is not read as "<". Each is a bug-class inverse of
# components/tasks/mutations.py (comparison_swap, arith_swap, boolop_swap, bound_off_by_one).
_SWAPS: dict[str, tuple[str, ...]] = {
    "<=": ("<", ">="),
    ">=": (">", "<="),
    "==": ("!=",),
    "!=": ("==",),
    "//": ("/", "%"),
    "<": ("<=", ">"),
    ">": (">=", "<"),
    "+": ("-",),
    "-": ("+",),
    "*": ("+", "//"),
    "%": ("//",),
    " and ": (" or ",),
    " or ": (" and ",),
    " not in ": (" in ",),
    " in ": (" not in ",),
    " is not ": (" is ",),
    " is ": (" is not ",),
}
_TOKEN = re.compile(
    r"<=|>=|==|!=|//|->|\*\*|[<>+\-*%]| and | or | not in | in | is not | is |(?<![\w.])\d+(?![\w.])"
)
_NUMBERED = re.compile(r"^\s*(\d+)\| ?(.*)$")


def line_mutations(line: str) -> list[str]:
    """Every variant of `line` with exactly one token changed (strings and comments kept)."""
    code_end = _code_end(line)
    out: list[str] = []
    for m in _TOKEN.finditer(line):
        if m.start() >= code_end:
            break
        tok = m.group(0)
        if tok in ("->", "**") or _inside_string(line, m.start()):
            continue
        if tok.isdigit():
            n = int(tok)
            alts = [str(n + 1)] + ([str(n - 1)] if n > 0 else [])
        elif tok == "-" and _is_unary(line, m.start()):
            continue  # a negative literal / unary minus is not a binary operator
        else:
            alts = list(_SWAPS.get(tok, ()))
        out += [line[: m.start()] + alt + line[m.end() :] for alt in alts]
    return list(dict.fromkeys(v for v in out if v != line))


def _code_end(line: str) -> int:
    i = line.find("#")
    while i >= 0 and _inside_string(line, i):
        i = line.find("#", i + 1)
    return len(line) if i < 0 else i


def _inside_string(line: str, pos: int) -> bool:
    quote = ""
    for ch in line[:pos]:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
    return bool(quote)


def _is_unary(line: str, pos: int) -> bool:
    before = line[:pos].rstrip()
    return not before or before[-1] in "([{,=:<>+-*/%" or before.endswith(("return", "in"))


def _observations(events: list[dict]) -> list[str]:
    return [e.get("observation", "") for e in events if e["role"] == "environment"]


def _source_files(events: list[dict]) -> list[str]:
    m = re.search(r"Repository files: (.*)", events[0].get("content", ""))
    files = [f.strip() for f in m.group(1).split(",")] if m else []
    return [f for f in files if f.endswith(".py") and not f.startswith("tests/")]


def function_body(lines: list[str], function: str | None) -> range:
    """1-based line numbers of `function`'s body (the whole file if it is not found)."""
    start = next((i for i, ln in enumerate(lines) if function and
                  re.match(rf"\s*def {re.escape(function)}\(", ln)), None)  # fmt: skip
    if start is None:
        return range(1, len(lines) + 1)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
    ):
        end += 1
    return range(start + 2, end + 1)


@dataclass
class ScriptedBaselinePolicy:
    """Run tests -> read module -> one random single-token edit on the blamed line -> rerun."""

    name: str = "scripted-baseline"
    seed: int = 0
    _rng: dict[str, random.Random] = field(default_factory=dict, repr=False)

    def act(self, task: Task, events: list[dict]) -> Action:
        test_cmd = shlex.join(task.test_command)
        done = sum(e["role"] == "assistant" for e in events)
        if done == 0:
            self._rng[task.id] = random.Random(zlib.crc32(f"{self.seed}:{task.id}".encode()))
            return Action("run_command", {"cmd": test_cmd}, "Run the tests to see what fails.")
        obs = _observations(events)
        files = _source_files(events)
        module, _, _ = locate(obs[0], files)
        if done == 1:
            if module is None:
                return Action("finish", {"summary": "No module to edit."})
            return Action("read_file", {"path": module}, "Read the module under test.")
        if done == 2:
            edit = self._edit(task, obs[0], obs[1], files)
            if edit is not None:
                return edit
            return Action("finish", {"summary": "Found no single-operator edit to try."})
        if done == 3 and events[-2].get("action") == "edit_file":
            return Action("run_command", {"cmd": test_cmd}, "Rerun the tests.")
        return Action("finish", {"summary": "Tried one single-operator edit."})

    def _edit(self, task: Task, test_output: str, listing: str, files: list[str]) -> Action | None:
        rng = self._rng.setdefault(
            task.id, random.Random(zlib.crc32(f"{self.seed}:{task.id}".encode()))
        )
        module, blamed, function = locate(test_output, files)
        numbered = [_NUMBERED.match(ln) for ln in listing.splitlines()]
        lines = [m.group(2) for m in numbered if m]
        if module is None or not lines:
            return None
        body = function_body(lines, function)
        candidates = [n for n in body if line_mutations(lines[n - 1])]
        if blamed is not None and 1 <= blamed <= len(lines) and line_mutations(lines[blamed - 1]):
            target = blamed
        elif candidates:
            target = rng.choice(candidates)
        else:
            return None
        old_line = lines[target - 1]
        new_line = rng.choice(line_mutations(old_line))
        # edit_file needs a unique `old`: widen the context one line at a time.
        # No trailing newline: the module's last line may not have one.
        text = "\n".join(lines)
        lo, hi = target - 1, target
        while text.count("\n".join(lines[lo:hi])) > 1 and (lo > 0 or hi < len(lines)):
            lo, hi = max(lo - 1, 0), min(hi + 1, len(lines))
        old = "\n".join(lines[lo:hi])
        new = "\n".join([*lines[lo : target - 1], new_line, *lines[target:hi]])
        return Action("edit_file", {"path": module, "old": old, "new": new},
                      f"Line {target} looks wrong; try `{new_line.strip()}`.")  # fmt: skip


def _fix_search_step(events: list[dict], max_tries: int) -> tuple[Action | None, list[str]]:
    """The shared moves of a candidate-fix search: list first, finish once a try passes or
    the budget is spent. Returns (that action, None) or (None, untried ids in listed order)."""
    if not any(e["role"] == "assistant" for e in events):
        return Action("list_fixes", {}, "Run the tests and list candidate fixes."), []
    obs = _observations(events)
    first = obs[-1].splitlines()[0] if obs[-1] else ""
    if " applied (" in first and "tests PASSED" in first:
        return Action("finish", {"summary": "The tests pass."}), []
    tried = {e["arguments"]["id"] for e in events if e.get("action") == "try_fix"}
    left = [k for k in listed_ids(obs[0]) if k not in tried]
    if not left or len(tried) >= max_tries:
        return Action("finish", {"summary": "No candidate made the tests pass."}), []
    return None, left


@dataclass
class ListingOrderPolicy:
    """Search with no knowledge of which fixes tend to be right: list_fixes, then the first
    untried candidate of each listed kind in the order the listing shows the kinds, then
    the remaining candidates in listed order, until the tests pass or `max_tries` is spent.
    As an SFT expert it demonstrates the procedure and the call format, not the decision:
    which candidate to try first is left for RL to learn from the verifier's reward."""

    name: str = "listing-order"
    max_tries: int = 4

    def act(self, task: Task, events: list[dict]) -> Action:
        action, left = _fix_search_step(events, self.max_tries)
        if action is not None:
            return action
        tried_kinds = {
            fix_kind(e["arguments"]["id"]) for e in events if e.get("action") == "try_fix"
        }
        pick = next((k for k in left if fix_kind(k) not in tried_kinds), left[0])
        return Action("try_fix", {"id": pick}, "Try the next listed kind of fix.")


@dataclass
class RandomFixesPolicy:
    """Search without learning through the same tools the fixes-trained model uses:
    list_fixes, then try uniformly random untried candidates until the tests pass or
    `max_tries` is spent, then finish. The floor for a policy that picks candidates: with
    the same number of tries, a learned pick must beat a random one."""

    name: str = "random-fixes"
    seed: int = 0
    max_tries: int = 4
    # Search kinds in a random order, each in listed (rank) order: draw a kind not yet tried
    # among the listed ones, then try its candidates one after another until they run
    # out. That is prior-fixes' procedure with the kind order left to chance: as an SFT
    # expert it shows the procedure with every kind searched first somewhere, so sampling
    # explores the kinds and RL has the one decision to learn, which kind first.
    by_kind: bool = False
    # Draw weights per kind (uniform where None). 1 / kind_listing_shares makes every kind
    # the first pick about equally often over a suite: a policy imitating uniform draws
    # learns how often each kind is *listed* and rarely samples the rarely listed kinds
    # first, which are the likeliest fixes when listed, so RL never sees them pay
    # (bench/results/fix-tools-design.md).
    kind_weights: dict[str, float] | None = None

    def act(self, task: Task, events: list[dict]) -> Action:
        action, left = _fix_search_step(events, self.max_tries)
        if action is not None:
            return action
        tried = [str(e["arguments"]["id"]) for e in events if e.get("action") == "try_fix"]
        rng = random.Random(zlib.crc32(f"{self.seed}:{task.id}:{len(tried)}".encode()))
        if not self.by_kind:
            return Action("try_fix", {"id": rng.choice(left)}, "Try a candidate fix.")
        last_kind = fix_kind(tried[-1]) if tried else None
        same = [k for k in left if fix_kind(k) == last_kind]
        if same:
            return Action("try_fix", {"id": same[0]}, "Try the next fix of this kind.")
        tried_kinds = {fix_kind(k) for k in tried}
        kinds = list(dict.fromkeys(fix_kind(k) for k in left))
        fresh = [k for k in kinds if k not in tried_kinds] or kinds
        weights = [self.kind_weights.get(k, 1.0) for k in fresh] if self.kind_weights else None
        kind = rng.choices(fresh, weights=weights)[0]
        pick = next(k for k in left if fix_kind(k) == kind)
        return Action("try_fix", {"id": pick}, "Try a random kind of fix.")


def _listings(tasks: list[Task], max_fixes: int):
    """(candidate fixes list_fixes shows for the buggy module, the reference fix's source)
    per task with a one-file reference patch."""
    from components.env.tool_sets.fix_search.fixes import candidate_fixes
    from components.scripted.reference import fixed_files
    from components.tasks.mutations import normalize

    for task in tasks:
        files = fixed_files(task) if task.has_reference else {}
        if len(files) != 1:
            continue
        (before, after) = next(iter(files.values()))
        try:
            candidates = candidate_fixes(before, max_fixes)
        except SyntaxError:
            continue
        yield candidates, normalize(after) + "\n"


def kind_listing_shares(tasks: list[Task], max_fixes: int = 64) -> dict[str, float]:
    """Per kind of candidate fix: the share of `tasks` whose listing shows that kind. Uses
    no reference fix, only what list_fixes would show."""
    seen: dict[str, int] = {}
    n = 0
    for candidates, _ in _listings(tasks, max_fixes):
        n += 1
        for kind in {fix_kind(c.id) for c in candidates}:
            seen[kind] = seen.get(kind, 0) + 1
    return {k: seen[k] / n for k in sorted(seen)}


def kind_success_rates(tasks: list[Task], max_fixes: int = 64) -> dict[str, float]:
    """Per kind of candidate fix: the share of that kind's listed candidates that were the
    reference fix, over `tasks` (training tasks with a one-file reference patch), smoothed
    toward 0 for kinds seen rarely: (right + 0.5) / (listed + 1). The listings are the
    ones list_fixes shows without test output (no tests are run here); where list_fixes
    ranks with the tests' output the cut at `max_fixes` may keep other candidates, so the
    rates are then an approximation."""
    listed: dict[str, int] = {}
    right: dict[str, int] = {}
    for candidates, target in _listings(tasks, max_fixes):
        for c in candidates:
            kind = fix_kind(c.id)
            listed[kind] = listed.get(kind, 0) + 1
            right[kind] = right.get(kind, 0) + (c.source == target)
    return {k: (right[k] + 0.5) / (listed[k] + 1) for k in sorted(listed)}


@dataclass
class PriorFixesPolicy:
    """Search without a model: try the listed candidates in order of how often their kind
    was the fix on training tasks (`kind_success_rates`), listed (rank) order within a kind, until
    the tests pass or `max_tries` is spent. It never sees a reference fix, so it works on any
    task; its successes are the `prior-fixes` expert transcripts (one clean rule per turn
    for SFT to imitate, where the oracle's one right id per task is a noisy target)."""

    rates: dict[str, float]
    name: str = "prior-fixes"
    max_tries: int = 4

    def act(self, task: Task, events: list[dict]) -> Action:
        action, left = _fix_search_step(events, self.max_tries)
        if action is not None:
            return action
        ranked = sorted(left, key=lambda k: -self.rates.get(fix_kind(k), 0.0))
        return Action("try_fix", {"id": ranked[0]}, "Try the likeliest untried kind of fix.")
