"""apply_unified_diff: multi-file/hunk patches, new and deleted files, errors, path safety."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

from components.tasks.generate import unified_diff
from components.tasks.patching import PatchError, apply_unified_diff, parse_unified_diff


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _diff(rel: str, old: str, new: str) -> str:
    return unified_diff(rel, old, new)


def test_multi_file_multi_hunk_new_and_deleted(tmp_path):
    a_old = "".join(f"line {i}\n" for i in range(1, 31))
    a_new = a_old.replace("line 3\n", "line three\n").replace("line 27\n", "line 27\nextra\n")
    _write(tmp_path, {"pkg/a.py": a_old, "gone.txt": "bye\n"})
    patch = (
        _diff("pkg/a.py", a_old, a_new)
        + "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
        + "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    )
    assert len(parse_unified_diff(patch)[0].hunks) == 2
    changed = apply_unified_diff(tmp_path, patch)
    assert changed == ["gone.txt", "pkg/a.py", "pkg/new.py"]
    assert (tmp_path / "pkg/a.py").read_text() == a_new
    assert (tmp_path / "pkg/new.py").read_text() == "x = 1\ny = 2\n"
    assert not (tmp_path / "gone.txt").exists()


def test_random_edits_round_trip(tmp_path):
    rng = random.Random(7)
    for trial in range(30):
        old_lines = [f"v{rng.randint(0, 5)} = {k}\n" for k in range(rng.randint(1, 40))]
        new_lines = list(old_lines)
        for _ in range(rng.randint(1, 4)):
            op = rng.choice(["ins", "del", "mod"])
            k = rng.randrange(len(new_lines) + (op == "ins")) if new_lines else 0
            if op == "ins" or not new_lines:
                new_lines.insert(k, f"new_{trial} = {k}\n")
            elif op == "del" and len(new_lines) > 1:
                del new_lines[k]
            else:
                new_lines[k] = f"changed_{trial} = {k}\n"
        old, new = "".join(old_lines), "".join(new_lines)
        if old == new:
            continue
        _write(tmp_path, {"f.py": old})
        apply_unified_diff(tmp_path, _diff("f.py", old, new))
        assert (tmp_path / "f.py").read_text() == new


def test_offset_hunk_still_applies(tmp_path):
    old = "a\nb\nc\nd\ne\n"
    patch = _diff("f.txt", old, old.replace("d\n", "D\n"))
    _write(tmp_path, {"f.txt": "header\nheader2\n" + old})  # file shifted by two lines
    apply_unified_diff(tmp_path, patch)
    assert (tmp_path / "f.txt").read_text() == "header\nheader2\na\nb\nc\nD\ne\n"


def test_no_newline_at_end_of_file(tmp_path):
    patch = (
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n"
        "+c\n\\ No newline at end of file\n"
    )
    _write(tmp_path, {"f": "a\nb"})
    apply_unified_diff(tmp_path, patch)
    assert (tmp_path / "f").read_text() == "a\nc"
    # Adding the missing final newline.
    apply_unified_diff(
        tmp_path, "--- a/f\n+++ b/f\n@@ -2 +2 @@\n-c\n\\ No newline at end of file\n+c\n"
    )
    assert (tmp_path / "f").read_text() == "a\nc\n"


def test_mismatch_error_is_clear_and_atomic(tmp_path):
    _write(tmp_path, {"a.py": "x = 1\n", "b.py": "y = 2\n"})
    patch = _diff("a.py", "x = 1\n", "x = 10\n") + _diff("b.py", "y = 3\n", "y = 4\n")
    with pytest.raises(PatchError, match=r"b\.py: hunk #1 .* does not apply.*'y = 2'.*'y = 3'"):
        apply_unified_diff(tmp_path, patch)
    assert (tmp_path / "a.py").read_text() == "x = 1\n"  # nothing written


@pytest.mark.parametrize(
    "header, message",
    [
        ("--- a/../evil.py\n+++ b/../evil.py\n", "'..'"),
        ("--- /etc/passwd\n+++ /etc/passwd\n", "absolute"),
        ("--- a/x/../../evil.py\n+++ b/x/../../evil.py\n", "'..'"),
    ],
)
def test_refuses_escaping_paths(tmp_path, header, message):
    with pytest.raises(PatchError, match=message):
        apply_unified_diff(tmp_path, header + "@@ -1 +1 @@\n-a\n+b\n")


def test_refuses_symlink_escape(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("a\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(outside, repo / "link")
    with pytest.raises(PatchError, match="outside the repository"):
        apply_unified_diff(repo, "--- a/link/f.txt\n+++ b/link/f.txt\n@@ -1 +1 @@\n-a\n+b\n")
    assert (outside / "f.txt").read_text() == "a\n"


@pytest.mark.parametrize(
    "patch, message",
    [
        ("just some text\n", "no file headers"),
        ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+b\n", "header counts"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n*a\n+b\n", "does not start with"),
        ("--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-a\n+b\n", "no such file"),
        ("--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n", "already exists"),
    ],
)
def test_malformed_or_inapplicable(tmp_path, patch, message):
    _write(tmp_path, {"f": "a\n"})
    with pytest.raises(PatchError, match=message):
        apply_unified_diff(tmp_path, patch)


def test_blank_context_line_without_space(tmp_path):
    _write(tmp_path, {"f": "a\n\nb\n"})
    apply_unified_diff(tmp_path, "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n")
    assert (tmp_path / "f").read_text() == "a\n\nc\n"


@pytest.mark.skipif(not (shutil.which("git") and shutil.which("patch")), reason="needs git, patch")
def test_generated_diff_applies_with_git_and_patch(tmp_path):
    old = "def f(x):\n    return x + 1\n\n\ndef g():\n    return 2\n"
    new = old.replace("x + 1", "x - 1")
    patch = _diff("mod.py", old, new)
    for tool in (["git", "apply"], ["patch", "-p1", "--quiet"]):
        d = tmp_path / tool[0]
        _write(d, {"mod.py": old, "p.diff": patch})
        subprocess.run([*tool, "p.diff"] if tool[0] == "git" else [*tool, "-i", "p.diff"],
                       cwd=d, check=True)  # fmt: skip
        assert (d / "mod.py").read_text() == new
