"""The data gate on generated, deliberately broken and QuixBugs tasks; the CLI functions.

The command line passes the sandboxed runners (tests/tasks/test_tasks_cli_sandboxed.py);
here the trusted generated suite runs under the local runner, which no command reaches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from components.tasks.__main__ import main_check, main_generate, main_import
from components.tasks.gate import UNVERIFIED, check_tasks, hang_finder, subprocess_run_tests
from components.tasks.generate import generate_suite
from components.tasks.task import (
    HIDDEN_CASES_FILE,
    TaskMetadata,
    load_task,
    load_tasks,
    write_task_folder,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "external_quixbugs"


@pytest.fixture(scope="module")
def suite12(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gate") / "suite"
    generate_suite(out, n_tasks=12, seed=0)
    return out


def test_gate_passes_generated_suite(suite12):
    tasks, errors = load_tasks(suite12)
    assert errors == [] and len(tasks) == 12
    report = check_tasks(tasks, run_tests=subprocess_run_tests, workers=2)
    assert report.failed == {}, report.summary_table()
    assert sorted(report.passed) == sorted(t.id for t in tasks)
    assert report.unverified == []
    assert "total" in report.summary_table()


def _copy(task_dir: Path, dst: Path) -> Path:
    shutil.copytree(task_dir, dst)
    return dst


def test_gate_reports_broken_tasks(suite12, tmp_path):
    src = suite12 / "train-0002"
    module = load_task(src).metadata.extra["module"]
    buggy = (src / "repo" / module).read_text()

    no_fix = _copy(src, tmp_path / "no_fix")  # a reference that doesn't fix the bug
    (no_fix / "reference.patch").write_text(
        f"--- a/{module}\n+++ b/{module}\n@@ -1 +1,2 @@\n+# tweak\n {buggy.splitlines()[0]}\n"
    )
    no_bug = _copy(src, tmp_path / "no_bug")  # the 'bug' doesn't fail: repo is already fixed
    from components.tasks.patching import apply_unified_diff

    apply_unified_diff(no_bug / "repo", (no_bug / "reference.patch").read_text())
    bad_patch = _copy(src, tmp_path / "bad_patch")
    (bad_patch / "reference.patch").write_text(
        f"--- a/{module}\n+++ b/{module}\n@@ -1 +1 @@\n-not in file\n+x\n"
    )
    edits_tests = _copy(src, tmp_path / "edits_tests")
    (edits_tests / "reference.patch").write_text(
        "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n+collect_ignore = ['.']\n"
    )
    unverified = _copy(src, tmp_path / "unverified")
    (unverified / "reference.patch").unlink()

    for n, d in enumerate([no_fix, no_bug, bad_patch, edits_tests, unverified]):
        spec = json.loads((d / "task.json").read_text())
        spec["id"] = f"broken-{n}-{d.name}"
        (d / "task.json").write_text(json.dumps(spec))
    tasks, errors = load_tasks(tmp_path)
    assert errors == [] and len(tasks) == 5
    report = check_tasks(tasks, workers=2)
    assert report.failed.keys() == {
        "broken-0-no_fix", "broken-1-no_bug", "broken-2-bad_patch", "broken-3-edits_tests"
    }  # fmt: skip
    assert "hidden tests fail with reference.patch applied" in report.failed["broken-0-no_fix"]
    assert "bug not detected" in report.failed["broken-1-no_bug"]
    assert "does not apply" in report.failed["broken-2-bad_patch"]
    assert "protected paths: tests/conftest.py" in report.failed["broken-3-edits_tests"]
    assert report.passed == report.unverified == ["broken-4-unverified"]
    check = next(c for c in report.checks if c.task_id == "broken-4-unverified")
    assert check.reason == UNVERIFIED


def test_gate_survives_a_crashing_runner(suite12):
    task = load_task(suite12 / "test-0001")

    def boom(task, repo_dir):
        raise RuntimeError("sandbox down")

    report = check_tasks([task], run_tests=boom, workers=1)
    assert "gate error: RuntimeError: sandbox down" in report.failed[task.id]


def test_quixbugs_fixtures_load_and_pass_gate(tmp_path, capsys):
    tasks, errors = load_tasks(FIXTURES)
    assert errors == [] and 5 <= len(tasks) <= 8
    for t in tasks:
        assert t.metadata.source == "quixbugs" and t.has_reference
        assert t.metadata.extra["attribution"]["license"] == "MIT"
    # `import` = load + gate + copy valid tasks.
    code = main_import(
        ["--src", str(FIXTURES), "--out", str(tmp_path / "imported"), "--workers", "2"],
        run_tests=subprocess_run_tests,
        run_python=_no_python,
    )
    assert code == 0, capsys.readouterr().out
    imported = sorted(p.name for p in (tmp_path / "imported").iterdir() if p.name[0] != ".")
    assert imported == sorted(t.id for t in tasks)  # (and the import's output manifest)


def test_cli_generate_and_check(tmp_path, capsys):
    out = tmp_path / "suite"
    assert main_generate(["--out", str(out), "--n", "2", "--seed", "5"]) == 0
    assert "wrote 2 tasks" in capsys.readouterr().out
    report_path = tmp_path / "gate.json"
    argv = ["--tasks", str(out), "--workers", "2", "--report", str(report_path)]
    assert main_check(argv, run_tests=subprocess_run_tests) == 0
    data = json.loads(report_path.read_text())
    assert len(data["passed"]) == 2 and data["failed"] == {} and data["load_errors"] == []
    # A broken folder makes check fail (exit 1) and is named in the report.
    bad = out / "zz-broken"
    bad.mkdir()
    (bad / "task.json").write_text("{}")
    assert main_check(["--tasks", str(out), "--report", str(report_path)], run_tests=_never) == 1
    assert "zz-broken" in json.loads(report_path.read_text())["load_errors"][0]


def _never(task, repo_dir):
    return False, "fake runner: always fails"


def _no_python(folder, args, wall_s):
    raise AssertionError("importing task folders runs no benchmark code")


@pytest.mark.slow
def test_full_default_suite_passes_gate(tmp_path):
    """The default suite (300 tasks, seed 0) passes the gate; takes a couple of minutes."""
    report = generate_suite(tmp_path / "suite", n_tasks=300, seed=0)
    assert report.by_split == {"train": 180, "val": 60, "test": 60}
    tasks, errors = load_tasks(tmp_path / "suite")
    assert errors == [] and len(tasks) == 300
    gate = check_tasks(tasks, workers=2)
    assert gate.failed == {}, gate.summary_table()


# ----------------------------------------------------------------------------- hangs

LOOPING = (
    "def count_down(n):\n"
    "    steps = 0\n"
    "    while n > 0:\n"
    "        n = n + 1 if n > 2 else n - 1\n"  # the bug: loops from 3 up; 1 and 2 are right
    "        steps += 1\n"
    "    return steps\n"
)


def _looping_task(root: Path):
    from components.tasks.generate import unified_diff

    visible = (
        "import pytest\n\nfrom countdown import count_down\n\n\n"
        "@pytest.mark.parametrize('n', [1, 4])\ndef test_count(n):\n    assert count_down(n) == n\n"
    )
    hidden = (
        "from countdown import count_down\n\n\n"
        "def test_two():\n    assert count_down(2) == 2\n\n\n"
        "def test_five():\n    assert count_down(5) == 5\n"
    )
    task = write_task_folder(
        root,
        task_id="loop-0001",
        instruction="fix countdown.py",
        metadata=TaskMetadata(family="count_down", bug_class="arith_swap", split="test",
                              source="hand-written"),  # fmt: skip
        repo_files={"countdown.py": LOOPING, "tests/test_countdown.py": visible,
                    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n'},
        hidden_test_files={"tests/test_countdown_hidden.py": hidden},
        reference_patch=unified_diff("countdown.py", LOOPING, LOOPING.replace("n + 1", "n - 1")),
        protected_paths=("tests/", "pyproject.toml"),
    )  # fmt: skip
    cases = [{"args": "(2,)", "expected": "2"}, {"args": "(6,)", "expected": "6"}]
    spec = {"module": "countdown.py", "function": "count_down", "cases": cases}
    (root / HIDDEN_CASES_FILE).write_text(json.dumps(spec))
    return load_task(task.root)


def test_gate_names_the_tests_and_cases_that_hang_on_the_buggy_code(suite12, tmp_path):
    """A warning, not a failure: the looping task passes the gate, and the report names the
    visible test, the hidden test and the hidden case on which its bug loops."""
    from components.env.config import EnvConfig
    from components.tasks.__main__ import _sandboxed_runner
    from components.verifier.gate_runner import sandboxed_test_runner

    run_python = _sandboxed_runner([])[1]  # the command line's: task code only in the sandbox
    looping, plain = _looping_task(tmp_path / "loop"), load_task(suite12 / "test-0001")
    report = check_tasks(
        [looping, plain],
        run_tests=sandboxed_test_runner(EnvConfig(per_test_timeout_s=1.0)),
        workers=1,
        find_hangs=hang_finder(run_python, timeout_s=1.0),
    )
    assert report.ok and report.passed == ["loop-0001", "test-0001"]
    assert report.hanging == {"loop-0001": [
        "visible tests/test_countdown.py::test_count[4]",
        "hidden tests/test_countdown_hidden.py::test_five",
        "hidden case 2: count_down(6,)",
    ]}  # fmt: skip
    assert "HANGS loop-0001 on the buggy code" in report.summary_table()
    assert report.to_dict()["hanging"] == report.hanging
    broken = check_tasks([looping, plain], run_tests=_never, find_hangs=_broken_scan)
    assert broken.failed["loop-0001"] == ("hidden tests fail with reference.patch applied: "
                                          "fake runner: always fails")  # fmt: skip
    # Built-in tasks are not scanned: the generator already rejects looping mutants.
    assert broken.hanging == {"loop-0001": ["hang scan failed: RuntimeError: no sandbox"]}


def _broken_scan(task):
    raise RuntimeError("no sandbox")
