"""What the editing tools (`edit_file`, `edit_lines`, `apply_patch`) share, for a model that
cannot copy text exactly (issue 43: a 135M policy's `old` text missed in 24 of 35 edits):

- `parse_refusal`: an edit that leaves a Python file that parsed no longer parsing is
  refused with the parser's line and message (the file is not written). A file that did
  not parse before may be edited freely: fixing it must not be blocked.
- `without_line_numbers`: text copied out of read_file's view keeps its `  12| ` prefixes;
  they are taken off when every non-blank line has one.
- `whitespace_matches`: where `old` occurs line by line when each line is compared
  stripped of leading and trailing whitespace, and `reindented`, which maps `new`'s
  indentation onto the file's by the indentation delta of each matched line; edit_file accepts such a match only when it is unique.
- `numbered_view`: lines of a file in read_file's own format, so an edit's observation
  shows its result the way the model reads files.
"""

from __future__ import annotations

import re
import warnings

from components import pyast

# read_file's prefix, f"{lineno:>{width}}| {text}"; a line copied without its trailing
# space (an empty source line) still counts.
_LINE_NUMBER = re.compile(r"^ *\d+\|(?: |$)")
# The most line comparisons the whitespace-insensitive match may make (about apply_patch's
# limit on its hunk search): a file of one line repeated and an `old` of the same.
MAX_COMPARISONS = 2_000_000


def parse_refusal(rel: str, before: str, after: str) -> str | None:
    """The refusal for an edit of `rel` from `before` to `after` (None: allowed): only a
    `.py` file that parsed before and does not after is refused."""
    if not rel.endswith(".py") or _syntax_error(before) is not None:
        return None
    error = _syntax_error(after)
    if error is None:
        return None
    return (f"error: edit refused: {rel} would no longer parse (line {error.lineno}: "
            f"{error.msg}); the file is unchanged")  # fmt: skip


def _syntax_error(source: str) -> SyntaxError | None:
    """Why `source` does not parse (None: it parses, or is too deep or odd to tell: only a
    syntax error refuses an edit)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning: `x is 1` parses
            pyast.parse(source)
    except SyntaxError as e:
        return e
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def without_line_numbers(text: str) -> str | None:
    """`text` without read_file's line-number prefixes, when every non-blank line has one
    (None: it has none to take off, or only some lines have one)."""
    lines = text.split("\n")
    filled = [line for line in lines if line.strip()]
    if not filled or not all(_LINE_NUMBER.match(line) for line in filled):
        return None
    return "\n".join(_LINE_NUMBER.sub("", line, count=1) for line in lines)


def strip_numbers_if_all(text: str) -> str:
    """`text` without line-number prefixes where every non-blank line has one, else as is."""
    stripped = without_line_numbers(text)
    return text if stripped is None else stripped


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def whitespace_matches(text: str, old: str) -> list[tuple[int, int]]:
    """Every place (first line, line count; 0-based) where the lines of `old` occur in
    `text` as whole lines, compared stripped of leading and trailing whitespace. `old`'s
    blank first and last lines are not required to match; an `old` of only blank lines
    matches nowhere."""
    wanted = [line.strip() for line in old.split("\n")]
    while wanted and not wanted[0]:
        wanted.pop(0)
    while wanted and not wanted[-1]:
        wanted.pop()
    if not wanted:
        return []
    lines = [line.strip() for line in text.splitlines()]
    m = len(wanted)
    # Anchored on the first line: a window is compared only where that line matches.
    anchors = [i for i in range(len(lines) - m + 1) if lines[i] == wanted[0]]
    if len(anchors) * m > MAX_COMPARISONS:  # a hostile file and `old` must not stall the host
        raise ValueError(f"old text of {m} lines would take {len(anchors) * m} line "
                         f"comparisons to match loosely (limit {MAX_COMPARISONS}); copy it "
                         "exactly or edit by line numbers")  # fmt: skip
    return [(i, m) for i in anchors if lines[i : i + m] == wanted]


def reindented(new: str, old: str, matched: list[str]) -> str:
    """`new` re-indented the way the file's `matched` lines are: each indentation `old`
    uses is mapped to the file's indentation on the line it matched (a uniform shift, or 2
    spaces for 4, comes out right), and a deeper one in `new` keeps its extra part on top
    of the deepest mapped one it starts with."""
    olds = [line for line in old.split("\n") if line.strip()]
    mapping: dict[str, str] = {}
    for mine, theirs in zip(olds, [line for line in matched if line.strip()], strict=False):
        mapping.setdefault(_indent(mine), _indent(theirs))
    if all(k == v for k, v in mapping.items()):
        return new
    out = []
    for line in new.split("\n"):
        have = _indent(line)
        if not line.strip():
            out.append(line)
        elif have in mapping:
            out.append(mapping[have] + line[len(have) :])
        else:  # deeper (or shallower) than anything old had: keep the rest on the nearest
            base = max((k for k in mapping if have.startswith(k)), key=len, default=None)
            out.append(line if base is None else mapping[base] + line[len(base) :])
    return "\n".join(out)


def replace_lines(text: str, first: int, count: int, new: str) -> str:
    """`text` with its lines first..first+count-1 (0-based) replaced by `new`, which gets the
    replaced lines' line ending when it lacks one (empty `new`: the lines are deleted)."""
    lines = text.splitlines(keepends=True)
    region = lines[first : first + count]
    ending = "\r\n" if region and region[-1].endswith("\r\n") else "\n"
    if new and not new.endswith("\n") and region and region[-1].endswith(("\n", "\r")):
        new += ending
    return "".join(lines[:first]) + new + "".join(lines[first + count :])


def numbered_view(text: str, first: int, last: int, context: int = 2) -> str:
    """Lines first-context .. last+context (1-based) of `text` in read_file's format
    (`  12| text`), so the model sees an edit's result as it reads files."""
    lines = text.splitlines()
    lo, hi = max(1, first - context), min(len(lines), last + context)
    width = max(4, len(str(hi)))
    return "\n".join(f"{n:>{width}}| {lines[n - 1]}" for n in range(lo, hi + 1))
