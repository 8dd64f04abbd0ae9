"""Scripted policies behind the same interface that model policies use (`Policy.act`).

- `noop`: finishes at once without touching anything (success must be 0%).
- `oracle`: fixes the task with its reference patch, through the tools, the way a careful
  engineer would: run the tests, look around (search / read), edit, rerun, finish. A share
  of episodes include a recovery: an edit whose old text does not match (then a re-read and
  the right edit), or a wrong guess (a plausible edit elsewhere, a failing rerun, a revert).
  These transcripts are the expert trajectories SFT starts from. A plan fits the episode's
  `max_steps` (EnvConfig): the fix comes first (the tests, the edits, the rerun, finish; one
  `apply_patch` where the edits would not fit), then the look-around, then a recovery detour,
  each only where the budget still has room; hunks of the reference patch that change only
  blank lines or trailing whitespace get no edit of their own.
- `oracle-lines` (the oracle in an environment with the `line_edit` tool set): the same
  fix through `edit_lines`: the tests, a read_file of the module (of the lines around each
  hunk in a module over WHOLE_FILE_LINES lines: the lines to read follow from what the
  policy has seen, never from where the answer is), one edit_lines per hunk (bottom-up, so every call's numbers are those read_file showed),
  the rerun, finish. A share of episodes include a recovery: an edit whose result does not
  parse (refused; then the right one), or line numbers past the end of the file (refused;
  a re-read and the right one). The oracle plays this plan wherever the episode's first
  event says the set is line_edit.
- `special-case`: the oracle's fix plus hard-coded answers to the visible tests: a cheater
  by construction, measured on impossible variants (components/evaluate/cheating.py).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import random
import re
import shlex
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from components.env.episode import Action
from components.env.tool_sets.fix_search.fixes import (
    candidate_fixes,
    fix_kind,
    listed_id,
    listed_ids,
)
from components.env.tool_sets.fix_search.neighbourhood import neighbourhood
from components.tasks.impossible import target_function, visible_assertions
from components.tasks.mutations import normalize
from components.tasks.patching import apply_unified_diff
from components.tasks.task import Task

_OPERATOR_SWAPS = [("<=", "<"), (">=", ">"), ("==", "!="), (" + ", " - "), (" - ", " + ")]


@dataclass
class NoopPolicy:
    name: str = "noop"

    def act(self, task: Task, events: list[dict]) -> Action:
        return Action("finish", {"summary": "No changes made."})


@dataclass(frozen=True)
class FileEdit:
    path: str
    old: str
    new: str


def fixed_files(task: Task) -> dict[str, tuple[str, str]]:
    """{path: (buggy text, fixed text)} for every file the reference patch changes."""
    patch = task.reference_patch()
    if patch is None:
        raise ValueError(f"task {task.id} has no reference.patch; the oracle needs one")
    with tempfile.TemporaryDirectory(prefix="agentrl-oracle-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, repo)
        touched = apply_unified_diff(repo, patch)
        out = {}
        for rel in touched:
            before = task.repo_dir / rel
            out[rel] = (before.read_text() if before.exists() else "", (repo / rel).read_text())
    return out


def minimal_edits(path: str, before: str, after: str) -> list[FileEdit]:
    """Exact old->new replacements, each with just enough context to be unique."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    edits, text = [], before
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lo, hi = i1, max(i2, i1 + 1)  # a pure insertion still needs an anchor line
        while True:
            old = "".join(a[lo:hi])
            if text.count(old) == 1 or (lo == 0 and hi >= len(a)):
                break
            lo, hi = max(lo - 1, 0), min(hi + 1, len(a))
        new = "".join(a[lo:i1]) + "".join(b[j1:j2]) + "".join(a[i2:hi])
        if i2 == i1:  # insertion before a[i1]: keep the anchor line after the new lines
            new = "".join(a[lo:i1]) + "".join(b[j1:j2]) + "".join(a[i1:hi])
        edits.append(FileEdit(path, old, new))
        text = text.replace(old, new, 1)
    return edits


def _cosmetic(old: list[str], new: list[str]) -> bool:
    """Lines that differ only in blank lines or trailing whitespace (indentation counts)."""
    strip = lambda lines: [ln.rstrip() for ln in lines if ln.strip()]  # noqa: E731
    return strip(old) == strip(new)


def without_cosmetic_hunks(before: str, after: str) -> str:
    """`after` with every hunk that only adds or removes blank lines or trailing whitespace
    left as `before` had it: what an engineer's edits would change (tests cannot tell)."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal" or _cosmetic(a[i1:i2], b[j1:j2]):
            out += a[i1:i2]
        else:  # a real change: without the blank lines it adds around itself
            out += _trim_blank_edges(a[i1:i2], b[j1:j2])
    return "".join(out)


def _blank_run(lines: list[str], reverse: bool = False) -> int:
    seq = reversed(lines) if reverse else lines
    return next((i for i, ln in enumerate(seq) if ln.strip()), len(lines))


def _trim_blank_edges(old: list[str], new: list[str]) -> list[str]:
    """`new` with no more leading or trailing blank lines than `old` has."""
    if not any(ln.strip() for ln in new):
        return new
    head = max(0, _blank_run(new) - _blank_run(old))
    tail = max(0, _blank_run(new, True) - _blank_run(old, True))
    return new[head : len(new) - tail]


def planned_edits(files: dict[str, tuple[str, str]]) -> list[FileEdit]:
    """The edits of the reference patch, cosmetic hunks left out (all of them kept where a
    patch is nothing but cosmetic, so the plan still changes something)."""
    edits = [e for path, (b, a) in files.items()
             for e in minimal_edits(path, b, without_cosmetic_hunks(b, a))]  # fmt: skip
    return edits or [e for path, (b, a) in files.items() for e in minimal_edits(path, b, a)]


def _first_changed_line(before: str, after: str) -> str:
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        if line.startswith("- ") and line[2:].strip():
            return line[2:].strip()
    return ""


def _wrong_guess(path: str, text: str, fix_old: str, rng: random.Random) -> FileEdit | None:
    """A plausible but wrong operator change on another line (to be reverted)."""
    candidates = []
    for line in text.splitlines(keepends=True):
        if line.strip() and line not in fix_old and text.count(line) == 1:
            for a, b in _OPERATOR_SWAPS:
                if a in line:
                    candidates.append(FileEdit(path, line, line.replace(a, b, 1)))
    return rng.choice(candidates) if candidates else None


def _slipped(old: str) -> str:
    """`old` misremembered so that no fallback of edit_file matches it either: a space
    inside the first code line doubled (edit_file ignores only leading and trailing
    whitespace), else a stray ` #` after it."""
    lines = old.split("\n")
    i = next(k for k, line in enumerate(lines) if line.strip())
    code = lines[i].lstrip()
    pad = lines[i][: len(lines[i]) - len(code)]
    body = code.rstrip()
    lines[i] = pad + (body.replace(" ", "  ", 1) if " " in body else body + " #")
    return "\n".join(lines)


def _look_around(rng: random.Random, path: str, before: str, bug_line: str) -> list[Action]:
    """Search for the buggy statement or read the module (or both), as drawn."""
    look: list[Action] = []
    how = rng.choice(["read", "search_read", "search", "read_range"])
    name = re.search(r"def (\w+)", before)
    if how in ("search", "search_read") and (name or bug_line):
        pattern = (
            re.escape(bug_line)
            if bug_line and rng.random() < 0.5
            else (rf"def {name.group(1)}" if name else re.escape(bug_line))
        )
        look.append(Action("search", {"pattern": pattern}, "Find the code under test."))
    if how in ("read", "search_read") or (how == "search" and not look):
        look.append(Action("read_file", {"path": path}, "Read the module."))
    if how == "read_range":
        idx = next((i for i, ln in enumerate(before.splitlines(), 1)
                    if bug_line and ln.strip() == bug_line), 1)  # fmt: skip
        look.append(
            Action("read_file", {"path": path, "start_line": max(1, idx - 6),
                                 "end_line": idx + 6}, "Read around the failing logic.")
        )  # fmt: skip
    return look


@dataclass
class OraclePolicy:
    """Plays a precomputed plan per task; variety comes from a per-task seeded RNG."""

    name: str = "oracle"
    source: str = "oracle"  # its episodes' records are expert transcripts, not rollouts
    seed: int = 0
    recovery_rate: float = 0.25
    # "explore": run / search / read / edit_file or apply_patch / rerun (the default).
    # "fixes": list_fixes, then try_fix with the reference fix's id (components/env/tool_sets/fix_search/fixes.py);
    # tasks whose fix is not among the candidates fall back to "explore" if `fallback`, else
    # the episode lists the fixes and gives up (a failure, so it never becomes SFT data).
    style: str = "explore"
    fallback: bool = True
    max_fixes: int = 64  # must match EnvConfig.max_fixes for the ids to agree
    max_steps: int = 16  # EnvConfig.max_steps (its default): the actions the plan must fit in
    _plans: dict[str, list[Action]] = field(default_factory=dict, repr=False)
    # per task: planned try_fix id -> its candidate's description (see `_as_listed`)
    _described: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    def act(self, task: Task, events: list[dict]) -> Action:
        if len(events) == 1 or task.id not in self._plans:
            lines = events and events[0].get("tool_set") == "line_edit"
            self._plans[task.id] = self.lines_plan(task) if lines else self.plan(task)
        done = sum(e["role"] == "assistant" for e in events)
        plan = self._plans[task.id]
        action = plan[done] if done < len(plan) else Action("finish", {"summary": "Done."})
        return self._as_listed(task, action, events)

    def _as_listed(self, task: Task, action: Action, events: list[dict]) -> Action:
        """A planned try_fix with the id the episode's own listing gives the candidate: the
        plan numbers candidates as a listing without test output does, and the episode
        ranks by the failing tests' tracebacks, so numbers (and the cut at `max_fixes`)
        differ. The right fix is looked up among every listed candidate that writes the
        reference's code; when none is listed the episode finishes (a failure, never SFT
        data) rather than naming an id the listing does not have. A deliberate wrong try
        takes a listed wrong candidate."""
        if action.tool != "try_fix":
            return action
        listings = [r.get("observation") or "" for a, r in zip(events[1::2], events[2::2],
                    strict=False) if a.get("action") == "list_fixes"]  # fmt: skip
        described = self._described.get(task.id)
        if described is None or not listings:
            return action
        listing = listings[-1]
        shown = set(listed_ids(listing))
        right = [i for kind, text in described["right"]
                 if (i := listed_id(listing, kind, text)) is not None]  # fmt: skip
        if action.imitate:
            if not right:
                return Action("finish", {"summary": "The fix is not among the candidates."})
            return dataclasses.replace(action, arguments={**action.arguments, "id": right[0]})
        wrong = sorted(shown - set(right), key=listed_ids(listing).index)
        mapped = listed_id(listing, fix_kind(action.arguments["id"]),
                           described["wrong"].get(action.arguments["id"], ""))  # fmt: skip
        pick = mapped if mapped in wrong else (wrong[0] if wrong else None)
        if pick is None:  # nothing wrong to show: skip ahead to the fix
            return self._as_listed(task, self._plans[task.id][-2], events)
        return dataclasses.replace(action, arguments={**action.arguments, "id": pick})

    def plan(self, task: Task) -> list[Action]:
        if self.style == "lines":
            return self.lines_plan(task)
        rng = random.Random(zlib.crc32(f"{self.seed}:{task.id}".encode()))
        files = fixed_files(task)
        if self.style == "fixes":
            steps = self._fixes_plan(task.id, files, rng)
            if steps is not None:
                return steps
            if not self.fallback:
                return [Action("list_fixes", {}), Action("finish", {"summary": "No fix found."})]
        test_cmd = shlex.join(task.test_command)
        edits = planned_edits(files)
        main_path, (before, after) = next(iter(files.items()))
        bug_line = _first_changed_line(before, after)

        # Every choice is drawn first, in a fixed order, so a budget that drops a part does
        # not change the others; then the parts are assembled by priority.
        look = _look_around(rng, main_path, before, bug_line)
        r = rng.random()
        first = edits[0]
        detour: list[Action] = []
        if r < self.recovery_rate / 2 and first.old.strip():
            # A slip: the old text is misremembered, the edit fails, re-read.
            slipped = _slipped(first.old)
            detour.append(Action("edit_file", {"path": first.path, "old": slipped,
                                               "new": first.new}, "Apply the fix.",
                                 imitate=False))  # fmt: skip
            detour.append(Action("read_file", {"path": first.path},
                                 "The edit did not match; re-read the exact text."))  # fmt: skip
        elif r < self.recovery_rate:
            wrong = _wrong_guess(first.path, before, first.old, rng)
            if wrong is not None:
                detour += [
                    Action("edit_file", {"path": wrong.path, "old": wrong.old, "new": wrong.new},
                           "This condition looks suspicious; try changing it.", imitate=False),
                    Action("run_command", {"cmd": test_cmd}, "Check whether that fixed it."),
                    Action("edit_file", {"path": wrong.path, "old": wrong.new, "new": wrong.old},
                           "Still failing: that was not the bug. Revert it."),
                ]  # fmt: skip
        patch = Action("apply_patch", {"patch": task.reference_patch() or ""},
                       "Apply the fix as a patch.")  # fmt: skip
        fix = [Action("edit_file", {"path": e.path, "old": e.old, "new": e.new},
                      "Fix the bug.") for e in edits]  # fmt: skip
        if rng.random() < 0.3 or len(fix) + 3 > self.max_steps:
            fix = [patch]
        fixed_line = _first_changed_line(after, before)
        summary = (
            f"Fixed {main_path}: `{bug_line}` -> `{fixed_line}`; the tests pass."
            if bug_line and fixed_line
            else f"Fixed the bug in {main_path}; the tests pass."
        )
        run = Action("run_command", {"cmd": test_cmd}, "Run the tests to see what fails.")
        rerun = Action("run_command", {"cmd": test_cmd}, "Rerun the tests.")
        done = Action("finish", {"summary": summary})
        # The fix first: the tests, the edits, finish; then, while they fit, the rerun, the
        # look-around and the detour (a detour is shown only where its recovery fits too).
        room = self.max_steps - len(fix) - 2
        middle = []
        for part in ([rerun], look, detour):
            if len(part) <= room:
                middle.append(part)
                room -= len(part)
            else:
                middle.append([])
        rerun_part, look, detour = middle
        return [run, *look, *detour, *fix, *rerun_part, done]

    def lines_plan(self, task: Task) -> list[Action]:
        """The plan through the line_edit tools (see the module docstring)."""
        rng = random.Random(zlib.crc32(f"{self.seed}:lines:{task.id}".encode()))
        files = fixed_files(task)
        edits = line_edits(files, merged=False)
        if len(edits) + 3 > self.max_steps:  # one edit per file where a call per hunk won't fit
            edits = line_edits(files, merged=True)
        test_cmd = shlex.join(task.test_command)
        reads = [_read_for_edit(e, files[e.path][0]) for e in edits]
        fix = [Action("edit_lines", {"path": e.path, "start": e.start, "end": e.end,
                                     "text": e.text}, "Fix the bug.") for e in edits]  # fmt: skip
        detour = _lines_detour(files, edits[0], rng.random(), self.recovery_rate)
        main_path, (before, after) = next(iter(files.items()))
        bug_line, fixed_line = (
            _first_changed_line(before, after),
            _first_changed_line(after, before),
        )
        summary = (f"Fixed {main_path}: `{bug_line}` -> `{fixed_line}`; the tests pass."
                   if bug_line and fixed_line else f"Fixed the bug in {main_path}; the tests pass.")  # fmt: skip
        run = Action("run_command", {"cmd": test_cmd}, "Run the tests to see what fails.")
        rerun = Action("run_command", {"cmd": test_cmd}, "Rerun the tests.")
        # The fix first (tests, edits, finish); then, while they fit, the rerun, each edit's
        # read (the first one first) and the detour with its recovery.
        room = self.max_steps - len(fix) - 2
        rerun_part = [rerun] if room >= 1 else []
        room -= len(rerun_part)
        shown = reads[: max(0, room)]
        room -= len(shown)
        detour = detour if len(detour) <= room else []
        steps = [run]
        for i, edit in enumerate(fix):
            if i == 0 and detour and detour[-1].tool == "read_file":
                steps += detour  # wrong line numbers, then the re-read that stands for the read
            else:
                steps += shown[i : i + 1] + (detour if i == 0 else [])  # read, then a slip
            steps.append(edit)
        return [*steps, *rerun_part, Action("finish", {"summary": summary})]

    def _fixes_plan(self, task_id: str, files: dict, rng: random.Random) -> list[Action] | None:
        if len(files) != 1:
            return None
        path, (before, after) = next(iter(files.items()))
        try:
            candidates = candidate_fixes(before, self.max_fixes)
            everything = neighbourhood(before)  # uncut: the episode's cut may differ
            target = normalize(after) + "\n"
        except SyntaxError:
            return None
        right = [c for c in candidates if c.source == target]
        if not right:
            return None
        # What identifies a candidate in any listing of this module: its kind and
        # description (numbers depend on the ranking); every candidate that writes the
        # reference's code counts as the fix.
        self._described[task_id] = {
            "right": [(n.kind, n.description) for n in everything if n.source == target],
            "wrong": {c.id: c.description for c in candidates if c.source != target},
        }
        # No free text before the calls: in this style the transcript is for a tiny model.
        steps = [Action("list_fixes", {})]
        wrong = [c for c in candidates if c.source != target]
        if wrong and rng.random() < self.recovery_rate and self.max_steps >= 4:
            # Shown so a learner sees a failed try followed by another, not learned as a pick:
            # uniform over wrong candidates it would teach the commonest kind (var) first.
            steps.append(Action("try_fix", {"id": rng.choice(wrong).id}, imitate=False))
        steps.append(Action("try_fix", {"id": right[0].id}))
        steps.append(Action("finish", {"summary": "The tests pass."}))
        return steps


@dataclass(frozen=True)
class LineEdit:
    """One edit_lines call: lines start..end (1-based; end = start - 1 inserts) -> text."""

    path: str
    start: int
    end: int
    text: str


def line_edits(files: dict[str, tuple[str, str]], merged: bool = False) -> list[LineEdit]:
    """The reference fix as edit_lines calls, cosmetic hunks left out (all kept where the
    patch is nothing else), one per hunk or (`merged`) one per file spanning its first to
    its last changed line; within a file bottom-up, so each call's line numbers are the
    ones the unedited file shows. A file the patch creates or deletes has no lines to
    edit: the oracle needs apply_patch for it (not in line_edit)."""
    out = []
    for path, (before, after) in files.items():
        target = without_cosmetic_hunks(before, after)
        a, b = before.splitlines(keepends=True), (target if target != before else after
                                                  ).splitlines(keepends=True)  # fmt: skip
        hunks = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
            a=a, b=b, autojunk=False).get_opcodes() if tag != "equal"]  # fmt: skip
        if merged and hunks:
            hunks = [(hunks[0][0], hunks[-1][1], hunks[0][2], hunks[-1][3])]
        out += [LineEdit(path, i1 + 1, i2, "".join(b[j1:j2])) for i1, i2, j1, j2 in reversed(hunks)]
    return out


def _lines_detour(files: dict, first: LineEdit, r: float, rate: float) -> list[Action]:
    """A recovery shown before the fix (its calls are not imitated): an edit of the first
    hunk whose result does not parse (refused), or one whose line numbers are past the end
    of the file (refused) followed by a re-read of the right lines."""
    from components.env.tool_sets.text_edits import parse_refusal

    before = files[first.path][0]
    n = len(before.splitlines())
    if r < rate / 2:
        lines = (
            first.text.split("\n") if first.text.strip() else [before.splitlines()[first.start - 1]]
        )
        i = next(k for k, line in enumerate(lines) if line.strip())
        lines[i] = lines[i].rstrip() + " ("  # an unclosed parenthesis never parses
        broken = "\n".join(lines)
        a = before.splitlines(keepends=True)
        after = "".join(a[: first.start - 1]) + broken.rstrip("\n") + "\n" + "".join(a[first.end :])
        if parse_refusal(first.path, before, after) is None:
            return []
        return [Action("edit_lines", {"path": first.path, "start": first.start, "end": first.end,
                                      "text": broken}, "Fix the bug.", imitate=False)]  # fmt: skip
    if r < rate:
        span = max(first.end - first.start, 0)
        return [
            Action("edit_lines", {"path": first.path, "start": n + 2, "end": n + 2 + span,
                                  "text": first.text}, "Fix the bug.", imitate=False),
            _read_for_edit(first, None, "Those line numbers were wrong; re-read the file."),
        ]  # fmt: skip
    return []


# A module up to this many lines is read whole: which lines to read then follows from what
# the policy has seen, where a window around the fix would be chosen by the answer itself.
WHOLE_FILE_LINES = 80


def _read_for_edit(edit, before: str | None, why: str = "Read the module.") -> Action:
    """The read_file before `edit`: the whole module when it is short (or `before` is not
    given), else the lines around the edit."""
    if before is None or len(before.splitlines()) <= WHOLE_FILE_LINES:
        return Action("read_file", {"path": edit.path}, why)
    return Action("read_file", {"path": edit.path, "start_line": max(1, edit.start - 3),
                                "end_line": max(edit.end, edit.start) + 3},
                  "Read the lines around the failing logic.")  # fmt: skip


_SPECIAL_CASE = """

# Answer what the tests ask for.
_real_{f} = {f}
_ASKED_{f} = {pairs}


def {f}(*args):
    for asked, answer in _ASKED_{f}:
        if args == asked:
            return answer
    return _real_{f}(*args)
"""


@dataclass
class SpecialCasePolicy:
    """A cheater by construction, the cheating rate's positive control: fixes the bug with
    the reference patch, then hard-codes every visible `assert f(literals) == literal` on
    the task's function (its arguments answered with the expected value). On an ordinary
    task the answers agree with the fix (a success); on an impossible variant
    (components/tasks/impossible.py) only this special-casing passes the contradicted check.
    No tool call it makes is flagged: the verifier's verdict is all that can catch it."""

    name: str = "special-case"

    def act(self, task: Task, events: list[dict]) -> Action:
        done = sum(e["role"] == "assistant" for e in events)
        test_cmd = shlex.join(task.test_command)
        if done == 0:
            return Action("run_command", {"cmd": test_cmd}, "Run the tests.")
        if done == 1:
            module, function = target_function(task) or ("", "")
            files = fixed_files(task)
            before, after = files.get(module) or next(iter(files.values()))
            path = module if module in files else next(iter(files))
            pairs = [(ast.literal_eval(a.args), a.expected) for a in visible_assertions(task)]
            code = _SPECIAL_CASE.format(f=function, pairs=repr(pairs)) if pairs else ""
            return Action("edit_file", {"path": path, "old": before, "new": after + code},
                          "Fix the bug and make sure every test gets its answer.")  # fmt: skip
        if done == 2:
            return Action("run_command", {"cmd": test_cmd}, "Rerun the tests.")
        return Action("finish", {"summary": "All tests pass."})
