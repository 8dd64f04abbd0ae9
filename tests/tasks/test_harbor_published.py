"""Published Harbor datasets import as they are (issue 46, deliverable 3; issue 45,
finding 8), on tests/fixtures/harbor_humanevalfix: a dataset shaped like HumanEvalFix in
Harbor format (`FROM python:3.10`, a comment, ENV, WORKDIR, COPY of the task's own file,
an unpinned `pip install pytest`), written for these tests. Fast checks read the
Dockerfiles, the layout and the metadata; the `slow` one imports the dataset with
`tasks import --src` alone in the sandbox, exports it and imports the export again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from components.cli_args import CommandError
from components.sandbox.isolation import resolve_isolation
from components.tasks.__main__ import detect_source
from components.tasks.harbor import HarborRefusal, task_env, task_workdir
from components.tasks.harbor_dockerfile import read_dockerfile, resolve_requirements
from components.tasks.harbor_export import export_harbor_task
from components.tasks.harbor_import import MAX_INSTRUCTION_BYTES, import_harbor_task
from components.tasks.task import load_task

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "harbor_humanevalfix"
AGENTRL = str(REPO / ".venv" / "bin" / "agentrl")


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [AGENTRL, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _copy(tmp: Path, *names: str) -> Path:
    src = tmp / "dataset"
    for name in names:
        shutil.copytree(FIXTURE / name, src / name)
    return src


# ----------------------------------------------------------------------------- reading


def test_the_published_dockerfile_is_translated_not_refused():
    env = read_dockerfile(FIXTURE / "python-0" / "environment" / "Dockerfile", task="python-0")
    assert env.python == "3.10" and env.workdir == "/workspace"
    assert dict(env.env) == {"PYTHONDONTWRITEBYTECODE": "1", "CHECK_MODE": "strict"}
    assert env.copies == (("has_close_elements.py", "has_close_elements.py"),)
    assert env.unpinned == ("pytest",) and env.requirements == ()


def test_an_unpinned_harness_package_resolves_to_the_projects_version_without_the_registry():
    from importlib.metadata import version

    assert resolve_requirements("3.10", ["pytest"]) == {"pytest": f"pytest=={version('pytest')}"}


@pytest.mark.integration
def test_an_unpinned_package_resolves_to_exact_pins_through_pip(tmp_path):
    """Needs the package registry (opt-in): `pip install six` becomes six==X."""
    try:
        resolved = resolve_requirements("3.11", ["six"])
    except HarborRefusal as e:
        pytest.skip(f"the package registry cannot be reached: {e}")
    assert resolved["six"].startswith("six==") and " " not in resolved["six"]


def test_the_import_records_python_pins_env_workdir_limits_and_metadata(tmp_path):
    folder = import_harbor_task(FIXTURE / "python-0", tmp_path)
    task = load_task(folder)
    assert task.environment.python == "3.10"  # a Harbor task may have 3.10
    assert [r.split("==")[0] for r in task.environment.requirements] == ["pytest"]
    harbor = task.metadata.extra["harbor"]
    assert harbor["resolved_requirements"]["pytest"].startswith("pytest==")
    assert task_workdir(task) == "/workspace" and task_env(task)["CHECK_MODE"] == "strict"
    assert task.limits.memory_mb == 2048 and harbor["original_id"] == "Python/0"
    assert (task.repo_dir / "has_close_elements.py").is_file()


def test_a_task_without_instruction_or_with_an_oversized_one_is_refused_by_name(tmp_path):
    src = _copy(tmp_path, "python-0", "python-1")
    (src / "python-0" / "instruction.md").unlink()
    with pytest.raises(HarborRefusal, match=r"^python-0: no instruction.md"):
        import_harbor_task(src / "python-0", tmp_path / "out0")
    (src / "python-1" / "instruction.md").write_text("x" * (MAX_INSTRUCTION_BYTES + 1))
    with pytest.raises(HarborRefusal, match=r"^python-1: instruction.md is 1048577 bytes, over"):
        import_harbor_task(src / "python-1", tmp_path / "out1")
    assert not (tmp_path / "out0").exists() and not (tmp_path / "out1").exists()


def test_a_refusal_names_the_task_the_file_and_the_line(tmp_path):
    src = _copy(tmp_path, "python-0")
    dockerfile = src / "python-0" / "environment" / "Dockerfile"
    text = dockerfile.read_text()
    dockerfile.write_text(text + "RUN apt-get install -y git\n")
    with pytest.raises(HarborRefusal) as e:
        import_harbor_task(src / "python-0", tmp_path / "out")
    line = len(text.splitlines()) + 1
    assert str(e.value).startswith(f"python-0: environment/Dockerfile line {line} (RUN): ")


# ----------------------------------------------------------------------------- layout


def test_harbor_is_told_by_its_layout_and_nothing_names_the_formats(tmp_path):
    assert detect_source(FIXTURE) == "harbor"
    assert detect_source(FIXTURE / "python-0") == "harbor"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match="--format harbor"):
        detect_source(tmp_path / "empty")


def test_the_report_is_written_when_nothing_converts(tmp_path):
    src = _copy(tmp_path, "python-0")
    (src / "python-0" / "instruction.md").unlink()
    report = tmp_path / "report.json"
    run = _cli(
        "tasks",
        "import",
        "--src",
        str(src),
        "--out",
        str(tmp_path / "out"),
        "--report",
        str(report),
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "REFUSED python-0: no instruction.md" in run.stderr
    data = json.loads(report.read_text())
    assert data["conversion_errors"] == ["python-0: no instruction.md (a Harbor task's prompt)"]
    assert data["passed"] == []


def test_nothing_recognised_is_refused_naming_format_harbor(tmp_path):
    (tmp_path / "src" / "notes").mkdir(parents=True)
    run = _cli("tasks", "import", "--src", str(tmp_path / "src"), "--out", str(tmp_path / "o"))
    assert run.returncode != 0 and "--format harbor" in run.stderr, run.stderr


# ----------------------------------------------------------------------------- export


def test_export_keeps_metadata_limits_env_and_tests_and_pins_pytest_once(tmp_path):
    task = load_task(import_harbor_task(FIXTURE / "python-0", tmp_path / "in"))
    out = export_harbor_task(task, tmp_path / "exported")
    dockerfile = (out / "environment" / "Dockerfile").read_text()
    assert dockerfile.count("pytest==") == 1 and "FROM python:3.10-slim" in dockerfile
    assert (out / "tests" / "test.sh").read_text() == (
        FIXTURE / "python-0" / "tests" / "test.sh"
    ).read_text()  # the task's own verifier, not pytest on .harbor-tests/test.sh
    back = load_task(import_harbor_task(out, tmp_path / "back"))
    first, second = task.metadata.extra["harbor"], back.metadata.extra["harbor"]
    for key in ("original_id", "workdir", "env"):
        assert first[key] == second[key], key
    for section, key in (
        ("metadata", "difficulty"),
        ("metadata", "tags"),
        ("environment", "cpus"),
        ("environment", "memory_mb"),
        ("verifier", "timeout_sec"),
        ("agent", "timeout_sec"),
        ("environment", "build_timeout_sec"),
    ):
        assert first["task_toml"][section][key] == second["task_toml"][section][key], key
    assert back.limits == task.limits and back.environment == task.environment  # same pins
    assert back.instruction == task.instruction
    assert (back.repo_dir / "has_close_elements.py").read_text() == (
        task.repo_dir / "has_close_elements.py"
    ).read_text()


# ----------------------------------------------------------------------------- sandboxed


@pytest.mark.slow
@pytest.mark.timeout(3000)  # two sandboxed imports of four tasks, each gated
@pytest.mark.skipif(
    resolve_isolation("auto") != "bwrap", reason="Harbor verification needs bubblewrap"
)
def test_the_published_shape_imports_with_src_alone_and_round_trips(tmp_path):
    """python-0 (3.10) and python-1 import; python-2 (its verifier runs its own copy of the
    solution) is refused with that reason; python-3 (buggy code that loops) is bounded and
    imported. Exported and imported again: the same tasks pass the same gate."""
    preset = tmp_path / "preset.yaml"
    preset.write_text(f"sandbox:\n  wall_time_s: 90\n  environments_dir: {tmp_path / 'envs'}\n")
    runs = {}
    for name, src in (("first", FIXTURE), ("second", tmp_path / "exported")):
        report = tmp_path / f"{name}.json"
        run = _cli(
            "tasks",
            "import",
            "--preset",
            str(preset),
            "--src",
            str(src),
            "--out",
            str(tmp_path / name),
            "--report",
            str(report),
            timeout=1500,
        )
        runs[name] = (run, json.loads(report.read_text()))
        if name == "first":
            assert "imported 3 of 3" in run.stdout, run.stdout + run.stderr
            exported = _cli(
                "tasks",
                "export",
                "--format",
                "harbor",
                "--tasks",
                str(tmp_path / name),
                "--out",
                str(tmp_path / "exported"),
            )
            assert exported.returncode == 0, exported.stdout + exported.stderr
    (run, first), (again, second) = runs["first"], runs["second"]
    assert first["passed"] == second["passed"] == ["python-0", "python-1", "python-3"]
    refused = first["conversion_errors"]
    assert len(refused) == 1 and refused[0].startswith(
        "python-2: the verifier ignores the agent's code: the untouched buggy tree passes"
    )
    assert "tests/incr_list_reference.py is a copy of the solution" in refused[0]
    assert second["conversion_errors"] == [] and again.returncode == 0, again.stderr
    for task_id in second["passed"]:
        a, b = load_task(tmp_path / "first" / task_id), load_task(tmp_path / "second" / task_id)
        assert (a.limits, a.environment, a.instruction) == (b.limits, b.environment, b.instruction)
        ha, hb = a.metadata.extra["harbor"], b.metadata.extra["harbor"]
        assert (ha["original_id"], ha["workdir"], ha.get("env")) == (
            hb["original_id"],
            hb["workdir"],
            hb.get("env"),
        )


@pytest.mark.skipif(
    resolve_isolation("auto") != "bwrap", reason="Harbor verification needs bubblewrap"
)
def test_code_that_writes_a_reward_and_then_hangs_fails(tmp_path):
    """A time limit is a failed verdict, never a pass: code under test that writes reward 1
    into /logs/verifier and then sleeps past the sandbox's wall limit gets no reward."""
    from components.sandbox.config import SandboxConfig
    from components.tasks.harbor import run_verifier

    task = load_task(import_harbor_task(FIXTURE / "python-1", tmp_path / "in"))
    assert task.environment is None  # python:3.11 with pytest only: the project's interpreter
    tree = tmp_path / "tree"
    shutil.copytree(task.repo_dir, tree)
    shutil.copytree(task.hidden_tests_dir, tree, dirs_exist_ok=True)
    (tree / "sum_squares.py").write_text(
        "import time\nopen('/logs/verifier/reward.txt', 'w').write('1')\ntime.sleep(600)\n"
    )
    run = run_verifier(task, tree, SandboxConfig(wall_time_s=8))
    assert not run.passed and run.lost == "" and run.command.limit_hit == "wall_time", run
    assert run.detail.startswith("test.sh ran out of time (wall_time): failed")
