"""generate_suite: determinism, splits, folder contents, task.json round trip, bad folders."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from components.tasks.families import FAMILIES
from components.tasks.generate import GenerateConfig, generate_suite, partition_families
from components.tasks.patching import apply_unified_diff
from components.tasks.task import load_task, load_tasks, task_spec


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def suite40(tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("suite") / "s"
    return out, generate_suite(out, n_tasks=40, seed=3)


def test_same_seed_gives_byte_identical_folders(tmp_path, suite40):
    out, _ = suite40
    again = tmp_path / "again"
    generate_suite(again, n_tasks=40, seed=3)
    assert _tree_bytes(out) == _tree_bytes(again)
    other = tmp_path / "other"
    generate_suite(other, n_tasks=40, seed=4)
    assert _tree_bytes(out) != _tree_bytes(other)


def test_counts_ids_and_suite_json(suite40):
    out, report = suite40
    assert report.by_split == {"train": 24, "val": 8, "test": 8}
    assert (
        report.n_tasks == 40 == sum(report.by_operator.values()) == sum(report.by_family.values())
    )
    suite = json.loads((out / "suite.json").read_text())
    assert suite["seed"] == 3 and suite["n_tasks"] == 40
    assert suite["counts"]["split"] == report.by_split
    assert suite["counts"]["operator"] == report.by_operator
    tasks, errors = load_tasks(out)
    assert errors == []
    assert [t.id for t in tasks] == sorted(
        [f"train-{i:04d}" for i in range(1, 25)]
        + [f"val-{i:04d}" for i in range(1, 9)]
        + [f"test-{i:04d}" for i in range(1, 9)]
    )
    # Bug classes are spread over the operators, not piled on one.
    assert len(report.by_operator) >= 8


def test_split_property(suite40):
    out, report = suite40
    tasks, _ = load_tasks(out)
    fam = {
        s: {t.metadata.family for t in tasks if t.metadata.split == s}
        for s in ("train", "val", "test")
    }
    train_fams, test_fams = partition_families(FAMILIES, 0.25, GenerateConfig().family_split_salt)
    assert report.family_partition["test"] == [f.name for f in test_fams]
    assert fam["test"] <= {f.name for f in test_fams}
    assert not fam["test"] & (fam["train"] | fam["val"])  # test families never seen in training
    assert fam["val"] <= {f.name for f in train_fams}
    assert len(test_fams) >= round(0.25 * len(FAMILIES)) - 1
    # val tasks are different bug instances: no buggy module equals any train task's.
    buggy = {t.id: (t.repo_dir / t.metadata.extra["module"]).read_text() for t in tasks}
    train_bugs = {buggy[t.id] for t in tasks if t.metadata.split == "train"}
    assert not any(buggy[t.id] in train_bugs for t in tasks if t.metadata.split == "val")
    assert len(set(buggy.values())) == len(tasks)


def test_task_folder_contents(suite40, tmp_path):
    out, _ = suite40
    task = load_task(out / "val-0003")
    module = task.metadata.extra["module"]
    stem = module[:-3]
    assert sorted(p.name for p in task.repo_dir.rglob("*") if p.is_file()) == sorted(
        [module, f"test_{stem}.py", "pyproject.toml"]
    )
    assert task.hidden_test_files() == [f"tests/test_{stem}_hidden.py"]
    assert (
        f"tests/test_{stem}.py" in task.instruction
        and "Do not modify the tests" in task.instruction
    )
    assert task.is_protected(f"tests/test_{stem}.py") and not task.is_protected(module)
    assert task.metadata.source == "builtin" and task.metadata.bug_class
    patch = task.reference_patch()
    assert patch.startswith(f"--- a/{module}\n+++ b/{module}\n")
    work = tmp_path / "r"
    work.mkdir()
    (work / module).write_text((task.repo_dir / module).read_text())
    apply_unified_diff(work, patch)
    assert (work / module).read_text() != (task.repo_dir / module).read_text()
    hidden = (task.hidden_tests_dir / f"tests/test_{stem}_hidden.py").read_text()
    visible = (task.repo_dir / f"tests/test_{stem}.py").read_text()
    assert hidden.count("def test_") > visible.count("def test_") >= 1


def test_task_json_round_trip(suite40):
    out, _ = suite40
    for folder in sorted(out.iterdir())[:5]:
        if folder.is_dir():
            task = load_task(folder)
            assert task_spec(task) == json.loads((folder / "task.json").read_text())


def test_refuses_non_empty_out_dir(tmp_path):
    (tmp_path / "x.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        generate_suite(tmp_path, n_tasks=3)
    with pytest.raises(FileExistsError):  # overwrite only replaces a previous suite
        generate_suite(tmp_path, n_tasks=3, overwrite=True)
    assert (tmp_path / "x.txt").exists()


def test_config_restricts_operators_and_has_help():
    for f in dataclasses.fields(GenerateConfig):
        assert f.metadata.get("help"), f.name


def test_config_operator_subset(tmp_path):
    cfg = GenerateConfig(operators=("comparison_swap", "arith_swap"))
    report = generate_suite(tmp_path / "s", n_tasks=6, seed=1, config=cfg)
    assert set(report.by_operator) <= {"comparison_swap", "arith_swap"}
    with pytest.raises(ValueError, match="unknown operators"):
        generate_suite(tmp_path / "t", n_tasks=2, config=GenerateConfig(operators=("nope",)))


def _valid_task(root: Path) -> Path:
    (root / "repo").mkdir(parents=True)
    (root / "hidden_tests" / "tests").mkdir(parents=True)
    (root / "hidden_tests" / "tests" / "test_h.py").write_text("def test_x():\n    pass\n")
    spec = {
        "id": "ext-1",
        "instruction": "fix",
        "metadata": {"family": "f", "bug_class": "b", "split": "test"},
    }
    (root / "task.json").write_text(json.dumps(spec))
    return root


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda r: (r / "task.json").unlink(), "no task.json"),
        (lambda r: (r / "task.json").write_text("{not json"), "invalid JSON"),
        (lambda r: _edit(r, lambda s: s.pop("id")), "missing required field 'id'"),
        (lambda r: _edit(r, lambda s: s.update(instruction=3)), "field 'instruction' must be str"),
        (lambda r: _edit(r, lambda s: s["metadata"].update(split="dev")), "field 'split'"),
        (lambda r: _edit(r, lambda s: s.update(verify_command="pytest")), "field 'verify_command'"),
        (lambda r: (r / "repo").rmdir(), "missing folder 'repo/'"),
    ],
)
def test_bad_task_folders_give_one_line_errors(tmp_path, breakage, expected):
    root = _valid_task(tmp_path / "tasks" / "broken")
    _valid_task(tmp_path / "tasks" / "good")
    _edit(tmp_path / "tasks" / "good", lambda s: s.update(id="ext-2"))
    load_task(root)  # valid before the breakage
    breakage(root)
    if expected == "no task.json":  # such a folder is not a task at all
        tasks, errors = load_tasks(tmp_path / "tasks")
        assert [t.id for t in tasks] == ["ext-2"] and errors == []
        return
    tasks, errors = load_tasks(tmp_path / "tasks")
    assert [t.id for t in tasks] == ["ext-2"]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "broken" in errors[0] and expected in errors[0]


def _edit(root: Path, change) -> None:
    spec = json.loads((root / "task.json").read_text())
    change(spec)
    (root / "task.json").write_text(json.dumps(spec))


def test_config_object_call_style(tmp_path):
    a = generate_suite(tmp_path / "a", GenerateConfig(n_tasks=5, seed=2))
    b = generate_suite(tmp_path / "b", 5, 2)
    assert a.task_ids == b.task_ids and a.by_operator == b.by_operator
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    assert "5 tasks (train=3, val=1, test=1)" in a.summary_line()
