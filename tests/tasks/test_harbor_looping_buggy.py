"""Issue 46 (and 44's open item): a task whose *buggy* code loops is bounded by the
verifier's limits, not refused. The differential cases' ranking run of the unfixed code
(`reference_cases`) that hits its whole-run limit is the unfixed code's outcome: it answers
none of the calls, the detail says which run hit which limit, and the oracle passes. A
*reference fix* whose case run hits its limit still gives no expected value: that is a
refusal naming the reference fix.

The fixtures loop past every per-call limit (they swallow the limit's exception and sleep,
so the whole run's wall limit ends them and they burn no CPU); the whole run's room is made
small (`ROOM_S`, `UNFIXED_CALL_S`) so the limit is hit in seconds on any machine, loaded or
not: the outcome does not depend on load."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import resolve_isolation
from components.tasks.harbor import add_reference_from_solution
from components.tasks.harbor_import import import_harbor_task
from components.tasks.patching import apply_unified_diff
from components.tasks.task import Task, load_task
from components.verifier import hidden_cases as hc
from components.verifier.cache import clear_verdict_cache
from components.verifier.checks import check_config
from components.verifier.verdict import verify

pytestmark = pytest.mark.skipif(
    resolve_isolation("auto") != "bwrap", reason="Harbor verification needs bubblewrap"
)
CORRECT = "def sum_squares(values):\n    return sum(v * v for v in values)\n"
DOUBLES = "def sum_squares(values):\n    return sum(v * 2 for v in values)\n"
# Loops past every limit a call gets: the limit's TimeoutError is swallowed.
LOOPS = (
    "import time\n\n\ndef sum_squares(values):\n    while True:\n        try:\n"
    "            time.sleep(0.1)\n        except BaseException:\n            pass\n"
)
CHECK = (
    "import sys\n\nsys.path.insert(0, '/app')\n"
    "from squares import sum_squares  # noqa: E402\n\n"
    "assert sum_squares([1, 2, 3]) == 14\nassert sum_squares([]) == 0\n"
    "assert sum_squares([-1, -5, 2]) == 30\n"
)
TEST_SH = (
    "#!/bin/bash\ncd /app\nif python /tests/check.py; then\n"
    "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
)
# A small whole-run room: the looping run hits its wall limit within seconds.
ENV = EnvConfig(verify_timeout_s=4, per_test_timeout_s=0.5)


def _task(root: Path, buggy: str, fixed: str) -> Task:
    files = {
        "task.toml": 'version = "1.0"\n\n[verifier]\ntimeout_sec = 120.0\n',
        "instruction.md": "sum_squares in /app/squares.py is wrong. Fix it.\n",
        "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n"
        "COPY squares.py /app/squares.py\n",
        "environment/squares.py": buggy,
        "tests/test.sh": TEST_SH,
        "tests/check.py": CHECK,
        "solution/solve.sh": f"#!/bin/bash\ncat > /app/squares.py <<'PYEOF'\n{fixed}PYEOF\n",
    }
    for rel, text in files.items():
        (root / "src" / "squares" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / "squares" / rel).write_text(text)
    folder = import_harbor_task(root / "src" / "squares", root / "tasks")
    assert add_reference_from_solution(folder, SandboxConfig())
    return load_task(folder)


@pytest.fixture
def small_room(monkeypatch):
    # raising=False: before the fix the room was a literal 30 s (the test then fails on the
    # refusal it names, not on a missing name).
    monkeypatch.setattr(hc, "ROOM_S", 2.0, raising=False)
    monkeypatch.setattr(hc, "UNFIXED_CALL_S", 0.05)


def test_a_looping_unfixed_run_is_the_buggy_codes_outcome_and_the_oracle_passes(
    tmp_path, small_room
):
    task = _task(tmp_path, LOOPS, CORRECT)
    drawn, comparison = hc.hidden_cases(task)
    assert comparison == "differential" and drawn
    answered = hc.reference_cases(task, drawn, ENV, check_config(task, ENV, SandboxConfig()))
    assert not isinstance(answered, str), answered  # was: "the reference fix's case run hit..."
    assert answered and all(c["unfixed"] is None and c["bug_shows"] for c in answered)
    assert {c["unfixed_lost"] for c in answered} == {
        "the unfixed code's case run hit its wall_time limit"
    }
    for c in answered:  # the expected values are still the reference fix's own
        assert ast.literal_eval(c["expected"]) == sum(v * v for v in ast.literal_eval(c["args"])[0])
    # The oracle's verification (the ranking is cached per task and draw) passes, and says
    # what ranked its cases.
    final = tmp_path / "final"
    shutil.copytree(task.repo_dir, final)
    apply_unified_diff(final, task.reference_patch())
    clear_verdict_cache()
    env = EnvConfig(per_test_timeout_s=0.5)
    v = verify(task, final, env, SandboxConfig())
    assert v.status == "ok" and v.tests_passed and not v.forged_pass, v
    assert "the unfixed code's case run hit its wall_time limit, so it answers none" in v.detail


def test_a_looping_reference_fix_is_still_refused_naming_the_reference_fix(tmp_path, small_room):
    task = _task(tmp_path, DOUBLES, LOOPS)
    drawn, comparison = hc.hidden_cases(task)
    assert comparison == "differential" and drawn
    got = hc.reference_cases(task, drawn, ENV, check_config(task, ENV, SandboxConfig()))
    assert got == "the reference fix's case run hit its wall_time limit"
