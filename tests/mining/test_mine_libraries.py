"""`tasks mine` on libraries as they come (issue 35): a library is installed into its task
environment (a test that spawns a fresh interpreter imports it, `importlib.metadata` knows
it), a test that fails, hangs or is flaky before mutation is deselected with its reason
instead of the library being refused, a suite that needs more memory than the sandbox's
default is mined with its own limit and verified with it, the Python version and every
setting are checked up front, and an unforeseen exception is that library's one line.

Sdists are fetched the way pip builds them (build isolation, back-ends from the registry):
those tests build fixture sdists for each back-end and skip when the registry is not
reachable."""

from __future__ import annotations

import json
import shutil
import socket
import tarfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.evaluate.episodes import run_policy
from components.mining import baseline as mining_baseline
from components.mining import mine
from components.mining.config import MineConfig
from components.mining.mine import RepoSource, mine_repository
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from components.tasks.environments import with_task_limits
from components.tasks.sdist import SdistError, fetch_sdist, parse_requirement
from components.tasks.task import TaskFormatError, load_task, load_tasks
from components.verifier.gate_runner import sandboxed_test_runner

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> SandboxConfig:
    return SandboxConfig(environments_dir=str(tmp_path_factory.mktemp("envs")))


def _repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


CORE = """\
    def add(a, b):
        return a + b


    def scale(xs, k):
        return [x * k for x in xs]
"""
PYPROJECT = '[project]\nname = "spawnlib"\nversion = "1.2.3"\n'


def _mine(repo: Path, out: Path, sandbox: SandboxConfig, **config):
    config = MineConfig(max_candidates=4, max_tasks=2, seed=0, **config)
    return mine_repository(RepoSource(repo), out, config=config, sandbox=sandbox,
                           run_tests=sandboxed_test_runner(EnvConfig(), sandbox))  # fmt: skip


def _oracle_and_noop(tasks, sandbox) -> dict[str, list[bool]]:
    out = {}
    for policy in ("oracle", "noop"):
        results = run_policy(tasks, policy, rollout=RolloutConfig(), env=EnvConfig(),
                             sandbox=sandbox)  # fmt: skip
        assert all(r.status == "ok" for r in results), [r.infra_detail for r in results]
        out[policy] = [r.success for r in results]
    return out


@needs_bwrap
def test_a_test_that_spawns_an_interpreter_imports_the_installed_library(tmp_path, sandbox):
    """On 3704343 the library was only on pytest's sys.path: `python tests/tool.py` could not
    import it, the baseline failed and the whole library was refused."""
    repo = _repo(tmp_path / "spawnlib", {
        "pyproject.toml": PYPROJECT,
        "spawnlib/__init__.py": "",
        "spawnlib/core.py": CORE,
        "tests/tool.py": """\
            import sys
            from importlib.metadata import version
            from spawnlib.core import add
            print(add(int(sys.argv[1]), int(sys.argv[2])), version("spawnlib"))
        """,
        "tests/test_core.py": """\
            import subprocess, sys
            from pathlib import Path
            from spawnlib.core import add, scale

            def test_add_in_a_fresh_interpreter():
                tool = Path(__file__).with_name("tool.py")
                out = subprocess.run([sys.executable, str(tool), "2", "3"], capture_output=True,
                                     text=True, check=True).stdout.split()
                assert out == ["5", "1.2.3"]

            def test_add():
                assert add(1, 2) == 3

            def test_scale():
                assert scale([1, 2], 3) == [3, 6]
        """,
    })  # fmt: skip
    report = _mine(repo, tmp_path / "out", sandbox)
    assert report.ok, report.error
    assert report.distribution == "spawnlib==1.2.3" and not report.deselected
    tasks, errors = load_tasks(tmp_path / "out")
    assert tasks and not errors
    editable = tasks[0].environment.editable
    assert (editable.path, editable.name, editable.version) == (".", "spawnlib", "1.2.3")
    # The subprocess test runs the agent's edited code: the oracle's fix makes it pass.
    assert _oracle_and_noop(tasks, sandbox) == {"oracle": [True] * len(tasks),
                                                "noop": [False] * len(tasks)}  # fmt: skip


FLAKY_REPO = {
    "flakylib/__init__.py": "",
    "flakylib/core.py": CORE,
    "tests/test_core.py": """\
        import time
        from pathlib import Path
        from flakylib.core import add, scale

        def test_add():
            assert add(1, 2) == 3

        def test_scale():
            assert scale([1, 2], 3) == [3, 6]

        def test_broken_before_any_mutation():
            assert add(1, 1) == 3

        def test_hangs():
            time.sleep(30)

        def test_flaky():
            marker = Path(__file__).with_name(".flaky-runs")
            runs = int(marker.read_text()) if marker.exists() else 0
            marker.write_text(str(runs + 1))
            assert runs % 2 == 0
    """,
    "tests/test_broken_import.py": "raise RuntimeError('this file never imports')\n",
}


@needs_bwrap
def test_failing_hanging_and_flaky_tests_are_deselected_with_their_reasons(tmp_path, sandbox):
    """On 3704343 one failing test refused the whole library."""
    repo = _repo(tmp_path / "flakylib", FLAKY_REPO)
    report = _mine(repo, tmp_path / "out", sandbox, per_test_timeout_s=2)
    assert report.ok, report.error
    assert report.deselected == {
        "tests/test_broken_import.py": "does not import before mutation "
        "(RuntimeError: this file never imports)",
        "tests/test_core.py::test_broken_before_any_mutation": "fails before mutation",
        "tests/test_core.py::test_hangs": "hangs before mutation (past the 2s per-test timeout)",
        "tests/test_core.py::test_flaky": "flaky before mutation: passed in run 1, failed in run 2",
    }
    assert report.tests == 2  # the tests kept
    tasks, _ = load_tasks(tmp_path / "out")
    assert tasks
    for task in tasks:
        hidden = (task.hidden_tests_dir / "tests/test_core.py").read_text()
        assert "def test_add" in hidden and "test_broken_before_any_mutation" not in hidden
        assert "test_hangs" not in hidden and "test_flaky" not in hidden
        assert "--deselect=tests/test_core.py::test_hangs" in task.test_command
        assert task.metadata.extra["deselected_before_mutation"]
    assert _oracle_and_noop(tasks, sandbox)["oracle"] == [True] * len(tasks)
    # Without deselection the library is refused, as before, with one line.
    strict = _mine(_repo(tmp_path / "strict", FLAKY_REPO), tmp_path / "out2", sandbox,
                   deselect_failing=False, per_test_timeout_s=2)  # fmt: skip
    assert not strict.ok and "\n" not in strict.line()
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").iterdir())


HEAVY_REPO = {
    "heavylib/__init__.py": "",
    "heavylib/core.py": CORE,
    "tests/test_core.py": """\
        from heavylib.core import add, scale

        def test_add_with_room():
            block = bytearray(1400 * 1024 * 1024)  # more than the sandbox's 1 GiB default
            assert add(len(block) > 0, 2) == 3

        def test_scale():
            assert scale([1, 2], 3) == [3, 6]
    """,
}


@needs_bwrap
def test_a_suite_that_needs_more_than_a_gigabyte_is_mined_and_verified_with_its_limit(
    tmp_path, sandbox
):
    """On 3704343 the 1 GiB address-space limit could not be raised: MemoryError refused it."""
    repo = _repo(tmp_path / "heavylib", HEAVY_REPO)
    default = _mine(repo, tmp_path / "out-default", sandbox, deselect_failing=False)
    assert not default.ok and "fail before mutation" in default.error
    report = _mine(repo, tmp_path / "out", sandbox, memory_mb=2560, per_test_timeout_s=20)
    assert report.ok and not report.deselected, (report.error, report.deselected)
    tasks, _ = load_tasks(tmp_path / "out")
    assert tasks
    for task in tasks:
        assert (task.limits.memory_mb, task.limits.per_test_timeout_s) == (2560, 20.0)
    # Verification and episodes use the task's limit (capped by the preset's).
    env, box = with_task_limits(tasks[0], EnvConfig(), sandbox)
    assert box.memory_mb == 2560 and env.per_test_timeout_s == 20.0
    env, box = with_task_limits(tasks[0], EnvConfig(max_task_memory_mb=2048), sandbox)
    assert box.memory_mb == 2048
    outcomes = _oracle_and_noop(tasks, sandbox)
    assert outcomes == {"oracle": [True] * len(tasks), "noop": [False] * len(tasks)}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"python": "3.10"}, "python must be 3.11 or newer"),
        ({"python": "three"}, "python must be MAJOR.MINOR"),
        ({"max_tasks": 0}, "max_tasks must be an integer >= 1"),
        ({"per_test_timeout_s": float("nan")}, "per_test_timeout_s must be a positive number"),
        ({"memory_mb": 16}, "memory_mb must be 0 or an integer >= 32"),
        ({"val_fraction": 0.7, "test_fraction": 0.6}, "sum <= 1"),
        ({"baseline_runs": True}, "baseline_runs must be an integer >= 1"),
    ],
)
def test_settings_are_checked_up_front(setting, message):
    """On 3704343 `python: "3.10"` was accepted and failed late (No module named
    'exceptiongroup')."""
    with pytest.raises(ValueError, match=message):
        MineConfig(**setting)


def test_tasks_mine_refuses_python_3_10_in_one_line_before_any_work(tmp_path, capsys):
    from components.tasks.__main__ import main

    code = main(["mine", "--repo", str(tmp_path), "--out", str(tmp_path / "out"),
                 "--python", "3.10"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "3.11 or newer" in err
    assert not (tmp_path / "out").exists()


@needs_bwrap
def test_any_exception_of_a_library_is_its_one_line_and_the_run_goes_on(
    tmp_path, sandbox, monkeypatch
):
    """On 3704343 a TaskFormatError from write_task escaped mine_repository and ended the run."""
    repo = _repo(tmp_path / "lib", {"lib/__init__.py": "", "lib/core.py": CORE,
                                    "tests/test_core.py": "from lib.core import add\n\n"
                                    "def test_add():\n    assert add(1, 2) == 3\n"})  # fmt: skip

    def bad_write(*args, **kwargs):
        raise TaskFormatError("task.json: field 'id' must be a name")

    monkeypatch.setattr(mine, "write_task", bad_write)
    report = _mine(repo, tmp_path / "out", sandbox)
    assert report.ok and not report.kept and report.dropped.get("write") == report.tried >= 1

    def broken_discover(root):
        raise KeyError("unforeseen")

    monkeypatch.setattr(mining_baseline, "discover", broken_discover)
    report = _mine(repo, tmp_path / "out", sandbox)
    assert not report.ok and report.error == "unexpected KeyError: 'unforeseen'"
    assert report.line().startswith("MINE ERROR") and "\n" not in report.line()


def test_editable_and_limits_round_trip_and_are_checked(tmp_path):
    from components.tasks.task import (
        EditableInstall,
        Task,
        TaskEnvironment,
        TaskLimits,
        TaskMetadata,
        task_spec,
    )

    root = tmp_path / "t"
    (root / "repo").mkdir(parents=True)
    (root / "hidden_tests").mkdir()
    (root / "hidden_tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    task = Task(id="t", instruction="fix it", root=root,
                metadata=TaskMetadata(family="f", bug_class="b", split="train"),
                environment=TaskEnvironment(python="3.11", editable=EditableInstall(
                    path="src", name="my-lib", version="2.0.post1")),
                limits=TaskLimits(memory_mb=2048, per_test_timeout_s=15.0))  # fmt: skip
    (root / "task.json").write_text(json.dumps(task_spec(task)))
    loaded = load_task(root)
    assert loaded.environment == task.environment and loaded.limits == task.limits
    for bad, field in (({"path": "../x"}, "editable.path"), ({"name": "a b", "version": "1"},
                       "editable.name"), ({"name": "a"}, "editable'")):  # fmt: skip
        spec = task_spec(task)
        spec["environment"]["editable"] = bad
        (root / "task.json").write_text(json.dumps(spec))
        with pytest.raises(TaskFormatError, match=field):
            load_task(root)
    spec = task_spec(task)
    spec["limits"] = {"memory_mb": -1}
    (root / "task.json").write_text(json.dumps(spec))
    with pytest.raises(TaskFormatError, match="limits.memory_mb"):
        load_task(root)


# ----------------------------------------------------------------------------- sdists

BACKENDS = {  # back-end -> (build-system table, extra pyproject text)
    "setuptools": ('requires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"', ""),
    "flit_core": ('requires = ["flit_core>=3.4,<4"]\nbuild-backend = "flit_core.buildapi"', ""),
    "hatchling": ('requires = ["hatchling"]\nbuild-backend = "hatchling.build"',
                  '[tool.hatch.build.targets.wheel]\npackages = ["{module}"]\n'),
    "poetry-core": ('requires = ["poetry-core>=1.0"]\nbuild-backend = "poetry.core.masonry.api"',
                    ""),
    "setuptools_scm": ('requires = ["setuptools>=64", "setuptools_scm>=8"]\n'
                       'build-backend = "setuptools.build_meta"', "[tool.setuptools_scm]\n"),
}  # fmt: skip


def _registry_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


def _fixture_sdist(links: Path, backend: str, version: str, *, pkg_info_version: str | None):
    """A fixture library's sdist as that back-end would lay it out (PKG-INFO at the top;
    None leaves PKG-INFO out, as an sdist made from a checkout without its tag would)."""
    name = f"agentrl-fixture-{backend.replace('_', '-')}-lib"
    module = name.replace("-", "_")
    system, extra = BACKENDS[backend]
    dynamic = backend == "setuptools_scm"
    project = (f'[project]\nname = "{name}"\n' + ('dynamic = ["version"]\n' if dynamic else
               f'version = "{version}"\n') + 'description = "agentrl fixture"\n')  # fmt: skip
    if backend == "poetry-core":
        project = (f'[tool.poetry]\nname = "{name}"\nversion = "{version}"\n'
                   f'description = "x"\nauthors = ["agentrl"]\npackages = [{{include = "{module}"}}]\n')  # fmt: skip
    top = links / "build" / f"{module}-{version}"
    files = {
        "pyproject.toml": f"[build-system]\n{system}\n\n{project}\n{extra.format(module=module)}",
        f"{module}/__init__.py": '"""agentrl fixture."""\n__version__ = "' + version + '"\n',
        "tests/test_it.py": f"from {module} import __version__\n\ndef test_v():\n    assert __version__\n",
    }  # fmt: skip
    if pkg_info_version is not None:
        files["PKG-INFO"] = (f"Metadata-Version: 2.1\nName: {name}\n"
                             f"Version: {pkg_info_version}\nSummary: agentrl fixture\n")  # fmt: skip
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    archive = links / f"{module}-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    return name


# Opt-in tier: pip fetches build backends from the package registry, which the default tier
# must not need (on a busy CI machine it ran past pytest-timeout; issue 48).
@pytest.mark.integration
@pytest.mark.skipif(not _registry_reachable(), reason="the package registry is not reachable")
def test_sdists_of_every_build_backend_are_fetched_with_build_isolation(tmp_path):
    """On 3704343 the download ran `pip download --no-build-isolation`: flit_core, hatchling
    and poetry-core sdists failed with `No module named ...`, setuptools_scm ones resolved
    to 0.0.0."""
    links = tmp_path / "links"
    links.mkdir()
    names = {b: _fixture_sdist(links, b, "1.4.0", pkg_info_version="1.4.0") for b in BACKENDS}

    def fetch(backend):
        return fetch_sdist(f"{names[backend]}==1.4.0", tmp_path / backend,
                           find_links=(str(links),))  # fmt: skip

    with ThreadPoolExecutor(max_workers=len(BACKENDS)) as pool:
        got = dict(zip(BACKENDS, pool.map(fetch, BACKENDS), strict=True))
    for backend, sdist in got.items():
        assert sdist.upstream["version"] == "1.4.0", backend
        assert (sdist.root / "tests" / "test_it.py").is_file()
        assert sdist.upstream["build_backend"].split(".")[0] in (
            "setuptools", "flit_core", "hatchling", "poetry"
        )  # fmt: skip


# Opt-in tier: pip fetches build backends from the package registry, which the default tier
# must not need (on a busy CI machine it ran past pytest-timeout; issue 48).
@pytest.mark.integration
@pytest.mark.skipif(not _registry_reachable(), reason="the package registry is not reachable")
def test_an_sdist_whose_version_resolves_to_0_0_0_is_refused_in_one_line(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    name = _fixture_sdist(links, "setuptools_scm", "2.0.0", pkg_info_version=None)
    with pytest.raises(SdistError) as e:
        fetch_sdist(f"{name}==2.0.0", tmp_path / "x", find_links=(str(links),))
    assert "\n" not in str(e.value) and ("0.0.0" in str(e.value) or "2.0.0" in str(e.value))


@pytest.mark.parametrize("text", ["attrs", "attrs>=1", "attrs==1; python_version>'3'", "==1"])
def test_only_exact_pins_are_fetched(text):
    with pytest.raises(SdistError, match="NAME==VERSION"):
        parse_requirement(text)
