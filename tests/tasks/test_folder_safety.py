"""Task-folder readers refuse links and special files before reading (issue 45, finding 1):
the shared check (components/tasks/folder_safety.py) on each kind of entry, then once per
format that reads a task folder (our task.json folders, mined task folders, Harbor tasks
through the importer and through `agentrl tasks import`, a QuixBugs checkout), each with a
host file it must not take in. Every refusal is one line naming the task and the path, and
nothing of the task is written."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from components.tasks.folder_safety import UnsafeTaskFolder, refuse_unsafe_entries
from components.tasks.harbor import HarborRefusal
from components.tasks.harbor_import import convert_harbor, import_harbor_task
from components.tasks.quixbugs import convert_quixbugs
from components.tasks.task import TaskFormatError, TaskMetadata, load_task, write_task_folder

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "harbor_humanevalfix"
HOST_FILE = "/etc/passwd"  # readable by anyone: what a link would carry into the task


def _native_task(root: Path) -> Path:
    write_task_folder(
        root,
        task_id=root.name,
        instruction="fix f",
        metadata=TaskMetadata("f", "b", "train"),
        repo_files={"m.py": "x = 1\n"},
        hidden_test_files={"tests/test_m.py": "def test_x():\n    pass\n"},
    )
    return root


def _harbor_task(tmp: Path) -> Path:
    dst = tmp / "src" / "python-0"
    shutil.copytree(FIXTURE / "python-0", dst)
    return dst


# ----------------------------------------------------------------------------- the check


def test_a_folder_of_folders_and_regular_files_passes(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.py").write_text("x = 1\n")
    refuse_unsafe_entries(tmp_path, "t")


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.symlink_to(HOST_FILE), "a symbolic link"),
        (lambda p: p.symlink_to("/etc"), "a symbolic link"),  # a folder link: never walked
        (lambda p: os.link(p.parent / "own.txt", p), "a hard link (2 names"),
        (lambda p: os.mkfifo(p), "a FIFO"),
        (lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), "a socket"),
    ],
)
def test_each_kind_of_unsafe_entry_is_refused_naming_the_task_and_path(tmp_path, make, kind):
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "own.txt").write_text("mine\n")
    make(tmp_path / "deep" / "er" / "entry")
    with pytest.raises(UnsafeTaskFolder) as e:
        refuse_unsafe_entries(tmp_path, "task-7")
    assert str(e.value).startswith("task-7: deep/er/entry is ")
    assert kind in str(e.value) and "\n" not in str(e.value)


def test_a_device_file_is_refused(tmp_path):
    try:
        os.mknod(tmp_path / "zero", 0o666 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("making a device file needs CAP_MKNOD")
    with pytest.raises(UnsafeTaskFolder, match="zero is a character device"):
        refuse_unsafe_entries(tmp_path, "t")


def test_the_task_folder_itself_as_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeTaskFolder, match="the task folder itself is a symbolic link"):
        refuse_unsafe_entries(tmp_path / "link", "link")


# ----------------------------------------------------------------------------- per format


def test_native_task_folders_refuse_a_linked_hidden_test_and_a_fifo(tmp_path):
    root = _native_task(tmp_path / "t1")
    hidden = root / "hidden_tests" / "tests" / "test_m.py"
    hidden.unlink()
    hidden.symlink_to(HOST_FILE)
    with pytest.raises(TaskFormatError, match="hidden_tests/tests/test_m.py is a symbolic link"):
        load_task(root)
    root = _native_task(tmp_path / "t2")
    os.mkfifo(root / "repo" / "pipe")
    with pytest.raises(TaskFormatError, match="repo/pipe is a FIFO"):
        load_task(root)  # returns: a FIFO is never opened


def test_native_task_folders_refuse_a_hard_linked_task_json(tmp_path):
    root = _native_task(tmp_path / "t")
    os.link(root / "task.json", tmp_path / "second-name.json")
    with pytest.raises(TaskFormatError, match="task.json is a hard link"):
        load_task(root)


def test_mined_task_folders_refuse_a_linked_requirements_file(tmp_path):
    """A mined task's environment/requirements.txt is read by the host (load_task)."""
    root = _native_task(tmp_path / "mined-x")
    spec = json.loads((root / "task.json").read_text())
    spec["environment"] = {"python": "3.11", "requirements": "environment/requirements.txt"}
    (root / "task.json").write_text(json.dumps(spec))
    (root / "environment").mkdir()
    (root / "environment" / "requirements.txt").symlink_to(HOST_FILE)
    with pytest.raises(TaskFormatError, match="environment/requirements.txt is a symbolic link"):
        load_task(root)


@pytest.mark.parametrize(
    "rel",
    [
        "instruction.md",
        "environment/has_close_elements.py",
        "tests/check.py",
        "solution/solve.sh",
        "task.toml",
    ],
)
def test_harbor_import_refuses_a_link_anywhere_before_reading(tmp_path, rel):
    src = _harbor_task(tmp_path)
    (src / rel).unlink()
    (src / rel).symlink_to(HOST_FILE)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(HarborRefusal) as e:
        import_harbor_task(src, out)
    assert str(e.value).startswith(f"python-0: {rel} is a symbolic link"), e.value
    assert list(out.iterdir()) == []  # nothing of the task written


def test_harbor_import_refuses_a_hard_linked_test_and_a_linked_task_folder(tmp_path):
    src = _harbor_task(tmp_path)
    os.link(src / "tests" / "check.py", tmp_path / "elsewhere.py")
    folders, errors = convert_harbor(src.parent, tmp_path / "staging", cfg=None)
    assert folders == [] and len(errors) == 1
    assert errors[0].startswith("python-0: tests/check.py is a hard link"), errors
    (src.parent / "python-9").symlink_to(FIXTURE / "python-1")  # a task that is a link
    folders, errors = convert_harbor(src.parent, tmp_path / "staging2", cfg=None)
    assert any(e.startswith("python-9: the task folder itself is a symbolic link") for e in errors)


def test_quixbugs_conversion_refuses_a_linked_program_before_running_anything(tmp_path):
    src = tmp_path / "QuixBugs"
    for folder in ("python_programs", "correct_python_programs", "json_testcases"):
        (src / folder).mkdir(parents=True)
    (src / "correct_python_programs" / "gcd.py").write_text("def gcd(a, b):\n    return a\n")
    (src / "python_programs" / "gcd.py").symlink_to(HOST_FILE)
    (src / "json_testcases" / "gcd.json").write_text("[[1, 2], 1]\n")

    def run_python(*_):
        raise AssertionError("nothing runs before the checkout is checked")

    tasks, errors = convert_quixbugs(src, tmp_path / "out", run_python)
    assert tasks == [] and errors == [
        "quixbugs QuixBugs: python_programs/gcd.py is a symbolic link (refused: a task folder "
        "holds folders and regular files only, so that no host file becomes part of the task)"
    ]
    assert not (tmp_path / "out").exists()


def test_tasks_import_of_a_harbor_task_linking_a_host_file_is_refused(tmp_path):
    """The finding as reported: `ln -sf <host file> H/t/instruction.md`, then
    `agentrl tasks import` (the format told by the layout): refused by name, rc 1, nothing
    imported, the report written."""
    src = _harbor_task(tmp_path)
    (src / "instruction.md").unlink()
    (src / "instruction.md").symlink_to(HOST_FILE)
    out, report = tmp_path / "out", tmp_path / "report.json"
    run = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "agentrl"),
            "tasks",
            "import",
            "--src",
            str(src.parent),
            "--out",
            str(out),
            "--report",
            str(report),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "REFUSED python-0: instruction.md is a symbolic link" in run.stderr, run.stderr
    assert "root:" not in run.stdout + run.stderr  # the host file's content never shown
    assert not out.exists() or not any(out.rglob("task.json"))
    data = json.loads(report.read_text())
    assert data["conversion_errors"][0].startswith("python-0: instruction.md is a symbolic link")
