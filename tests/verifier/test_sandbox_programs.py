"""The two programs the verifier ships into the sandbox (harness.py, case_runner.py), run
directly as subprocesses on a tiny tree: what they print is what the verifier judges.

They run here without the sandbox (its isolation has its own tests); the environment is the
part of the sandbox's they rely on: the harness plugins on PYTHONPATH, plugin autoload off.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.sandbox.environ import HARNESS_PLUGINS
from components.sandbox.process import CommandResult
from components.verifier.checks import ISOLATED_PYTHON
from components.verifier.hidden_cases import CASE_RUNNER, CASES_MARKER, _judge_cases
from components.verifier.hidden_tests import HARNESS, VERDICT_MARKER, _judge_tests

PACKAGE = Path(__file__).resolve().parents[2] / "components" / "verifier"
TOKEN = "0123456789abcdef"


def _run(tree: Path, argv: list[str]) -> CommandResult:
    env = {**os.environ, "PYTHONPATH": str(HARNESS_PLUGINS),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    env.pop("PYTEST_ADDOPTS", None)
    # The sandbox's `python` is the environment's interpreter: this one here.
    argv = [sys.executable, *ISOLATED_PYTHON[1:], *argv]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    return CommandResult(tuple(argv), proc.returncode, proc.stdout + proc.stderr, False, False,
                         None, 0.0, "none")  # fmt: skip


@pytest.mark.parametrize("name, text", [("harness.py", HARNESS), ("case_runner.py", CASE_RUNNER)])
def test_the_programs_are_shipped_as_they_are_and_import_nothing_of_agentrl(name, text):
    assert text == (PACKAGE / name).read_text()
    tree = ast.parse(text)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "components" for m in imported), imported


def test_the_case_runner_prints_plain_values_and_only_names_errors(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/ops.py").write_text(
        "from . import helper\n\ndef add(a, b):\n    return a + b\n"
    )
    (tmp_path / "pkg/helper.py").write_text("")
    (tmp_path / "mod.py").write_text(
        "class Yes:\n    def __eq__(self, other):\n        return True\n\n"
        "def forged():\n    return Yes()\n\ndef boom():\n    raise KeyError('x')\n"
    )
    (tmp_path / "runner.py").write_text(CASE_RUNNER)
    calls = [["pkg/ops.py", "add", "(1, 2)"], ["mod.py", "forged", "()"],
             ["mod.py", "boom", "()"], ["pkg/ops.py", "add", "([1], [2])"]]  # fmt: skip
    (tmp_path / "args.json").write_text(json.dumps(calls))
    cmd = _run(tmp_path, ["runner.py", TOKEN, "args.json", "5"])
    assert cmd.exit_code == 0, cmd.output
    line = cmd.output.rstrip("\n").splitlines()[-1]
    assert line.startswith(f"{CASES_MARKER} {TOKEN} ")
    record = json.loads(line.split(" ", 2)[2])
    assert record == {"results": [{"repr": "3"}, {"error": "TypeError"}, {"error": "KeyError"},
                                  {"repr": "[1, 2]"}], "import_timeout": False}  # fmt: skip
    cases = [{"module": m, "function": f, "args": a, "expected": e}
             for (m, f, a), e in zip(calls, ["3", "1", "1", "[1, 2]"], strict=True)]  # fmt: skip
    check = _judge_cases(cmd, TOKEN, cases, "exact")
    assert (check.total, check.failed, check.forged, check.lost) == (4, 2, [], "")


def test_the_harness_records_each_phase_and_the_canary(tmp_path):
    (tmp_path / "test_hidden.py").write_text(
        "def test_ok():\n    assert 1 + 1 == 2\n\ndef test_bad():\n    assert 1 + 1 == 3\n"
    )
    tools = tmp_path / f".agentrl-{TOKEN}"
    tools.mkdir()
    (tools / f"harness_{TOKEN}.py").write_text(HARNESS)
    canary = f"{tools.name}/test_{TOKEN}.py"
    (tmp_path / canary).write_text(f"def test_{TOKEN}():\n    raise AssertionError('canary')\n")
    cmd = _run(tmp_path, [f"{tools.name}/harness_{TOKEN}.py", TOKEN, str(tmp_path), "5", "-q",
                          "-p", "no:cacheprovider", "-o", "addopts=", "--timeout=5",
                          "test_hidden.py", canary])  # fmt: skip
    assert cmd.exit_code == 0, cmd.output
    line = cmd.output.rstrip("\n").splitlines()[-1]
    assert line.startswith(f"{VERDICT_MARKER} {TOKEN} ")
    record = json.loads(line.split(" ", 2)[2])
    assert record["rc"] == 1 and record["import_timeouts"] == 0 and record["collect"] == []
    assert [path for _, path in record["items"]] == ["test_hidden.py"] * 2 + [canary]
    assert record["phases"]["test_hidden.py::test_ok"] == {
        "setup": "ok", "call": "ok", "teardown": "ok"}  # fmt: skip
    assert record["phases"]["test_hidden.py::test_bad"]["call"] == "AssertionError"
    assert record["reports"]["test_hidden.py::test_ok"]["call"] == "passed"
    assert record["reports"]["test_hidden.py::test_bad"]["call"] == "failed"
    check = _judge_tests(cmd, TOKEN, {"test_hidden.py"}, 2)
    assert (check.passed, check.total, check.failed, check.forged, check.lost) == (
        False, 2, 1, [], "")  # fmt: skip
