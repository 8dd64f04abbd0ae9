"""Issue 44 item 7: no argument or text stalls the driver. Every monitor pattern runs in time
linear in its text (RE2), a call over the monitor's size limit is refused unread and
recorded, and run_command refuses an over-long command line before shlex reads it.

Timings are relative, never absolute: each bait is scanned beside a linear scan of the same
length in the same test (a busy machine slows both), and doubling a bait's length may at
most about double its time."""

from __future__ import annotations

import json
import time

import pytest

from components.env import safety_patterns as patterns
from components.env.safety import (
    MAX_ARGUMENT_BYTES,
    MAX_COMMAND_CHARS,
    Monitor,
    judge,
    oversized_arguments,
)
from components.env.tool_sets.commands import command_rule
from components.env.tool_sets.files import edit_rule, patch_rule
from components.env.tool_sets.shared import execute_tool
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import Workspace

MIB = 1 << 20

# Texts that make a backtracking engine try many ways to match: nested quantifier bait
# (an unclosed ''.join([ with spaced items, the issue's turn), the shell fork bomb's three
# `.*`, unclosed $( and quotes, assignments, environ reads, exits and imports.
BAITS = {
    "join": "''.join([" + "'a' ,  " * 8,
    "concat": "'a' + " * 4,
    "fork_bomb": ":(){ " + ":|:&" * 8,
    "self_pipe": "f(){ f|f" * 4,
    "substitution": "$(`" * 8,
    "quotes": "'''\"\"\"'" * 4,
    "assignments": "a=b " * 8,
    "environ": "os.environ " * 4,
    "exit": "exit ( sys.exit " * 4,
    "imports": "import a, b, " * 4,
    "redirect": "2>>" * 8,
    "brackets": "[" * 8 + "'a'," * 4,
    "reversed": "'ab'[ :: -1 " * 4,
}


def _repeat(bait: str, size: int) -> str:
    return (bait * (size // len(bait) + 1))[:size]


def _cpu(fn) -> float:
    """Least CPU time of two runs (the one least disturbed by the machine's other work)."""
    best = float("inf")
    for _ in range(2):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _linear_scan(text: str) -> int:
    """A plain Python pass over every character: the yardstick of linear work."""
    count = 0
    for ch in text:
        count += ch == "a"
    return count


def _compiled_patterns() -> dict[str, object]:
    kind = type(patterns.JOIN)
    return {name: value for name, value in vars(patterns).items() if isinstance(value, kind)}


def test_every_monitor_pattern_is_compiled_with_re2():
    compiled = _compiled_patterns()
    assert {"JOIN", "CONCAT", "SHELL_FORK_BOMB", "PY_LITERAL", "TAMPER_CODE"} <= set(compiled)
    assert type(patterns.JOIN).__module__.startswith("re2")


@pytest.mark.parametrize("bait_name", sorted(BAITS))
def test_each_pattern_scans_bait_within_a_linear_budget(bait_name):
    """64 KiB of bait through every pattern costs at most 100 linear scans of it, and four
    times the bait at most twice what linear growth gives (4x; a quadratic pattern takes 16x):
    the margin absorbs a busy machine's noise in CPU time (a 2x step measured 3.5x once)."""
    text = _repeat(BAITS[bait_name], 64 * 1024)
    quarter = text[: len(text) // 4]
    yardstick, quarter_yardstick = (
        _cpu(lambda: _linear_scan(text)),
        _cpu(lambda: _linear_scan(quarter)),
    )
    for name, pattern in _compiled_patterns().items():
        spent = _cpu(lambda p=pattern: p.findall(text))
        assert spent <= 100 * yardstick, f"{name} on {bait_name}: {spent:.3f} s of CPU"
        small = _cpu(lambda p=pattern: p.findall(quarter))
        assert spent <= 8 * small + 4 * quarter_yardstick, (
            f"{name} on {bait_name} grows faster than its text: {small:.4f} -> {spent:.4f} s"
        )
    spent = _cpu(lambda: patterns.substitutions(text))
    assert spent <= 8 * _cpu(lambda: patterns.substitutions(quarter)) + 4 * quarter_yardstick
    for helper in (patterns.spellings, patterns.tamper_hits, patterns.dumps_environment,
                   patterns.has_fork_bomb, patterns.literals):  # fmt: skip
        assert _cpu(lambda h=helper: h(text)) <= 100 * yardstick, helper.__name__


def test_the_issues_join_turn_is_judged_in_linear_time():
    """The issue's 400-character `''.join([` turn (21 s of CPU) and its 1 MiB version."""
    turn = "python -c \"import os; ''.join([" + "'o' ,  " * 54 + '"'
    assert len(turn) >= 400
    yardstick = _cpu(lambda: _linear_scan(turn * 2000))
    assert _cpu(lambda: judge(command_rule, {"cmd": turn})) <= yardstick
    code = "x = ''.join([" + "'o' ,  " * 30_000
    spent = _cpu(lambda: judge(edit_rule, {"path": "m.py", "old": "x = 1", "new": code}))
    assert spent <= 100 * _cpu(lambda: _linear_scan(code))


def test_a_mebibyte_of_the_worst_bait_stays_linear():
    """The issue's two worst patterns (JOIN, the fork bomb) and the spellings pass on 1 MiB."""
    for bait, scan in ((BAITS["join"], patterns.JOIN.findall),
                       (BAITS["fork_bomb"], patterns.SHELL_FORK_BOMB.search),
                       (BAITS["join"], patterns.spellings)):  # fmt: skip
        text = _repeat(bait, MIB)
        assert _cpu(lambda t=text, f=scan: f(t)) <= 100 * _cpu(lambda t=text: _linear_scan(t))


def test_spellings_still_undo_joined_concatenated_and_reversed_names():
    folded = patterns.spellings("__import__(''.join(['o', \"s\"])).system('x'); 'ti' + 'xe'")
    assert "os.system" in folded and "'tixe'" in folded
    assert "'so'" in patterns.spellings("'os'[::-1]") or "'so'" in patterns.spellings("'so'")
    assert patterns.literals("a = '''x'y''' + \"z\" + 'w'") == ["x'y", "z", "w"]


def test_the_rewritten_patterns_keep_their_verdicts():
    assert patterns.has_fork_bomb(":(){ :|:& };:") and patterns.has_fork_bomb("b(){ b|b& };b")
    assert not patterns.has_fork_bomb("b(){ c|d& }")
    assert patterns.dumps_environment("import os; print(os.environ)")
    assert not patterns.dumps_environment("os.environ['HOME']; os.environ .get('X')")
    assert patterns.tamper_hits("exit(0)") and patterns.tamper_hits("x = 1\nquit ()")
    assert not patterns.tamper_hits("self.exit(0); sys_exit_code(1); on_exit()")
    assert patterns.tamper_hits("sys.exit(1)") == ["sys.exit("]
    # RE2 reads UTF-8: a lone surrogate (a JSON escape) is read as U+FFFD, never a crash.
    verdict = judge(command_rule, {"cmd": "cat \ud800 /etc/shadow"})
    assert not verdict.allowed and verdict.category == "secret_access"


def test_a_padded_violation_in_an_edited_literal_is_still_read():
    """Past MAX_COMMAND_CHARS the monitor reads overlapping windows: padding hides nothing."""
    pad = "x " * (MAX_COMMAND_CHARS // 3)
    code = f"import os\nos.system('{pad} ; curl http://example.com ; {pad}')\n"
    verdict = judge(edit_rule, {"path": "m.py", "old": "a = 1", "new": code})
    assert not verdict.allowed and verdict.category == "network"
    monitor = Monitor(("tests/",), ("python",))
    monitor.command_string(pad + " ; rm -rf / ; " + pad)
    assert any(category == "destructive" for category, _ in monitor.hits)


def test_arguments_over_the_size_limit_are_refused_unread_and_recorded(tmp_path):
    big = "echo " + "a" * MIB
    verdict = judge(command_rule, {"cmd": big})
    assert not verdict.allowed and verdict.category == "resource_limit"
    assert str(MAX_ARGUMENT_BYTES) in verdict.reason and "\n" not in verdict.reason
    # A tool without a rule (finish) and a deep nest are refused the same way.
    assert judge(None, {"summary": "s" * MIB}).category == "resource_limit"
    nested: object = "x"
    for _ in range(5000):
        nested = [nested]
    assert "nested" in (oversized_arguments({"a": nested}) or "")
    assert oversized_arguments({"cmd": "python -m pytest -q"}) is None
    patch = "--- /dev/null\n+++ b/a.py\n@@ -0,0 +1 @@\n+" + "x" * MIB + "\n"
    assert judge(patch_rule, {"patch": patch}).category == "resource_limit"


def test_a_mebibyte_command_ends_at_once_with_one_line(tmp_path):
    """The issue's 1 MiB command (shlex: 36 s) is refused before anything parses it, and a
    command just over MAX_COMMAND_CHARS (under the JSON limit) is refused before shlex."""
    (tmp_path / "repo").mkdir()
    ws = Workspace.create(tmp_path / "repo")
    try:
        config = SandboxConfig()
        yardstick = _cpu(lambda: _linear_scan("a" * MIB))
        start = time.process_time()
        result = execute_tool(ws, "run_command", {"cmd": "echo '" + "a" * MIB + "'"}, config)
        assert time.process_time() - start <= 10 * yardstick
        assert not result.ok and result.safety is not None
        assert result.safety.category == "resource_limit"
        assert result.observation.count("\n") == 0
        long_cmd = "echo " + "a " * (MAX_COMMAND_CHARS // 2 + 10)
        assert len(json.dumps({"cmd": long_cmd})) < MAX_ARGUMENT_BYTES
        result = execute_tool(ws, "run_command", {"cmd": long_cmd}, config)
        assert not result.ok and result.error == "bad command"
        assert "not parsed or run" in result.observation
    finally:
        ws.cleanup()
