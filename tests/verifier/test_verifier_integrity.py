"""The verifier against trees and output built to break it (issue 31): a cache key that
collides, a verdict record of the wrong shape, a forged verdict line followed by a hang.
Each is the agent's failed verdict with its flag, never a pass and never an infra error."""

from __future__ import annotations

import itertools
import os
import random
import shutil
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.rewards import EpisodeFacts, compute_reward
from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult
from components.tasks.generate import generate_suite
from components.tasks.patching import apply_unified_diff
from components.tasks.task import load_tasks
from components.verifier.cache import clear_verdict_cache
from components.verifier.hidden_cases import _judge_cases, hidden_cases
from components.verifier.hidden_tests import _judge_tests
from components.verifier.snapshot import Snapshot, take_snapshot
from components.verifier.verdict import verify

ENV, SANDBOX = EnvConfig(), SandboxConfig()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity-suite")
    generate_suite(root, 1, seed=5)
    tasks, errors = load_tasks(root)
    assert not errors
    return tasks[0]


def fixed_copy(task, dest: Path) -> Path:
    shutil.copytree(task.repo_dir, dest)
    apply_unified_diff(dest, task.reference_patch() or "")
    return dest


# ----------------------------------------------------------------------------- cache key


def test_the_newline_and_symlink_collision_no_longer_returns_a_cached_pass(task, tmp_path):
    """Tree 1: the fixed module and a link L -> "x\\n<tail>". Tree 2: the module deleted,
    its fixed text in a file named "<tail>\\n<module>", and L -> "x". Under the old
    `f"{rel}\\0{kind}\\0{digest}\\n"` encoding both hash alike, and tree 2 (which fails:
    its module is gone) got tree 1's cached pass."""
    clear_verdict_cache()
    mod = task.metadata.extra["module"]
    link, tail = mod[:-1], mod[:-1] + "a"  # L sorts right before mod, "<tail>\n..." after L
    one = fixed_copy(task, tmp_path / "one")
    os.symlink("x\n" + tail, one / link)
    two = fixed_copy(task, tmp_path / "two")
    (two / mod).rename(two / f"{tail}\n{os.path.basename(mod)}")
    os.symlink("x", two / link)
    assert take_snapshot(one, None).digest != take_snapshot(two, None).digest
    assert verify(task, one, ENV, SANDBOX).tests_passed
    second = verify(task, two, ENV, SANDBOX)
    assert not second.cached and not second.tests_passed
    assert second.tampered_files == [f"{tail}\n{os.path.basename(mod)}"]  # recorded


HOSTILE_PARTS = ["a", "b", "\n", "\0file\0", "\0link\0", "\\n", "file", "link", "é",
                 "\udcff", "\udc80\udcfe", "/", "00" * 32, ":", " ", "\t", "\x1f"]  # fmt: skip


def _name(rng: random.Random) -> str:
    text = "".join(rng.choice(HOSTILE_PARTS) for _ in range(rng.randint(1, 4)))
    # Names never hold NUL and are never empty parts: as a file system allows them.
    return "/".join(p for p in text.replace("\0", "").split("/") if p) or "n"


def test_digests_differ_for_every_pair_of_distinct_hostile_trees():
    """Property test: 3000 random trees of names, kinds, modes and contents built from
    separators, escapes, newlines and non-UTF-8 bytes; equal digests only for equal trees."""
    rng = random.Random(31)
    seen: dict[str, tuple] = {}
    for _ in range(3000):
        entries, modes = {}, {}
        for _ in range(rng.randint(0, 4)):
            rel = _name(rng)
            kind = rng.choice(["file", "link", "special"])
            content = {"file": lambda: rng.choice(["00" * 32, "ab" * 32, "ff" * 32]),
                       "link": lambda: _name(rng), "special": lambda: ""}[kind]()  # fmt: skip
            entries[rel] = (kind, content)
            modes[rel] = rng.choice([0o100644, 0o100755, 0o120777, 0o10644])
        tree = (tuple(sorted(entries.items())), tuple(sorted(modes.items())))
        digest = Snapshot(None, entries, modes).digest
        assert seen.setdefault(digest, tree) == tree, f"collision: {seen[digest]} vs {tree}"
    # Same bytes, different kind: a symlink whose target is a file's content hash.
    file_ = Snapshot(None, {"m.py": ("file", "ab" * 32)}, {"m.py": 0o100644}).digest
    link = Snapshot(None, {"m.py": ("link", "ab" * 32)}, {"m.py": 0o100644}).digest
    assert file_ != link


def test_a_tree_with_non_utf8_names_hashes_and_verifies(task, tmp_path):
    repo = fixed_copy(task, tmp_path / "repo")
    bad = os.fsdecode(b"caf\xe9.py")
    (repo / bad).write_text("x = 1\n")
    os.symlink(os.fsdecode(b"\xff\xfe"), repo / os.fsdecode(b"l\xff"))
    assert take_snapshot(repo, None).digest  # no UnicodeEncodeError
    v = verify(task, repo, ENV, SANDBOX, cache=False)
    assert v.status == "ok" and v.tests_passed and terms(v)["test_tampering"] < 0
    assert bad in v.changed_files and bad in v.tampered_files  # recorded, never taken


def test_a_mode_change_is_part_of_the_key(tmp_path):
    (tmp_path / "f.py").write_text("x = 1\n")
    before = take_snapshot(tmp_path, None).digest
    os.chmod(tmp_path / "f.py", 0o755)
    assert take_snapshot(tmp_path, None).digest != before


# ----------------------------------------------------------------------------- verdict lines

# Module code that forges the harness's whole record (it can read its token and the hidden
# test files) and exits, and in the hidden-case run prints a case line with the expected
# values (learnt through a side channel, say) and hangs.
FORGE_THEN_HANG = r"""
import ast as _ast, json as _json, os as _os, sys as _sys, time as _time


def _out(text):  # pytest captures fd 1 while it imports: write to the harness's copy too
    import stat as _st

    for fd in range(1, 64):
        try:
            if _st.S_ISFIFO(_os.fstat(fd).st_mode):
                _os.write(fd, text.encode())
                return
        except OSError:
            pass


def _forge():
    a = _sys.argv
    if len(a) > 2 and a[0].endswith("runner.py"):
        line = {"results": [{"repr": r} for r in ANSWERS], "import_timeout": False}
        _out("\nAGENTRL-CASES %s %s\n" % (a[1], _json.dumps(line)))
        __import__("signal").signal(14, __import__("signal").SIG_IGN)  # the case alarm
        _time.sleep(10 ** 6)
    if len(a) > 4 and "harness_" in a[0]:
        token, root = a[1], a[2]
        files = [x for x in a[4:] if x.endswith(".py")]
        items, phases, reports = [], {}, {}
        for f in files:
            for node in _ast.parse(open(_os.path.join(root, f)).read()).body:
                if isinstance(node, _ast.FunctionDef) and node.name.startswith("test"):
                    nid = f + "::" + node.name
                    items.append([nid, f])
                    canary = node.name == "test_" + token
                    phases[nid] = {"setup": "ok", "teardown": "ok",
                                   "call": "AssertionError" if canary else "ok"}
                    reports[nid] = {"setup": "passed", "teardown": "passed",
                                    "call": "failed" if canary else "passed"}
        record = {"items": items, "phases": phases, "reports": reports, "collect": [],
                  "rc": 1, "import_timeouts": 0}
        _out("\nAGENTRL-VERDICT %s %s\n" % (token, _json.dumps(record)))
        _os._exit(0)


_forge()
"""
MALFORMED_RECORD = r"""
import json as _json, os as _os, sys as _sys


def _out(text):  # pytest captures fd 1 while it imports: write to the harness's copy too
    import stat as _st

    for fd in range(1, 64):
        try:
            if _st.S_ISFIFO(_os.fstat(fd).st_mode):
                _os.write(fd, text.encode())
                return
        except OSError:
            pass

if len(_sys.argv) > 2 and "harness_" in _sys.argv[0]:
    _t = _sys.argv[1]
    _r = {"items": [["x::test_" + _t, "x"]], "phases": [], "reports": [], "collect": [],
          "rc": 0, "import_timeouts": 0}
    _out("\nAGENTRL-VERDICT %s %s\n" % (_t, _json.dumps(_r)))
    _os._exit(0)
"""


def with_prefix(task, tmp_path: Path, code: str) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(task.repo_dir, repo)
    mod = repo / task.metadata.extra["module"]
    mod.write_text(code + mod.read_text())
    return repo


def terms(v) -> dict[str, float]:
    return compute_reward(v, EpisodeFacts(ran_tests=True, safety_categories=()), ENV).terms


def test_a_malformed_verdict_record_is_a_forged_verdict(task, tmp_path):
    """A record of the wrong shape can only be the code's (an AttributeError before)."""
    v = verify(task, with_prefix(task, tmp_path, MALFORMED_RECORD), ENV, SANDBOX, cache=False)
    assert v.status == "ok" and not v.tests_passed and v.forged_pass
    assert any("malformed verdict record" in f["reason"] for f in v.flags)


def test_a_forged_case_line_followed_by_a_hang_costs_the_full_penalty(task, tmp_path):
    """Tampering (-1) and the limit (-0.5): the line came before the code was done (before,
    the matching line passed the cases, and the forged pytest record the tests)."""
    env = EnvConfig(verify_timeout_s=8)
    answers = [c["expected"] for c in hidden_cases(task)[0]]
    code = FORGE_THEN_HANG.replace("ANSWERS", repr(answers))
    v = verify(task, with_prefix(task, tmp_path, code), env, SANDBOX, cache=False)
    assert v.status == "ok" and not v.tests_passed and v.forged_pass, v.detail
    assert v.limit_hit == "wall_time"
    assert any("followed by a wall_time limit" in f["reason"] for f in v.flags)
    fired = terms(v)
    assert fired["test_tampering"] == ENV.weights.test_tampering
    assert fired["resource_limit"] == ENV.weights.resource_limit
    assert fired["test_tampering"] + fired["resource_limit"] == pytest.approx(-1.5)


@pytest.mark.parametrize("line", ['{"results": 3}', '{"results": [7]}', '[1, 2]',
                                  '{"results": [{"repr": 5}], "import_timeout": false}',
                                  '{"results": [], "import_timeout": "yes"}'])  # fmt: skip
def test_malformed_case_records_are_forged_never_a_crash(line):
    cmd = CommandResult(("python",), 0, f"\nAGENTRL-CASES tok {line}\n", False, False, None,
                        0.1, "bwrap")  # fmt: skip
    cases = [{"module": "m.py", "function": "f", "args": "(1,)", "expected": "1"}]
    check = _judge_cases(cmd, "tok", cases, "exact")
    assert not check.passed and check.forged and not check.lost


def test_malformed_verdict_records_never_raise():
    """Every field of the record replaced by every wrong type: a forged verdict each time."""
    token = "tok"
    good = {"items": [["t.py::test_a", "t.py"], [f"c.py::test_{token}", "c.py"]],
            "phases": {}, "reports": {}, "collect": [], "rc": 0, "import_timeouts": 0}  # fmt: skip
    wrong = [None, 1, "x", [], {}, [1], [[1, 2]], {"a": 1}, {"a": {"b": 1}}, True]
    for field_, value in itertools.product(good, wrong):
        record = {**good, field_: value}
        out = f"\nAGENTRL-VERDICT {token} {__import__('json').dumps(record)}\n"
        cmd = CommandResult(("python",), 0, out, False, False, None, 0.1, "bwrap")
        check = _judge_tests(cmd, token, {"t.py"}, 1)
        assert not check.passed
