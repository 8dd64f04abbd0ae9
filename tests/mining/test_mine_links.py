"""Links and special files in a repository mined for tasks (issue 45, finding 1, for
`agentrl tasks mine`; components/tasks/folder_safety.py `refuse_unsafe_source_tree`): a
link that stays inside the repository is copied as its target's content (the copy, and so
every mined task, holds folders and regular files only); a link that leaves it, dangles or
loops, a hard link to a file outside it, a FIFO, device or socket are refused before
anything in the repository is read, one line naming the repository and the path; what the
copy leaves out (.git, virtualenvs) is neither checked nor copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.mining.baseline import setup_repo
from components.mining.config import MineConfig, MineError
from components.mining.layout import copy_repo
from components.mining.mine import RepoSource, mine_repository
from components.sandbox.config import SandboxConfig
from components.tasks.environments import PrepareConfig
from components.tasks.folder_safety import UnsafeTaskFolder, refuse_unsafe_entries


def _repo(tmp_path: Path) -> Path:
    """A minimal minable library, and a host file beside it (outside it)."""
    repo = tmp_path / "lib"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "core.py").write_text("def double(x):\n    return 2 * x\n")
    (repo / "tests" / "test_core.py").write_text(
        "from pkg.core import double\n\ndef test_double():\n    assert double(2) == 4\n"
    )
    (repo / "README.md").write_text("the library\n")
    (tmp_path / "host-secret").write_text("root:$6$secret\n")
    return repo


def _outside_file(repo: Path) -> None:
    os.symlink(repo.parent / "host-secret", repo / "pkg" / "data.txt")


def _outside_relative(repo: Path) -> None:
    os.symlink("../../host-secret", repo / "pkg" / "data.txt")


def _outside_folder(repo: Path) -> None:
    os.symlink(repo.parent, repo / "tests" / "fixtures")


def _dangling(repo: Path) -> None:
    os.symlink("missing.py", repo / "pkg" / "gone.py")


def _circle(repo: Path) -> None:
    os.symlink("b.py", repo / "pkg" / "a.py")
    os.symlink("a.py", repo / "pkg" / "b.py")


def _folder_holding_it(repo: Path) -> None:
    os.symlink("..", repo / "pkg" / "up")


def _outside_hop(repo: Path) -> None:
    """A chain that leaves and comes back: its middle link could be changed later."""
    os.symlink(repo / "README.md", repo.parent / "hop")
    os.symlink("../../hop", repo / "pkg" / "readme.txt")


def _hard_link(repo: Path) -> None:
    os.link(repo.parent / "host-secret", repo / "pkg" / "data.txt")


def _fifo(repo: Path) -> None:
    os.mkfifo(repo / "tests" / "feed")


def _link_to_a_fifo(repo: Path) -> None:
    os.mkfifo(repo / "tests" / "feed")
    os.symlink("../tests/feed", repo / "pkg" / "feed.txt")


REFUSED = {
    "absolute link outside": (_outside_file, "pkg/data.txt", "outside the repository"),
    "relative link outside": (_outside_relative, "pkg/data.txt", "outside the repository"),
    "link to a folder outside": (_outside_folder, "tests/fixtures", "outside the repository"),
    "dangling link": (_dangling, "pkg/gone.py", "does not exist"),
    "circle of links": (_circle, "pkg/a.py", "a circle of links"),
    "link to a folder holding it": (_folder_holding_it, "pkg/up", "a copy without end"),
    "link through an outside hop": (_outside_hop, "pkg/readme.txt", "outside the repository"),
    "hard link to a host file": (_hard_link, "pkg/data.txt", "a hard link"),
    "fifo": (_fifo, "tests/feed", "a FIFO"),
    "link to a fifo": (_link_to_a_fifo, "pkg/feed.txt", "a FIFO"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_setup_refuses_an_unsafe_entry_naming_it_before_reading_anything(tmp_path, kind):
    make, path, problem = REFUSED[kind]
    repo = _repo(tmp_path)
    make(repo)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(MineError) as refused:
        setup_repo(repo, work, (), MineConfig(), SandboxConfig(), PrepareConfig())
    message = str(refused.value)
    assert message.startswith(f"lib: {path} is ") and problem in message, message
    assert "\n" not in message
    assert list(work.iterdir()) == []  # nothing copied, no environment built


def test_a_mining_run_on_a_repository_linking_a_host_file_reports_it_and_writes_nothing(
    tmp_path,
):
    repo = _repo(tmp_path)
    _outside_file(repo)
    out = tmp_path / "mined"
    out.mkdir()

    def no_tests(*_args, **_kwargs):
        raise AssertionError("nothing of a refused repository is run")

    report = mine_repository(RepoSource(repo), out, config=MineConfig(),
                             sandbox=SandboxConfig(), run_tests=no_tests)  # fmt: skip
    assert not report.ok and report.kept == []
    assert report.error.startswith("lib: pkg/data.txt is a symbolic link to ")
    assert "outside the repository" in report.error
    assert list(out.iterdir()) == []


def test_links_inside_the_repository_are_copied_as_their_targets_content(tmp_path):
    repo = _repo(tmp_path)
    os.symlink("../README.md", repo / "pkg" / "README.txt")  # a file, relative
    os.symlink(repo / "pkg" / "core.py", repo / "pkg" / "core_alias.py")  # absolute, inside
    os.symlink("README.txt", repo / "pkg" / "chained.txt")  # a chain of links inside
    (repo / "src").mkdir()
    os.symlink("../pkg", repo / "src" / "pkg")  # a folder
    os.symlink("pkg", repo / "pkg_again")  # the same folder twice: a copy, not a loop
    dest = tmp_path / "copy"
    copy_repo(repo, dest)
    refuse_unsafe_entries(dest, "copy")  # folders and regular files only
    assert (dest / "pkg" / "README.txt").read_text() == "the library\n"
    assert (dest / "pkg" / "chained.txt").read_text() == "the library\n"
    assert (dest / "pkg" / "core_alias.py").read_text() == (repo / "pkg" / "core.py").read_text()
    assert (dest / "src" / "pkg" / "core.py").read_text() == (repo / "pkg" / "core.py").read_text()
    assert (dest / "pkg_again" / "README.txt").read_text() == "the library\n"


def test_hard_links_whose_every_name_is_inside_are_kept(tmp_path):
    repo = _repo(tmp_path)
    os.link(repo / "pkg" / "core.py", repo / "pkg" / "core_copy.py")
    dest = tmp_path / "copy"
    copy_repo(repo, dest)
    refuse_unsafe_entries(dest, "copy")
    assert (dest / "pkg" / "core_copy.py").read_text() == (repo / "pkg" / "core.py").read_text()


def test_what_the_copy_leaves_out_is_not_checked(tmp_path):
    """A virtualenv's interpreter links out of the repository, .git may hold anything."""
    repo = _repo(tmp_path)
    (repo / ".venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", repo / ".venv" / "bin" / "python")
    (repo / ".git").mkdir()
    os.mkfifo(repo / ".git" / "fsmonitor")
    os.symlink(repo.parent / "host-secret", repo / "pkg" / "stale.pyc")
    dest = tmp_path / "copy"
    copy_repo(repo, dest)
    assert not (dest / ".venv").exists() and not (dest / ".git").exists()
    assert not (dest / "pkg" / "stale.pyc").exists()


def test_the_check_is_the_one_copy_repo_makes(tmp_path):
    """Every copy of a repository (the work copy, each mutant's tree) goes through it."""
    repo = _repo(tmp_path)
    _outside_relative(repo)
    with pytest.raises(UnsafeTaskFolder, match=r"^lib: pkg/data\.txt is a symbolic link"):
        copy_repo(repo, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
