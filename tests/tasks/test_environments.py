"""Task environments (components/tasks/environments.py): the task.json field, the
content-addressed cache, and the sandbox and verifier running a task with its own
interpreter, read-only. Offline: environments are built without requirements or from a
wheel written here into a local wheelhouse."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.process import run_sandboxed
from components.tasks.environments import (
    PrepareConfig,
    TaskEnvironmentError,
    build_environment,
    environment_key,
    prepare_environments,
    task_python_env,
)
from components.tasks.task import TaskEnvironment, TaskFormatError, load_task
from components.verifier.cache import clear_verdict_cache
from components.verifier.verdict import verify

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("envcache"))


@pytest.fixture(scope="module")
def bare_env(cache) -> str:
    """An environment with no requirements: the interpreter and the harness only."""
    return build_environment(TaskEnvironment(python="3.11"), PrepareConfig(cache_dir=cache)).path


def _task(root: Path, environment: dict | None, hidden: str) -> Path:
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "hidden_tests" / "tests").mkdir(parents=True)
    (root / "hidden_tests" / "tests" / "test_h.py").write_text(hidden)
    spec = {"id": root.name, "instruction": "fix f",
            "metadata": {"family": "f", "bug_class": "x", "split": "test"}}  # fmt: skip
    if environment is not None:
        spec["environment"] = environment
    (root / "task.json").write_text(json.dumps(spec))
    return root


def test_task_json_environment_field(tmp_path):
    (tmp_path / "a" / "environment").mkdir(parents=True)
    (tmp_path / "a" / "environment" / "req.txt").write_text("# pins\nattrs==23.2.0  # why\n\n")
    task = load_task(_task(tmp_path / "a", {"python": "3.12", "requirements":
                                            "environment/req.txt"}, "x = 1\n"))  # fmt: skip
    assert task.environment == TaskEnvironment("3.12", ("attrs==23.2.0",), "environment/req.txt")
    inline = load_task(_task(tmp_path / "b", {"python": "3.11", "requirements": ["a==1"]}, "x=1"))
    assert inline.environment.requirements == ("a==1",)
    assert load_task(_task(tmp_path / "c", None, "x = 1\n")).environment is None
    bad = [
        {"python": "3.10"},  # the verifier's -P needs 3.11
        {"python": "3"},
        {"python": "3.11", "requirements": ["--index-url=http://evil/"]},  # options refused
        {"python": "3.11", "requirements": "../outside.txt"},
        {"python": "3.11", "requirements": "missing.txt"},
    ]
    for i, env in enumerate(bad):
        with pytest.raises(TaskFormatError, match="environment"):
            load_task(_task(tmp_path / f"bad{i}", env, "x = 1\n"))


def test_key_is_content_addressed():
    a = TaskEnvironment("3.11", ("attrs==23.2.0",))
    assert environment_key(a) == environment_key(TaskEnvironment("3.11", ("attrs==23.2.0",), "f"))
    assert environment_key(a) != environment_key(TaskEnvironment("3.11", ("attrs==23.1.0",)))
    assert environment_key(a) != environment_key(TaskEnvironment("3.12", ("attrs==23.2.0",)))


def test_built_once_then_cached(cache, bare_env):
    again = build_environment(TaskEnvironment(python="3.11"), PrepareConfig(cache_dir=cache))
    assert again.path == bare_env and not again.built


def test_sandbox_runs_the_environment_readonly_without_host_packages(bare_env, tmp_path):
    cfg = SandboxConfig(python_env=bare_env)
    probe = ("import sys, pytest, pytest_timeout; print(sys.prefix)\n"
             "try:\n    import yaml\nexcept ImportError:\n    print('no yaml')\n")  # fmt: skip
    out = run_sandboxed(["python", "-c", probe], tmp_path, cfg)
    assert out.exit_code == 0, out.output
    assert out.output.split() == [bare_env, "no", "yaml"]  # the project's packages are absent
    # Attack: make the environment's interpreter run code in later episodes and verifications.
    site = next(Path(bare_env).glob("lib/python*/site-packages"))
    for target in (site / "sitecustomize.py", Path(bare_env) / "bin" / "python3.99"):
        out = run_sandboxed(["python", "-c", f"open({str(target)!r}, 'w').write('x')"],
                            tmp_path, cfg)  # fmt: skip
        assert out.exit_code != 0 and "Read-only file system" in out.output
        assert not target.exists()
    assert run_sandboxed(["pytest", "--version"], tmp_path, cfg).exit_code == 0
    with pytest.raises(SandboxError, match="not prepared"):
        run_sandboxed(["python", "-V"], tmp_path, replace(cfg, python_env=str(tmp_path / "no")))


HIDDEN_ENV_CHECK = """import sys
from mod import f


def test_f():
    assert f() == 2
    assert sys.prefix.endswith({key!r})  # verified with the task's own interpreter
"""


def test_verifier_uses_the_task_environment(cache, bare_env, tmp_path):
    key = Path(bare_env).name
    root = _task(tmp_path / "t", {"python": "3.11", "requirements": []},
                 HIDDEN_ENV_CHECK.format(key=key))  # fmt: skip
    task = load_task(root)
    assert task_python_env(task, cache) == bare_env
    sandbox = SandboxConfig(environments_dir=cache)
    clear_verdict_cache()
    assert not verify(task, task.repo_dir, EnvConfig(), sandbox).tests_passed
    fixed = tmp_path / "fixed"
    shutil.copytree(task.repo_dir, fixed)
    (fixed / "mod.py").write_text("def f():\n    return 2\n")
    v = verify(task, fixed, EnvConfig(), sandbox)
    assert v.status == "ok" and v.tests_passed, v.detail
    # Not prepared: an infrastructure error (kept out of rewards), never a failed verdict.
    elsewhere = replace(sandbox, environments_dir=str(tmp_path / "empty-cache"))
    v = verify(task, fixed, EnvConfig(), elsewhere)
    assert v.status == "infra_error" and "not prepared" in v.detail
    with pytest.raises(TaskEnvironmentError, match="tasks prepare"):
        task_python_env(task, str(tmp_path / "empty-cache"))


def _wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A minimal pure-Python wheel (what a wheelhouse holds), written by hand."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": module,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}  # fmt: skip
    record = []
    for rel, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{rel},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
    return path


def test_prepare_installs_requirements_from_a_wheelhouse(tmp_path):
    house = tmp_path / "wheels"
    house.mkdir()
    _wheel(house, "agentrldep", "1.0", "VALUE = 41\n")
    cache = str(tmp_path / "cache")
    roots = [_task(tmp_path / f"t{i}", {"python": "3.11", "requirements": ["agentrldep==1.0",
                                        "pytest==7.0"]}, "x = 1\n") for i in range(2)]  # fmt: skip
    roots.append(_task(tmp_path / "plain", None, "x = 1\n"))
    tasks = [load_task(r) for r in roots]
    config = PrepareConfig(cache_dir=cache, wheelhouse=str(house))
    prepared = prepare_environments(tasks, config)
    assert len(prepared) == 1 and prepared[0].built and prepared[0].tasks == 2
    assert prepared[0].ignored == ["pytest==7.0"]  # the harness's pytest is the project's
    path = task_python_env(tasks[0], cache)
    out = run_sandboxed(["python", "-c", "import agentrldep, pytest; print(agentrldep.VALUE, "
                         "pytest.__version__ != '7.0')"], tmp_path,
                        SandboxConfig(python_env=path))  # fmt: skip
    assert out.output.split() == ["41", "True"], out.output
    assert not prepare_environments(tasks, config)[0].built  # cached the second time
    missing = TaskEnvironment("3.11", ("agentrl-no-such-dist==9.9",))
    with pytest.raises(TaskEnvironmentError, match="pip install failed"):
        build_environment(missing, config)
    assert not Path(cache, environment_key(missing)).exists()  # a failed build leaves nothing


def test_prepare_command_builds_once_and_reports(tmp_path, capsys):
    from components.preset import DEFAULT_PRESET
    from components.tasks.__main__ import main
    from components.tasks.gate import check_task

    cache = tmp_path / "cache"
    preset = tmp_path / "preset.yaml"
    preset.write_text(
        Path(DEFAULT_PRESET).read_text() + f"\nsandbox:\n  environments_dir: {cache}\n"
    )
    for i in range(3):
        _task(tmp_path / "tasks" / f"t{i}", {"python": "3.11", "requirements": []}, "x = 1\n")
    argv = ["prepare", "--tasks", str(tmp_path / "tasks"), "--preset", str(preset),
            "--report", str(tmp_path / "prep.json")]  # fmt: skip
    assert main(argv) == 0
    assert "1 environment(s) for 3 task(s): 1 built, 0 cached, 0 failed" in capsys.readouterr().out
    assert main(argv) == 0
    assert "0 built, 1 cached" in capsys.readouterr().out
    assert json.loads((tmp_path / "prep.json").read_text())["cached"] == 1
    # The unsandboxed local gate runner has only the project's python: it refuses.
    check = check_task(load_task(tmp_path / "tasks" / "t0"))
    assert not check.ok and "sandboxed verifier" in check.reason


def test_with_task_environment_sets_only_tasks_that_have_one(cache, bare_env, tmp_path):
    from components.tasks.environments import with_task_environment

    sandbox = SandboxConfig(environments_dir=cache, hide_paths=("/x",))
    with_env = load_task(_task(tmp_path / "a", {"python": "3.11"}, "x = 1\n"))
    plain = load_task(_task(tmp_path / "b", None, "x = 1\n"))
    assert with_task_environment(sandbox, with_env) == replace(sandbox, python_env=bare_env)
    assert with_task_environment(sandbox, plain) is sandbox  # today's behaviour exactly


def test_an_episode_runs_the_agents_commands_with_the_task_environment(cache, bare_env, tmp_path):
    from components.env.episode import Action, EpisodeEnv

    task = load_task(_task(tmp_path / "t", {"python": "3.11"}, "x = 1\n"))
    sandbox = SandboxConfig(environments_dir=cache)
    env = EpisodeEnv(task, EnvConfig(), sandbox, policy_name="probe")
    try:
        event = env.step(
            Action("run_command", {"cmd": "python -c 'import sys; print(sys.prefix)'"})
        )
        assert event["observation"].splitlines()[0] == bare_env, event
    finally:
        env.workspace.cleanup()
    # Not prepared: the episode is an infrastructure failure, never the agent's fault.
    elsewhere = replace(sandbox, environments_dir=str(tmp_path / "empty-cache"))
    env = EpisodeEnv(task, EnvConfig(), elsewhere, policy_name="probe")
    result = env.finish()
    assert result.status != "ok" and "not prepared" in result.infra_detail, result.infra_detail
