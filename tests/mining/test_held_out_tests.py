"""Issue 44 item 4: a mined task's workspace holds part of the repository's tests out, so
its hidden tests are not the visible ones, and the agent still sees the bug fail."""

from __future__ import annotations

from pathlib import Path

from components.mining.baseline import Repo
from components.mining.task_folder import HELD_OUT_EVERY, held_out_texts
from components.tasks.task import TaskEnvironment

TEST_FILE = """from lib import f, g


def test_f_one():
    assert f(1) == 2


def test_f_two():
    assert f(2) == 3


def test_g():
    assert g(1) == 1


class TestMore:
    def test_f_three(self):
        assert f(3) == 4

    def test_g_two(self):
        assert g(2) == 2


def test_f_four():
    assert f(4) == 5
"""
NODES = ["t/test_lib.py::test_f_one", "t/test_lib.py::test_f_two", "t/test_lib.py::test_g",
         "t/test_lib.py::TestMore::test_f_three", "t/test_lib.py::TestMore::test_g_two",
         "t/test_lib.py::test_f_four"]  # fmt: skip


def _repo() -> Repo:
    return Repo(name="lib", root=Path("/nonexistent"), test_files=["t/test_lib.py"],
                modules=["lib.py"], env=TaskEnvironment(python="3.11"), python_env="",
                src_layout=False, tests={n: "passed" for n in NODES}, coverage={})  # fmt: skip


def test_part_of_each_hidden_file_is_held_out_of_the_workspace():
    failing = ["t/test_lib.py::test_f_one", "t/test_lib.py::test_f_two"]
    for seed in range(HELD_OUT_EVERY):
        visible, held = held_out_texts(_repo(), failing, {"t/test_lib.py": TEST_FILE}, seed)
        names = held["t/test_lib.py"]
        assert names and len(names) <= len(NODES) // HELD_OUT_EVERY + 1
        assert visible["t/test_lib.py"] != TEST_FILE  # hidden is not visible
        for name in names:  # the held-out tests are gone from the workspace's copy only
            assert f"def {name.split('::')[-1]}(" not in visible["t/test_lib.py"]
            assert f"def {name.split('::')[-1]}(" in TEST_FILE
        assert "test_f_one" not in names and "def test_f_one(" in visible["t/test_lib.py"]
        compile(visible["t/test_lib.py"], "test_lib.py", "exec")


def test_the_draw_is_the_seed_s_and_a_file_that_cannot_be_cut_stays_whole():
    failing = ["t/test_lib.py::test_f_one"]
    first = held_out_texts(_repo(), failing, {"t/test_lib.py": TEST_FILE}, 3)
    assert held_out_texts(_repo(), failing, {"t/test_lib.py": TEST_FILE}, 3) == first
    only = "from lib import f\n\n\ndef test_f_one():\n    assert f(1) == 2\n"
    repo = _repo()
    repo.tests = {"t/test_lib.py::test_f_one": "failed"}
    visible, held = held_out_texts(repo, failing, {"t/test_lib.py": only}, 0)
    assert visible == {"t/test_lib.py": only} and held == {}  # its one test is the failing one
