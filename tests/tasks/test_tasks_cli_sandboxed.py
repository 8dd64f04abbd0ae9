"""One import path, always sandboxed: `python -m components.tasks check|import` and
`agentrl tasks check|import` are the same code, and task code runs only in the sandbox.

The probe is a task whose hidden test writes to a host file outside its task folder (a
fixed path under tmp_path, and the test process's $HOME): run unsandboxed it leaves the
files behind (the control); through either command line it must not.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import components.tasks.__main__ as tasks_cli
from components.tasks.gate import subprocess_run_tests
from components.tasks.task import TaskMetadata, write_task_folder

ROOT = Path(__file__).resolve().parents[2]


def _escaping_task(root: Path, targets: list[Path]) -> Path:
    test = (
        "import os\n\nfrom m import f\n\n\ndef test_f():\n"
        f"    for path in {[str(t) for t in targets]!r} + [os.path.expanduser('~/escaped')]:\n"
        "        try:\n            with open(path, 'w') as fh:\n                fh.write('escaped')\n"
        "        except OSError:\n            pass\n    assert f() == 2\n"
    )
    write_task_folder(
        root / "tasks" / "escape",
        task_id="escape",
        instruction="fix f",
        metadata=TaskMetadata(family="probe", bug_class="wrong_constant", split="test"),
        repo_files={
            "m.py": "def f():\n    return 1\n",
            "tests/test_m.py": "def test_ok():\n    pass\n",
        },
        hidden_test_files={"tests/test_m_hidden.py": test},
        reference_patch="--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n",
    )
    return root / "tasks"


@pytest.fixture()
def probe(tmp_path):
    outside, home = tmp_path / "outside", tmp_path / "home"
    outside.mkdir()
    home.mkdir()
    targets = [outside / "escaped.txt", home / "escaped.txt"]
    return _escaping_task(tmp_path, targets), targets, home


def test_the_probe_escapes_when_run_unsandboxed(probe):
    """Control: the probe's writes work, so their absence below means containment."""
    tasks_dir, targets, home = probe
    from components.tasks.task import load_task

    passed, _ = subprocess_run_tests(load_task(tasks_dir / "escape"), tasks_dir / "escape" / "repo")
    assert not passed and all(t.exists() for t in targets)


@pytest.mark.parametrize(
    "entry",
    [["-m", "components.tasks", "check"], ["-m", "components.cli", "tasks", "check"],
     ["-m", "components.tasks", "import"], ["-m", "components.cli", "tasks", "import"]],
    ids=["python-m-check", "agentrl-check", "python-m-import", "agentrl-import"],
)  # fmt: skip
def test_both_entry_points_contain_task_code(probe, tmp_path, entry):
    tasks_dir, targets, home = probe
    args = ["--tasks", str(tasks_dir)] if entry[-1] == "check" else [
        str(tasks_dir), "--out", str(tmp_path / "imported")]  # fmt: skip
    env = {**os.environ, "HOME": str(home)}
    out = subprocess.run([sys.executable, *entry, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr  # the gate ran and passed the task
    assert [t for t in targets if t.exists()] == []


def test_python_m_components_tasks_is_the_agentrl_command_line(capsys):
    assert tasks_cli.main(["frobnicate"]) == 2
    assert "unknown command 'tasks frobnicate'" in capsys.readouterr().err


def test_no_command_line_reaches_the_unsandboxed_runner():
    for func in (tasks_cli.main_check, tasks_cli.main_import):
        params = inspect.signature(func).parameters
        assert params["run_tests"].default is inspect.Parameter.empty, func.__name__
    for rel in ("components/cli.py", "components/tasks/__main__.py", "components/env/__main__.py"):
        names = {n.id if isinstance(n, ast.Name) else n.name
                 for n in ast.walk(ast.parse((ROOT / rel).read_text()))
                 if isinstance(n, ast.Name | ast.alias)}  # fmt: skip
        assert "subprocess_run_tests" not in names, rel
