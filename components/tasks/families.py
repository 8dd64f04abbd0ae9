"""Function families for the built-in coding-task suite.

A family is plain data: a source template (string.Template `$placeholders`), pools of
identifiers for each placeholder, an optional constant chooser and a test-input chooser.
`render(family, rng)` turns it into one concrete, correct module. Variation is procedural
so that tasks rarely share code verbatim:
  * function name from synonyms, parameter/local names from pools, module name from a pool;
  * constants where the spec allows (window size, shift, threshold...); the docstring and
    the test inputs follow the chosen constants, and expected values are always computed
    by running the rendered (correct) code, so tests are correct by construction;
  * statement order where it is free: consecutive lines ending in `#~g` (same tag g) are
    blocks that may be shuffled; a block is the marked line plus the more-indented lines
    under it.
"""

from __future__ import annotations

import ast
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from components import pyast

# Shared identifier pools (families add their own).
SEQ = ("xs", "items", "values", "nums", "data", "seq", "arr", "elements", "entries")
TEXT = ("text", "s", "line", "sentence", "phrase", "raw", "message", "source")
OUT = ("out", "result", "res", "acc", "output", "collected", "answer")
ELEM = ("x", "v", "item", "value", "elem", "e")
IDX = ("i", "idx", "pos", "p", "cursor")
IDX2 = ("j", "end", "stop", "q", "scan")
COUNT = ("count", "total", "tally", "counter", "hits", "n_seen")
LO = ("lo", "low", "lower", "start", "left")
HI = ("hi", "high", "upper", "finish", "right")


def _no_consts(rng: random.Random) -> dict:
    return {}


@dataclass(frozen=True)
class Family:
    name: str
    modules: tuple[str, ...]  # candidate module names (file stem)
    functions: tuple[str, ...]  # candidate function names
    names: dict[str, tuple[str, ...]]  # placeholder -> candidate identifiers
    template: str  # uses $fn plus the placeholders in `names` and `consts`
    cases: Callable[[random.Random, dict], list[tuple]]  # (rng, consts) -> argument tuples
    consts: Callable[[random.Random], dict] = field(default=_no_consts)


@dataclass(frozen=True)
class Variant:
    """One rendered, correct instance of a family."""

    family: str
    module: str
    function: str
    source: str  # canonical text (ast.unparse), no trailing newline
    consts: dict
    cases: list[tuple]


_MARK = re.compile(r"\s*#~(\w+)\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _shuffle_blocks(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _MARK.search(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        group = m.group(1)
        blocks: list[list[str]] = []
        while i < len(lines) and (m := _MARK.search(lines[i])) and m.group(1) == group:
            indent = _indent(lines[i])
            block = [lines[i][: m.start()]]
            i += 1
            while (
                i < len(lines)
                and lines[i].strip()
                and _indent(lines[i]) > indent
                and not _MARK.search(lines[i])
            ):
                block.append(lines[i])
                i += 1
            blocks.append(block)
        rng.shuffle(blocks)
        for b in blocks:
            out.extend(b)
    return "\n".join(out)


def render(family: Family, rng: random.Random) -> Variant:
    """A concrete correct module for `family`; deterministic for the rng state."""
    module = rng.choice(family.modules)
    fn = rng.choice(family.functions)
    used = {fn, module}
    mapping: dict[str, object] = {"fn": fn}
    for placeholder, pool in family.names.items():
        choices = [n for n in pool if n not in used]
        if not choices:
            raise ValueError(f"family {family.name}: name pool for ${placeholder} exhausted")
        name = rng.choice(choices)
        used.add(name)
        mapping[placeholder] = name
    consts = family.consts(rng)
    mapping.update(consts)
    text = string.Template(family.template).substitute(mapping)
    text = _shuffle_blocks(text, rng)
    source = ast.unparse(pyast.parse(text))
    return Variant(family.name, module, fn, source, consts, family.cases(rng, consts))


# ---------------------------------------------------------------------------- case helpers


def _ints(rng: random.Random, n: int, lo: int = -9, hi: int = 9) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _words(rng: random.Random, n: int) -> list[str]:
    pool = ["apple", "Bob", "cat", "dog", "a", "an", "sky", "level", "tree", "io", "zebra"]
    return [rng.choice(pool) for _ in range(n)]


def _random_lists(rng: random.Random, k: int, lo: int = -9, hi: int = 9) -> list[tuple]:
    return [(_ints(rng, rng.randint(2, 8), lo, hi),) for _ in range(k)]


# ---------------------------------------------------------------------------- families


def _clamp_cases(rng, c):
    cases = [(5, 0, 10), (-3, 0, 10), (12, 0, 10), (0, 0, 10), (10, 0, 10), (4, 4, 4)]
    for _ in range(5):
        lo = rng.randint(-20, 10)
        hi = lo + rng.randint(0, 15)
        cases.append((rng.randint(lo - 10, hi + 10), lo, hi))
    return cases


CLAMP = Family(
    "clamp",
    ("bounds", "ranges", "limits", "clamping"),
    ("clamp", "clip", "bound_value", "limit_to_range", "constrain", "saturate"),
    {"x": ("x", "value", "v", "n", "amount"), "lo": LO, "hi": HI},
    '''
def $fn($x, $lo, $hi):
    """Return $x limited to the closed range [$lo, $hi] (assumes $lo <= $hi)."""
    if $x < $lo:  #~a
        return $lo
    if $x > $hi:  #~a
        return $hi
    return $x
''',
    _clamp_cases,
)


RUNNING_MAX = Family(
    "running_max",
    ("prefix_stats", "running", "scans"),
    ("running_max", "cumulative_max", "prefix_maxima", "max_so_far"),
    {"xs": SEQ, "out": OUT, "best": ("best", "top", "peak", "highest", "m"), "x": ELEM},
    '''
def $fn($xs):
    """Return a list whose i-th element is the largest of $xs[0..i]."""
    $out = []  #~a
    $best = None  #~a
    for $x in $xs:
        if $best is None or $x > $best:
            $best = $x
        $out.append($best)
    return $out
''',
    lambda rng, c: (
        [([],), ([3],), ([1, 2, 3],), ([3, 2, 1],), ([-5, -2, -9, -1],)] + _random_lists(rng, 6)
    ),
)


RLE = Family(
    "run_length_encode",
    ("compress", "encoding", "rle"),
    ("run_length_encode", "rle_encode", "encode_runs", "compress_runs"),
    {"s": TEXT, "out": OUT, "i": IDX, "j": IDX2},
    '''
def $fn($s):
    """Encode $s as a list of (character, run length) pairs, in order."""
    $out = []
    $i = 0
    while $i < len($s):
        $j = $i
        while $j < len($s) and $s[$j] == $s[$i]:
            $j += 1
        $out.append(($s[$i], $j - $i))
        $i = $j
    return $out
''',
    lambda rng, c: (
        [("",), ("a",), ("aaabccdddd",), ("abc",), ("zzzz",), ("aabbaa",)]
        + [("".join(rng.choice("ab") for _ in range(rng.randint(3, 10))),) for _ in range(4)]
    ),
)


PALINDROME = Family(
    "is_palindrome",
    ("palindromes", "text_checks", "symmetry"),
    ("is_palindrome", "reads_same_backwards", "palindromic", "check_palindrome"),
    {
        "text": TEXT,
        "chars": ("chars", "letters", "cleaned", "norm", "kept"),
        "c": ("c", "ch", "char"),
        "i": IDX,
        "j": IDX2,
    },
    '''
def $fn($text):
    """True if $text reads the same backwards, ignoring case and non-alphanumerics."""
    $chars = [$c.lower() for $c in $text if $c.isalnum()]
    $i = 0  #~a
    $j = len($chars) - 1  #~a
    while $i < $j:
        if $chars[$i] != $chars[$j]:
            return False
        $i += 1  #~b
        $j -= 1  #~b
    return True
''',
    lambda rng, c: [
        ("",),
        ("a",),
        ("Racecar",),
        ("A man, a plan, a canal: Panama",),
        ("abca",),
        ("ab",),
        ("abcba",),
        ("abccba",),
        ("No lemon, no melon",),
        ("palindrome",),
        ("xyzzyx!",),
        ("ax",),
    ],
)


def _bsearch_cases(rng, c):
    xs = sorted(rng.sample(range(-30, 30), rng.randint(5, 9)))
    cases = [([], 3), ([4], 4), ([4], 5), ([1, 3, 5, 7], 1), ([1, 3, 5, 7], 7), ([1, 3, 5, 7], 4)]
    cases += [(xs, xs[k]) for k in (0, len(xs) // 2, len(xs) - 1)]
    cases += [(xs, xs[0] - 1), (xs, xs[-1] + 1)]
    return cases


BINARY_SEARCH = Family(
    "binary_search",
    ("searching", "bsearch", "lookup"),
    ("binary_search", "bisect_find", "find_sorted", "search_sorted", "locate"),
    {
        "xs": SEQ,
        "target": ("target", "key", "needle", "wanted"),
        "lo": LO,
        "hi": HI,
        "mid": ("mid", "middle", "m", "center"),
    },
    '''
def $fn($xs, $target):
    """Index of $target in the sorted list $xs (distinct values), or -1 if absent."""
    $lo = 0  #~a
    $hi = len($xs) - 1  #~a
    while $lo <= $hi:
        $mid = ($lo + $hi) // 2
        if $xs[$mid] == $target:
            return $mid
        if $xs[$mid] < $target:
            $lo = $mid + 1
        else:
            $hi = $mid - 1
    return -1
''',
    _bsearch_cases,
)


WORD_COUNT = Family(
    "word_count",
    ("wordstats", "text_stats", "counting"),
    ("word_count", "count_words", "word_frequencies", "tally_words"),
    {
        "text": TEXT,
        "counts": ("counts", "freq", "table", "seen"),
        "w": ("w", "word", "token", "tok"),
    },
    '''
def $fn($text):
    """Map each lowercased word of $text (punctuation .,!? stripped) with at least
    $K letters to the number of times it occurs."""
    $counts = {}
    for $w in $text.lower().split():
        $w = $w.strip(".,!?")
        if len($w) >= $K:
            $counts[$w] = $counts.get($w, 0) + 1
    return $counts
''',
    lambda rng, c: [
        ("",),
        ("a a a",),
        ("The cat and the hat.",),
        ("Go, go, GO!",),
        ("one two three two one two",),
        ("I am at a zoo",),
        ("hello world, Hello!",),
        (" ".join(_words(rng, 8)),),
        (" ".join(_words(rng, 6)),),
    ],
    lambda rng: {"K": rng.choice([1, 2, 3])},
)


def _classify_consts(rng):
    a, b = rng.choice([(2, 3), (3, 5), (3, 7), (4, 5), (2, 5), (5, 7)])
    wa, wb = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Tic", "Tac")])
    return {"A": a, "B": b, "WA": wa, "WB": wb}


CLASSIFY = Family(
    "fizzbuzz",
    ("games", "classify", "labels"),
    ("fizzbuzz", "classify", "label_number", "game_word", "speak"),
    {"n": ("n", "number", "value", "k", "num")},
    '''
def $fn($n):
    """'$WA$WB' if $n is divisible by $A and $B, '$WA' if only by $A, '$WB' if only
    by $B, else str($n)."""
    if $n % $A == 0 and $n % $B == 0:
        return "$WA$WB"
    if $n % $A == 0:
        return "$WA"
    if $n % $B == 0:
        return "$WB"
    return str($n)
''',
    lambda rng, c: (
        [
            (c["A"],),
            (c["B"],),
            (c["A"] * c["B"],),
            (1,),
            (0,),
            (c["A"] * 2,),
            (c["B"] * 3,),
            (c["A"] * c["B"] * 2,),
            (c["A"] * c["B"] + 1,),
        ]
        + [(rng.randint(1, 100),) for _ in range(3)]
    ),
    _classify_consts,
)


def _merge_cases(rng, c):
    cases = [
        ([], []),
        ([1], []),
        ([], [2]),
        ([1, 3, 5], [2, 4, 6]),
        ([1, 2], [3, 4]),
        ([5, 6], [1, 2]),
        ([1, 1, 2], [1, 3]),
    ]
    for _ in range(4):
        cases.append((sorted(_ints(rng, rng.randint(1, 5))), sorted(_ints(rng, rng.randint(1, 5)))))
    return cases


MERGE_SORTED = Family(
    "merge_sorted",
    ("merging", "sorted_ops", "listmerge"),
    ("merge_sorted", "merge_lists", "merge_two", "combine_sorted"),
    {
        "a": ("a", "left", "first", "xs"),
        "b": ("b", "right", "second", "ys"),
        "out": OUT,
        "i": IDX,
        "j": IDX2,
    },
    '''
def $fn($a, $b):
    """Merge two ascending lists into one ascending list."""
    $out = []  #~a
    $i = 0  #~a
    $j = 0  #~a
    while $i < len($a) and $j < len($b):
        if $a[$i] <= $b[$j]:
            $out.append($a[$i])
            $i += 1
        else:
            $out.append($b[$j])
            $j += 1
    $out.extend($a[$i:])  #~b
    $out.extend($b[$j:])  #~b
    return $out
''',
    _merge_cases,
)


ROTATE = Family(
    "rotate_list",
    ("rotation", "shifting", "listops"),
    ("rotate_left", "rotate", "shift_items", "roll_left"),
    {"xs": SEQ, "k": ("k", "steps", "by", "amount", "shift")},
    '''
def $fn($xs, $k):
    """Rotate $xs left by $k positions (k may exceed the length or be negative)."""
    if not $xs:
        return []
    $k = $k % len($xs)
    return $xs[$k:] + $xs[:$k]
''',
    lambda rng, c: (
        [
            ([], 3),
            ([1], 5),
            ([1, 2, 3, 4, 5], 2),
            ([1, 2, 3], 3),
            ([1, 2, 3], 4),
            ([1, 2, 3, 4], -1),
            ([1, 2, 3], 0),
        ]
        + [(_ints(rng, rng.randint(2, 7)), rng.randint(-8, 8)) for _ in range(4)]
    ),
)


MEDIAN = Family(
    "median",
    ("stats", "central", "summary"),
    ("median", "middle_value", "median_of", "find_median"),
    {
        "xs": SEQ,
        "s": ("ordered", "srt", "sorted_xs", "ranked"),
        "n": ("n", "size", "length", "count"),
        "mid": ("mid", "half", "m", "center"),
    },
    '''
def $fn($xs):
    """Median of a non-empty list of numbers (mean of the two middle values if even)."""
    $s = sorted($xs)
    $n = len($s)
    $mid = $n // 2
    if $n % 2 == 1:
        return $s[$mid]
    return ($s[$mid - 1] + $s[$mid]) / 2
''',
    lambda rng, c: (
        [([5],), ([1, 2],), ([3, 1, 2],), ([4, 1, 3, 2],), ([7, 7, 7, 1],), ([-1, -5, 0],)]
        + _random_lists(rng, 5)
    ),
)


DEDUPE = Family(
    "dedupe",
    ("uniques", "dedup", "cleanup"),
    ("dedupe", "unique_in_order", "remove_duplicates", "distinct"),
    {"xs": SEQ, "seen": ("seen", "visited", "known", "met"), "out": OUT, "x": ELEM},
    '''
def $fn($xs):
    """The elements of $xs without repeats, keeping first occurrences in order."""
    $seen = set()  #~a
    $out = []  #~a
    for $x in $xs:
        if $x not in $seen:
            $seen.add($x)  #~b
            $out.append($x)  #~b
    return $out
''',
    lambda rng, c: (
        [([],), ([1, 1, 1],), ([3, 1, 3, 2, 1],), (["b", "a", "b"],), ([1, 2, 3],)]
        + _random_lists(rng, 5, 0, 4)
    ),
)


CHUNK = Family(
    "chunk_list",
    ("batching", "chunks", "paging"),
    ("chunk", "chunked", "batches", "split_every", "groups_of"),
    {"xs": SEQ, "size": ("size", "n", "width", "per"), "out": OUT, "i": IDX},
    '''
def $fn($xs, $size):
    """Split $xs into consecutive chunks of $size elements (the last may be shorter);
    a $size below 1 gives []."""
    if $size < 1:
        return []
    $out = []
    for $i in range(0, len($xs), $size):
        $out.append($xs[$i:$i + $size])
    return $out
''',
    lambda rng, c: (
        [
            ([], 2),
            ([1, 2, 3, 4], 2),
            ([1, 2, 3, 4, 5], 2),
            ([1, 2, 3], 1),
            ([1, 2, 3], 5),
            ([1, 2], 0),
            ([1, 2, 3, 4, 5, 6, 7], 3),
        ]
        + [(_ints(rng, rng.randint(1, 9)), rng.randint(1, 4)) for _ in range(3)]
    ),
)


CAESAR = Family(
    "caesar_shift",
    ("ciphers", "crypto_toy", "rot"),
    ("caesar", "shift_letters", "rotate_letters", "encode_caesar"),
    {"text": TEXT, "out": OUT, "ch": ("ch", "c", "char", "letter")},
    '''
def $fn($text):
    """Shift each ASCII letter of $text $K places forward in the alphabet, wrapping
    around and keeping case; other characters are unchanged."""
    $out = []
    for $ch in $text:
        if $ch.isalpha() and $ch.islower():
            $out.append(chr((ord($ch) - ord("a") + $K) % 26 + ord("a")))
        elif $ch.isalpha():
            $out.append(chr((ord($ch) - ord("A") + $K) % 26 + ord("A")))
        else:
            $out.append($ch)
    return "".join($out)
''',
    lambda rng, c: [
        ("",),
        ("abc",),
        ("xyz",),
        ("XYZ",),
        ("Hello, World!",),
        ("a1 b2",),
        ("Zebra",),
        (" ".join(_words(rng, 3)),),
    ],
    lambda rng: {"K": rng.randint(1, 25)},
)


VOWELS = Family(
    "count_vowels",
    ("phonetics", "letters", "textcount"),
    ("count_vowels", "vowel_count", "num_vowels", "tally_vowels"),
    {"text": TEXT, "total": COUNT, "ch": ("ch", "c", "char", "letter")},
    '''
def $fn($text):
    """Number of vowels (a, e, i, o, u, either case) in $text."""
    $total = 0
    for $ch in $text.lower():
        if $ch in "aeiou":
            $total += 1
    return $total
''',
    lambda rng, c: (
        [("",), ("xyz",), ("AEIOU",), ("Hello World",), ("a",), ("rhythm and blues",)]
        + [(" ".join(_words(rng, 4)),) for _ in range(3)]
    ),
)


FLATTEN = Family(
    "flatten_one",
    ("nesting", "flatten", "listops"),
    ("flatten_once", "flatten_one_level", "unnest", "splice_sublists"),
    {"xs": SEQ, "out": OUT, "x": ELEM},
    '''
def $fn($xs):
    """Flatten one level: elements that are lists or tuples are spliced in."""
    $out = []
    for $x in $xs:
        if isinstance($x, (list, tuple)):
            $out.extend($x)
        else:
            $out.append($x)
    return $out
''',
    lambda rng, c: [
        ([],),
        ([1, 2],),
        ([[1, 2], [3]],),
        ([1, [2, [3]], (4, 5)],),
        ([[], 1, []],),
        ([[1], 2, [3, 4], 5],),
        ([["a"], "bc"],),
    ],
)


PREFIX_SUMS = Family(
    "prefix_sums",
    ("cumulative", "scans", "prefix"),
    ("prefix_sums", "cumulative_sums", "running_totals", "partial_sums"),
    {"xs": SEQ, "out": OUT, "x": ELEM, "total": COUNT},
    '''
def $fn($xs):
    """List of length len($xs) + 1: element i is the sum of the first i items."""
    $out = [0]
    $total = 0
    for $x in $xs:
        $total = $total + $x
        $out.append($total)
    return $out
''',
    lambda rng, c: [([],), ([5],), ([1, 2, 3],), ([-1, 1, -1],)] + _random_lists(rng, 5),
)


SECOND_LARGEST = Family(
    "second_largest",
    ("ranking", "order_stats", "podium"),
    ("second_largest", "runner_up", "second_max", "next_biggest"),
    {
        "xs": SEQ,
        "first": ("first", "top", "best", "largest"),
        "second": ("second", "runner", "next_best", "follow"),
        "x": ELEM,
    },
    '''
def $fn($xs):
    """Second largest distinct value in $xs, or None if there are fewer than two."""
    $first = None  #~a
    $second = None  #~a
    for $x in $xs:
        if $first is None or $x > $first:
            $second = $first
            $first = $x
        elif $x != $first and ($second is None or $x > $second):
            $second = $x
    return $second
''',
    lambda rng, c: (
        [
            ([],),
            ([1],),
            ([2, 2],),
            ([1, 2],),
            ([2, 1],),
            ([5, 5, 4],),
            ([3, 9, 9, 7],),
            ([-1, -2, -3],),
        ]
        + _random_lists(rng, 4)
    ),
)


GCD = Family(
    "gcd",
    ("divisibility", "number_theory", "arith"),
    ("gcd", "greatest_common_divisor", "common_divisor", "euclid"),
    {"a": ("a", "m", "x", "first"), "b": ("b", "n", "y", "second")},
    '''
def $fn($a, $b):
    """Greatest common divisor of two integers (non-negative; gcd(0, 0) == 0)."""
    $a = abs($a)  #~a
    $b = abs($b)  #~a
    while $b != 0:
        $a, $b = $b, $a % $b
    return $a
''',
    lambda rng, c: (
        [(12, 18), (18, 12), (7, 13), (0, 5), (5, 0), (0, 0), (-12, 8), (100, 10)]
        + [(rng.randint(1, 200), rng.randint(1, 200)) for _ in range(4)]
    ),
)


LEAP = Family(
    "leap_year",
    ("leapyears", "dates", "timekeeping"),
    ("is_leap_year", "leap_year", "is_leap", "has_feb_29"),
    {"y": ("year", "y", "yr")},
    '''
def $fn($y):
    """True for Gregorian leap years."""
    if $y % 400 == 0:
        return True
    if $y % 100 == 0:
        return False
    return $y % 4 == 0
''',
    lambda rng, c: [
        (2000,),
        (1900,),
        (2024,),
        (2023,),
        (2100,),
        (1600,),
        (4,),
        (1,),
        (2400,),
        (1996,),
    ],
)


ROMAN = Family(
    "roman_numerals",
    ("numerals", "roman", "formatting"),
    ("to_roman", "roman_numeral", "int_to_roman", "romanize"),
    {
        "n": ("n", "number", "num", "value"),
        "pairs": ("pairs", "table", "symbols", "digits"),
        "out": OUT,
        "v": ("amount", "weight", "val"),
        "sym": ("sym", "letters", "glyph", "mark"),
    },
    '''
def $fn($n):
    """Roman numeral for 1 <= $n <= 3999."""
    $pairs = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
              (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    $out = ""
    for $v, $sym in $pairs:
        while $n >= $v:
            $out += $sym
            $n -= $v
    return $out
''',
    lambda rng, c: (
        [(1,), (3,), (4,), (9,), (14,), (40,), (90,), (400,), (1994,), (2024,), (3999,)]
        + [(rng.randint(1, 3999),) for _ in range(3)]
    ),
)


TRANSPOSE = Family(
    "transpose",
    ("matrices", "grid", "tables"),
    ("transpose", "transposed", "flip_matrix", "columns_of"),
    {
        "rows": ("rows", "matrix", "grid", "m"),
        "width": ("width", "ncols", "cols", "w"),
        "out": OUT,
        "j": ("j", "col", "c"),
        "row": ("row", "r", "line"),
    },
    '''
def $fn($rows):
    """Transpose a rectangular matrix given as a list of rows ([] stays [])."""
    if not $rows:
        return []
    $width = len($rows[0])
    $out = []
    for $j in range($width):
        $out.append([$row[$j] for $row in $rows])
    return $out
''',
    lambda rng, c: [
        ([],),
        ([[1]],),
        ([[1, 2, 3]],),
        ([[1], [2]],),
        ([[1, 2], [3, 4]],),
        ([[1, 2, 3], [4, 5, 6]],),
        ([[0, 1], [2, 3], [4, 5]],),
    ],
)


BRACKETS = Family(
    "balanced_brackets",
    ("parsing", "brackets", "syntax"),
    ("is_balanced", "balanced", "brackets_ok", "check_brackets"),
    {
        "s": TEXT,
        "pairs": ("pairs", "closing", "match", "opener"),
        "stack": ("stack", "pending", "opened"),
        "ch": ("ch", "c", "char", "token"),
    },
    '''
def $fn($s):
    """True if every bracket (), [], {} in $s is closed in the right order; other
    characters are ignored."""
    $pairs = {")": "(", "]": "[", "}": "{"}
    $stack = []
    for $ch in $s:
        if $ch in "([{":
            $stack.append($ch)
        elif $ch in $pairs:
            if not $stack or $stack.pop() != $pairs[$ch]:
                return False
    return not $stack
''',
    lambda rng, c: [
        ("",),
        ("()",),
        ("([]{})",),
        ("(]",),
        ("((",),
        ("))",),
        ("a(b)c",),
        ("([)]",),
        ("{[()()]}",),
        ("]",),
        ("(()",),
    ],
)


MERGE_INTERVALS = Family(
    "merge_intervals",
    ("intervals", "scheduling", "spans"),
    ("merge_intervals", "union_spans", "coalesce", "merge_ranges"),
    {"spans": ("intervals", "spans", "ranges", "pairs"), "out": OUT, "start": LO, "end": HI},
    '''
def $fn($spans):
    """Merge overlapping or touching [start, end] intervals; result sorted, as lists."""
    $out = []
    for $start, $end in sorted($spans):
        if $out and $start <= $out[-1][1]:
            $out[-1][1] = max($out[-1][1], $end)
        else:
            $out.append([$start, $end])
    return $out
''',
    lambda rng, c: (
        [
            ([],),
            ([[1, 3]],),
            ([[1, 3], [2, 6], [8, 10]],),
            ([[1, 4], [4, 5]],),
            ([[5, 6], [1, 2]],),
            ([[1, 10], [2, 3]],),
            ([[1, 2], [3, 4]],),
        ]
        + [([[a, a + rng.randint(0, 4)] for a in _ints(rng, 4, 0, 12)],) for _ in range(3)]
    ),
)


OVERLAP = Family(
    "interval_overlap",
    ("intervals", "geometry1d", "spans"),
    ("overlap_length", "overlap", "intersection_size", "shared_length"),
    {"a": ("a", "first", "span_a", "r1"), "b": ("b", "second", "span_b", "r2"), "lo": LO, "hi": HI},
    '''
def $fn($a, $b):
    """Length of the intersection of half-open intervals $a=(start, end) and $b."""
    $lo = max($a[0], $b[0])  #~a
    $hi = min($a[1], $b[1])  #~a
    if $hi <= $lo:
        return 0
    return $hi - $lo
''',
    lambda rng, c: (
        [
            ((0, 5), (3, 10)),
            ((3, 10), (0, 5)),
            ((0, 5), (5, 10)),
            ((0, 10), (2, 4)),
            ((0, 1), (4, 6)),
            ((2, 4), (0, 10)),
            ((-5, -1), (-3, 3)),
        ]
        + [
            ((a, a + rng.randint(1, 6)), (b, b + rng.randint(1, 6)))
            for a, b in zip(_ints(rng, 3, 0, 8), _ints(rng, 3, 0, 8), strict=True)
        ]
    ),
)


DIGIT_SUM = Family(
    "digit_sum",
    ("digits", "number_theory", "numeric"),
    ("digit_sum", "sum_of_digits", "digits_total", "add_digits"),
    {"n": ("n", "number", "num", "value"), "total": COUNT},
    '''
def $fn($n):
    """Sum of the base-$BASE digits of abs($n)."""
    $n = abs($n)
    $total = 0
    while $n > 0:
        $total += $n % $BASE
        $n //= $BASE
    return $total
''',
    lambda rng, c: (
        [
            (0,),
            (7,),
            (10,),
            (-123,),
            (99,),
            (1000,),
            (c["BASE"] - 1,),
            (c["BASE"],),
            (c["BASE"] ** 2 + 1,),
        ]
        + [(rng.randint(0, 10**5),) for _ in range(3)]
    ),
    lambda rng: {"BASE": rng.choice([10, 10, 8, 2, 16])},
)


MOVING_AVG = Family(
    "moving_average",
    ("smoothing", "signals", "windows"),
    ("moving_average", "rolling_mean", "sliding_average", "window_means"),
    {"xs": SEQ, "out": OUT, "i": IDX, "window": ("window", "chunk", "frame", "part")},
    '''
def $fn($xs):
    """Means of every window of $K consecutive values of $xs ([] if fewer than $K)."""
    $out = []
    for $i in range(len($xs) - $K + 1):
        $window = $xs[$i:$i + $K]
        $out.append(sum($window) / $K)
    return $out
''',
    lambda rng, c: (
        [
            ([],),
            (list(range(c["K"] - 1)),),
            ([2] * c["K"],),
            ([1, 2, 3, 4, 5, 6],),
            ([10, 0, 10, 0, 10],),
        ]
        + _random_lists(rng, 4, 0, 20)
    ),
    lambda rng: {"K": rng.choice([2, 3, 4])},
)


SAFE_DIVIDE = Family(
    "safe_divide",
    ("division", "safe_math", "ratios"),
    ("safe_divide", "divide_all", "ratios", "pairwise_quotients"),
    {
        "nums": ("nums", "numerators", "tops", "a"),
        "dens": ("dens", "denominators", "bottoms", "b"),
        "default": ("default", "fallback", "on_zero"),
        "out": OUT,
        "x": ("x", "top", "p"),
        "y": ("y", "bottom", "q"),
    },
    '''
def $fn($nums, $dens, $default=$D):
    """Element-wise $nums[i] / $dens[i]; $default where the denominator is 0.
    Extra elements of the longer list are ignored."""
    $out = []
    for $x, $y in zip($nums, $dens):
        if $y == 0:
            $out.append($default)
        else:
            $out.append($x / $y)
    return $out
''',
    lambda rng, c: [
        ([], []),
        ([1], [0]),
        ([6, 3], [3, 0]),
        ([1, 2, 3], [1, 2]),
        ([4], [2], 7),
        ([0, 5], [0, 5], -1),
        ([9, 8, 7], [3, 0, 7]),
    ],
    lambda rng: {"D": rng.choice(["None", "0", "-1", "0.0"])},
)


CAPITALIZE = Family(
    "capitalize_words",
    ("titles", "casing", "formatting"),
    ("capitalize_words", "title_case", "capitalize_each", "headline"),
    {
        "text": TEXT,
        "words": ("words", "parts", "tokens", "pieces"),
        "out": OUT,
        "w": ("w", "word", "tok"),
    },
    '''
def $fn($text):
    """Capitalize each space-separated word of $text (first letter upper, rest lower);
    runs of spaces are kept."""
    $words = $text.split(" ")
    $out = []
    for $w in $words:
        if $w:
            $out.append($w[0].upper() + $w[1:].lower())
        else:
            $out.append($w)
    return " ".join($out)
''',
    lambda rng, c: [
        ("",),
        ("hello",),
        ("hello world",),
        ("hELLO wORLD",),
        ("a  b",),
        (" x ",),
        ("1st place",),
        (" ".join(_words(rng, 4)),),
    ],
)


FIRST_INDEX = Family(
    "find_first_index",
    ("searching", "scan", "lookup"),
    ("first_above", "find_first_greater", "index_over", "first_exceeding"),
    {"xs": SEQ, "limit": ("limit", "threshold", "bar", "cutoff"), "i": IDX, "x": ELEM},
    '''
def $fn($xs, $limit):
    """Index of the first element of $xs greater than $limit, or -1."""
    for $i, $x in enumerate($xs):
        if $x > $limit:
            return $i
    return -1
''',
    lambda rng, c: (
        [
            ([], 0),
            ([1, 2, 3], 0),
            ([1, 2, 3], 2),
            ([1, 2, 3], 3),
            ([5, 1, 6], 5),
            ([3, 3, 4], 3),
            ([-1, -2], -3),
        ]
        + [(_ints(rng, 6), rng.randint(-5, 5)) for _ in range(3)]
    ),
)


MAX_SUBARRAY = Family(
    "max_subarray",
    ("kadane", "subarrays", "optimize"),
    ("max_subarray_sum", "best_run_sum", "kadane", "largest_window_sum"),
    {
        "xs": SEQ,
        "best": ("best", "top", "record"),
        "cur": ("cur", "running", "here", "ending"),
        "x": ELEM,
    },
    '''
def $fn($xs):
    """Largest sum of a non-empty contiguous run of $xs (0 for an empty list)."""
    if not $xs:
        return 0
    $best = $xs[0]  #~a
    $cur = $xs[0]  #~a
    for $x in $xs[1:]:
        $cur = max($x, $cur + $x)
        $best = max($best, $cur)
    return $best
''',
    lambda rng, c: (
        [
            ([],),
            ([5],),
            ([-3],),
            ([-2, -1, -3],),
            ([1, -2, 3, 4, -1],),
            ([-2, 1, -3, 4, -1, 2, 1, -5, 4],),
            ([2, 2, 2],),
        ]
        + _random_lists(rng, 4)
    ),
)


COUNT_RANGE = Family(
    "count_in_range",
    ("histogram", "ranges", "filters"),
    ("count_in_range", "count_between", "how_many_in", "range_count"),
    {"xs": SEQ, "lo": LO, "hi": HI, "count": COUNT, "x": ELEM},
    '''
def $fn($xs, $lo, $hi):
    """How many elements x of $xs satisfy $lo <= x < $hi."""
    $count = 0
    for $x in $xs:
        if $lo <= $x < $hi:
            $count += 1
    return $count
''',
    lambda rng, c: (
        [([], 0, 5), ([0, 5], 0, 5), ([1, 2, 3], 2, 3), ([4, 4, 4], 4, 5), ([1, 2], 5, 1)]
        + [(_ints(rng, 8), rng.randint(-5, 0), rng.randint(0, 6)) for _ in range(4)]
    ),
)


IS_PRIME = Family(
    "is_prime",
    ("primes", "number_theory", "sieve_tools"),
    ("is_prime", "prime", "check_prime", "is_prime_number"),
    {"n": ("n", "number", "num", "candidate"), "d": ("d", "div", "factor", "k")},
    '''
def $fn($n):
    """True if $n is a prime number."""
    if $n < 2:
        return False
    $d = 2
    while $d * $d <= $n:
        if $n % $d == 0:
            return False
        $d += 1
    return True
''',
    lambda rng, c: [(0,), (1,), (2,), (3,), (4,), (9,), (25,), (29,), (49,), (97,), (-7,), (121,)],
)


FIBONACCI = Family(
    "fibonacci_list",
    ("sequences", "recurrences", "series"),
    ("fibonacci", "fib_list", "first_fibs", "fib_sequence"),
    {
        "n": ("n", "count", "howmany", "length"),
        "out": OUT,
        "a": ("a", "prev", "f0"),
        "b": ("b", "curr", "f1"),
    },
    '''
def $fn($n):
    """The first $n Fibonacci numbers starting $START0, $START1."""
    $out = []
    $a, $b = $START0, $START1
    for _ in range($n):
        $out.append($a)
        $a, $b = $b, $a + $b
    return $out
''',
    lambda rng, c: [(0,), (1,), (2,), (3,), (5,), (8,), (12,)],
    lambda rng: dict(zip(("START0", "START1"), rng.choice([(0, 1), (1, 1), (2, 1)]), strict=True)),
)


MODE = Family(
    "most_common",
    ("frequency", "stats", "voting"),
    ("most_common", "mode", "majority_value", "most_frequent"),
    {
        "xs": SEQ,
        "counts": ("counts", "freq", "table"),
        "best": ("best", "winner", "top"),
        "x": ELEM,
    },
    '''
def $fn($xs):
    """Most frequent element of $xs (the smallest one on ties), or None if empty."""
    $counts = {}
    for $x in $xs:
        $counts[$x] = $counts.get($x, 0) + 1
    $best = None
    for $x in sorted($counts):
        if $best is None or $counts[$x] > $counts[$best]:
            $best = $x
    return $best
''',
    lambda rng, c: (
        [([],), ([4],), ([1, 2, 2],), ([3, 3, 1, 1],), ([5, 1, 5, 1, 1],), ([2, 1],)]
        + _random_lists(rng, 4, 0, 4)
    ),
)


IS_SORTED = Family(
    "is_sorted",
    ("ordering", "checks", "validation"),
    ("is_sorted", "non_decreasing", "in_order", "check_sorted"),
    {"xs": SEQ, "i": IDX},
    '''
def $fn($xs):
    """True if $xs is in non-decreasing order."""
    for $i in range(1, len($xs)):
        if $xs[$i] < $xs[$i - 1]:
            return False
    return True
''',
    lambda rng, c: [
        ([],),
        ([1],),
        ([1, 2, 2, 3],),
        ([2, 1],),
        ([1, 3, 2],),
        ([5, 5, 5],),
        ([1, 2, 3, 0],),
        ([-3, -1, 4],),
    ],
)


REVERSE_WORDS = Family(
    "reverse_words",
    ("wordplay", "sentences", "textops"),
    ("reverse_words", "words_backwards", "flip_words", "reverse_sentence"),
    {"text": TEXT, "words": ("words", "parts", "tokens"), "out": OUT, "i": IDX},
    '''
def $fn($text):
    """The whitespace-separated words of $text in reverse order, joined by one space."""
    $words = $text.split()
    $out = []
    for $i in range(len($words) - 1, -1, -1):
        $out.append($words[$i])
    return " ".join($out)
''',
    lambda rng, c: (
        [("",), ("one",), ("one two",), ("a b c d",), ("  hello   world  ",)]
        + [(" ".join(_words(rng, 5)),) for _ in range(2)]
    ),
)


TWO_SUM = Family(
    "two_sum",
    ("pairs", "lookup_tables", "sums"),
    ("two_sum", "pair_with_sum", "find_pair", "sum_pair"),
    {
        "xs": SEQ,
        "target": ("target", "goal", "want"),
        "seen": ("seen", "index_of", "where"),
        "i": IDX,
        "x": ELEM,
    },
    '''
def $fn($xs, $target):
    """(i, j) with i < j and $xs[i] + $xs[j] == $target, j as small as possible and
    then i as small as possible; None if there is no such pair."""
    $seen = {}
    for $i, $x in enumerate($xs):
        if $target - $x in $seen:
            return ($seen[$target - $x], $i)
        if $x not in $seen:
            $seen[$x] = $i
    return None
''',
    lambda rng, c: (
        [
            ([], 3),
            ([1, 2], 3),
            ([2, 7, 11, 15], 9),
            ([3, 3], 6),
            ([3], 6),
            ([1, 5, 2, 4], 6),
            ([1, 2, 3], 10),
            ([0, -1, 1], 0),
        ]
        + [(_ints(rng, 6), rng.randint(-6, 6)) for _ in range(3)]
    ),
)


SUM_EVEN_SQUARES = Family(
    "sum_even_squares",
    ("aggregates", "reductions", "numeric"),
    ("sum_even_squares", "even_square_total", "squares_of_evens", "energy_even"),
    {"xs": SEQ, "total": COUNT, "x": ELEM},
    '''
def $fn($xs):
    """Sum of x * x over the elements x of $xs that are divisible by $M."""
    $total = 0
    for $x in $xs:
        if $x % $M == 0:
            $total += $x * $x
    return $total
''',
    lambda rng, c: (
        [([],), ([1],), ([c["M"]],), ([1, 2, 3, 4, 5, 6],), ([-c["M"], c["M"] + 1],)]
        + _random_lists(rng, 4)
    ),
    lambda rng: {"M": rng.choice([2, 3])},
)


LONGEST_RUN = Family(
    "longest_run",
    ("streaks", "runs", "sequences"),
    ("longest_run", "longest_streak", "max_repeat", "longest_plateau"),
    {
        "xs": SEQ,
        "best": ("best", "longest", "record"),
        "cur": ("cur", "current", "streak", "run"),
        "i": IDX,
    },
    '''
def $fn($xs):
    """Length of the longest block of equal consecutive elements (0 for [])."""
    if not $xs:
        return 0
    $best = 1  #~a
    $cur = 1  #~a
    for $i in range(1, len($xs)):
        if $xs[$i] == $xs[$i - 1]:
            $cur += 1
        else:
            $cur = 1
        $best = max($best, $cur)
    return $best
''',
    lambda rng, c: (
        [([],), ([7],), ([1, 1],), ([1, 2, 2, 2, 3],), ([1, 2, 3],), ([4, 4, 1, 4, 4, 4],)]
        + _random_lists(rng, 4, 0, 2)
    ),
)


def _grade_consts(rng):
    t1 = rng.choice([90, 85, 80])
    gap = rng.choice([10, 15])
    return {"T1": t1, "T2": t1 - gap, "T3": t1 - 2 * gap}


GRADE = Family(
    "letter_grade",
    ("grading", "scores", "school"),
    ("letter_grade", "grade", "score_to_letter", "classify_score"),
    {"score": ("score", "points", "mark", "pct")},
    '''
def $fn($score):
    """'A' for $score >= $T1, 'B' for >= $T2, 'C' for >= $T3, otherwise 'F'."""
    if $score >= $T1:
        return "A"
    elif $score >= $T2:
        return "B"
    elif $score >= $T3:
        return "C"
    return "F"
''',
    lambda rng, c: [
        (100,),
        (c["T1"],),
        (c["T1"] - 1,),
        (c["T2"],),
        (c["T2"] - 1,),
        (c["T3"],),
        (c["T3"] - 1,),
        (0,),
    ],
    _grade_consts,
)


TRUNCATE = Family(
    "truncate_text",
    ("display", "ellipsis", "formatting"),
    ("truncate", "shorten", "ellipsize", "clip_text"),
    {"text": TEXT, "width": ("width", "limit", "max_len", "room")},
    '''
def $fn($text, $width):
    """$text if it fits in $width characters, else cut so that the result including a
    trailing '...' has $width characters (no dots when $width <= 3)."""
    if len($text) <= $width:
        return $text
    if $width <= 3:
        return $text[:$width]
    return $text[:$width - 3] + "..."
''',
    lambda rng, c: [
        ("hello", 10),
        ("hello", 5),
        ("hello", 4),
        ("hello world", 8),
        ("abc", 2),
        ("abcdef", 3),
        ("", 0),
        ("abcdef", 0),
    ],
)


GROUP_BY_LEN = Family(
    "group_by_length",
    ("grouping", "buckets", "indexing"),
    ("group_by_length", "bucket_by_len", "words_by_size", "length_groups"),
    {
        "words": ("words", "items", "names", "tokens"),
        "groups": ("groups", "buckets", "by_len"),
        "w": ("w", "word", "name"),
        "key": ("key", "size", "length"),
    },
    '''
def $fn($words):
    """Map each length to the list of words of $words with that length, in order."""
    $groups = {}
    for $w in $words:
        $key = len($w)
        if $key not in $groups:
            $groups[$key] = []
        $groups[$key].append($w)
    return $groups
''',
    lambda rng, c: (
        [([],), (["a"],), (["ab", "cd", "e"],), (["x", "yy", "z", "ww", "vvv"],)]
        + [(_words(rng, 6),) for _ in range(2)]
    ),
)


FAMILIES: list[Family] = [
    CLAMP, RUNNING_MAX, RLE, PALINDROME, BINARY_SEARCH, WORD_COUNT, CLASSIFY, MERGE_SORTED,
    ROTATE, MEDIAN, DEDUPE, CHUNK, CAESAR, VOWELS, FLATTEN, PREFIX_SUMS, SECOND_LARGEST, GCD,
    LEAP, ROMAN, TRANSPOSE, BRACKETS, MERGE_INTERVALS, OVERLAP, DIGIT_SUM, MOVING_AVG,
    SAFE_DIVIDE, CAPITALIZE, FIRST_INDEX, MAX_SUBARRAY, COUNT_RANGE, IS_PRIME, FIBONACCI, MODE,
    IS_SORTED, REVERSE_WORDS, TWO_SUM, SUM_EVEN_SQUARES, LONGEST_RUN, GRADE, TRUNCATE,
    GROUP_BY_LEN,
]  # fmt: skip
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
