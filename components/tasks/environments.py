"""Task environments: the interpreter a task's commands and verification run with.

A task whose `task.json` names an `environment` (a Python version and pinned requirements,
components/tasks/task.py: TaskEnvironment) runs in its own virtual environment instead of
the project's interpreter. `prepare_environments` builds each distinct environment once into
a content-addressed cache (`<cache>/<key>/`, key = hash of what the environment is made of),
so a thousand tasks mined from one repository share one folder. The sandbox mounts that
folder read-only and puts its `bin/` first on PATH (SandboxConfig.python_env); the verifier
picks it for the task's hidden tests (components/verifier/verdict.py).

How an environment is made (all on the host, before any task code runs):
  1. `pythonX.Y -m venv --without-pip` (the interpreter found on PATH or under pyenv): no pip
     inside, so nothing in an episode can install packages (there is no network either);
  2. the requirements, installed by the host's pip into it (`pip --python`), from wheels
     only (`--only-binary :all:`: building an sdist would run its setup code on the host),
     from the package registry or, with a wheelhouse, from that folder alone (`--no-index`);
  3. the verifier's harness (pytest, pytest-timeout and their dependencies) copied from the
     project's own interpreter, at the project's versions: the verdict logic
     (components/verifier/verdict.py) is written against them. A requirement naming one of them
     is left out and listed in the manifest (`ignored`);
  4. with `editable` (a mined repository), the repository installed editable the way
     PEP 660 back-ends do it, without running any of its code: a `.pth` line that appends
     the workspace's copy (`$HOME/<path>`: the sandbox's HOME is the workspace) to
     `sys.path` behind the environment's packages, and, when its name and version are
     known, a `.dist-info` with its METADATA (entry points not included);
  5. `agentrl-environment.json` (the manifest) written last: a folder without it is an
     interrupted build and is rebuilt.

Everything that decides the folder's content is in the key, so a changed pin or harness
version is a new folder, never an in-place update. Tasks without an environment keep the
project's interpreter exactly as before.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components.tasks.task import Task, TaskEnvironment
from components.typed_config import doc

FORMAT = 1
MANIFEST = "agentrl-environment.json"
# What the verifier's harness imports inside the environment (pytest 9's dependencies on
# Python 3.11+ included), copied from the project's interpreter.
HARNESS_DISTRIBUTIONS = ("pytest", "pytest-timeout", "pluggy", "iniconfig", "packaging", "pygments")
DEFAULT_CACHE = "~/.cache/agentrl/environments"
PYENV_ROOT = Path("~/.pyenv/versions")


class TaskEnvironmentError(RuntimeError):
    """An environment cannot be built or is not prepared (the message says which and why)."""


@dataclass(frozen=True)
class PrepareConfig:
    cache_dir: str = field(default=DEFAULT_CACHE, metadata=doc("the environment cache folder"))
    wheelhouse: str = field(
        default="", metadata=doc("install from this folder of wheels only ('' = the registry)")
    )
    timeout_s: float = field(default=900.0, metadata=doc("limit for one environment's install"))


@dataclass
class Prepared:
    key: str
    path: str
    python: str  # the full version the environment got, e.g. 3.11.7
    built: bool  # False: it was in the cache already
    seconds: float
    tasks: int  # how many of the prepared tasks use it
    ignored: list[str] = field(default_factory=list)
    error: str = ""


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(line: str) -> str:
    return _normalize(re.split(r"[\s<>=!~;\[@(]", line, maxsplit=1)[0])


# What pytest needs on Python 3.10 besides (a Harbor task's `FROM python:3.10`): backports
# that 3.11 has built in, copied from the project's interpreter like the rest of the harness.
HARNESS_BACKPORTS = ("exceptiongroup", "typing-extensions")


def harness_distributions(python: str = "") -> tuple[str, ...]:
    """The distributions copied into an environment of that Python version."""
    old = python and tuple(int(p) for p in python.split(".")) < (3, 11)
    return HARNESS_DISTRIBUTIONS + (HARNESS_BACKPORTS if old else ())


def harness_versions(python: str = "") -> dict[str, str]:
    """The project's versions of what the harness needs (part of every environment's key)."""
    return {d: importlib.metadata.version(d) for d in harness_distributions(python)}


def environment_key(env: TaskEnvironment) -> str:
    """Content address of an environment: everything that decides what is installed."""
    data = {"format": FORMAT, "python": env.python, "requirements": list(env.requirements),
            "harness": harness_versions(env.python), "only_binary": True}  # fmt: skip
    if env.editable is not None:  # absent before editable installs: their keys are unchanged
        data["editable"] = dataclasses.asdict(env.editable)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def cache_root(cache_dir: str) -> Path:
    return Path(os.path.expanduser(cache_dir or DEFAULT_CACHE)).resolve()


def environment_path(env: TaskEnvironment, cache_dir: str) -> Path:
    return cache_root(cache_dir) / environment_key(env)


def is_ready(path: Path) -> bool:
    return (path / MANIFEST).is_file() and (path / "bin" / "python").exists()


def task_python_env(task: Task, cache_dir: str) -> str:
    """The prefix the sandbox runs this task's python from ("" = the project's own);
    raises TaskEnvironmentError when the task's environment has not been prepared."""
    if task.environment is None:
        return ""
    path = environment_path(task.environment, cache_dir)
    if not is_ready(path):
        raise TaskEnvironmentError(
            f"{task.id}: environment {path.name} (python {task.environment.python}, "
            f"{len(task.environment.requirements)} requirement(s)) is not prepared in "
            f"{path.parent}: run `agentrl tasks prepare --tasks DIR`"
        )
    return str(path)


def with_task_environment(sandbox, task: Task):
    """`sandbox` (a SandboxConfig) running `task`'s environment; unchanged for a task
    without one. Raises TaskEnvironmentError when the environment is not prepared."""
    python_env = task_python_env(task, sandbox.environments_dir)
    return dataclasses.replace(sandbox, python_env=python_env) if python_env else sandbox


def with_task_limits(task: Task, env, sandbox):
    """(env, sandbox) (EnvConfig, SandboxConfig) with `task`'s own limits where they are
    larger than the preset's, each capped by the preset's `env.max_task_*`: a mined heavy
    suite is verified with the room it was mined with, and no task folder can ask for more
    than the operator allows."""
    limits = task.limits
    if limits is None:
        return env, sandbox
    memory = min(max(sandbox.memory_mb, limits.memory_mb), env.max_task_memory_mb)
    per_test = min(max(env.per_test_timeout_s, limits.per_test_timeout_s),
                   env.max_task_per_test_timeout_s)  # fmt: skip
    if memory > sandbox.memory_mb:
        sandbox = dataclasses.replace(sandbox, memory_mb=memory)
    if per_test > env.per_test_timeout_s:
        env = dataclasses.replace(env, per_test_timeout_s=per_test)
    return env, sandbox


def find_python(version: str) -> str:
    """An interpreter of this MAJOR.MINOR version on this machine (raises if none)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return os.path.realpath(sys.executable)
    candidates = [str(p / "bin" / f"python{version}") for p in
                  sorted(PYENV_ROOT.expanduser().glob(f"{version}.*"), reverse=True)]  # fmt: skip
    candidates.append(shutil.which(f"python{version}"))
    for c in candidates:
        # pyenv's shims are scripts that pick a version by configuration: not an interpreter
        if c and os.access(c, os.X_OK) and "/shims/" not in c:
            return os.path.realpath(c)
    raise TaskEnvironmentError(f"no python{version} interpreter on this machine (PATH, pyenv)")


def _run(argv: list[str], timeout_s: float, what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TaskEnvironmentError(f"{what} timed out after {timeout_s:g}s") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise TaskEnvironmentError(f"{what} failed: " + " | ".join(tail))


def _site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python*/site-packages"))
    if not found:
        raise TaskEnvironmentError(f"{prefix}: no site-packages folder")
    return found[0]


def copy_harness(prefix: Path, python: str = "") -> None:
    """The harness's distributions, file by file as their RECORDs list them, plus a
    `bin/pytest` that runs the environment's interpreter. On 3.10 also pytest's backports
    and tomli (pytest reads a pyproject.toml with it there), which the project's 3.11
    lacks as a distribution: pip's own vendored copy, the same pure-Python package."""
    site = _site_packages(prefix)
    if python and tuple(int(p) for p in python.split(".")) < (3, 11):
        import pip._vendor.tomli as tomli

        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(Path(tomli.__file__).parent, site / "tomli", ignore=skip)
    for name in harness_distributions(python):
        dist = importlib.metadata.distribution(name)
        base = Path(dist.locate_file("")).resolve()
        for rel in dist.files or ():
            src = Path(dist.locate_file(rel)).resolve()
            if base not in src.parents or "__pycache__" in src.parts or not src.is_file():
                continue  # console scripts (../../bin) are the host's; caches are rebuilt
            dst = site / src.relative_to(base)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    script = prefix / "bin" / "pytest"
    script.write_text(f"#!{prefix}/bin/python\nimport sys\nfrom pytest import console_main\n"
                      "sys.exit(console_main())\n")  # fmt: skip
    script.chmod(0o755)


def install_editable(prefix: Path, editable) -> None:
    """The repository as an editable install (module docstring, step 4); `editable` is a
    components.tasks.task.EditableInstall. Runs nothing of the repository."""
    site = _site_packages(prefix)
    tag = re.sub(r"[^A-Za-z0-9_]", "_", editable.name or "repository")
    root = "" if editable.path in ("", ".") else editable.path
    # A .pth line starting with `import` is executed by site.py at start-up; HOME is the
    # workspace inside the sandbox (components/sandbox/environ.py: sandbox_env).
    line = ("import os, sys; sys.path.append(os.path.join(os.path.expanduser('~'), "
            f"{root!r}))\n")  # fmt: skip
    (site / f"__editable__.agentrl_{tag}.pth").write_text(line)
    if not editable.name:
        return
    dist = site / f"{re.sub(r'[-.]+', '_', editable.name)}-{editable.version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {editable.name}\nVersion: {editable.version}\n"
    )
    (dist / "INSTALLER").write_text("agentrl\n")


def _install(prefix: Path, reqs: list[str], config: PrepareConfig) -> None:
    req_file = prefix / "agentrl-requirements.txt"
    req_file.write_text("".join(f"{r}\n" for r in reqs))
    argv = [sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install",
            "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
            "--only-binary", ":all:", "-r", str(req_file)]  # fmt: skip
    if config.wheelhouse:
        argv += ["--no-index", "--find-links", str(Path(config.wheelhouse).resolve())]
    _run(argv, config.timeout_s, "pip install")


def build_environment(env: TaskEnvironment, config: PrepareConfig) -> Prepared:
    """Build `env` into the cache unless it is there (one builder at a time per key)."""
    start = time.monotonic()
    path = environment_path(env, config.cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    harness = {_normalize(d) for d in HARNESS_DISTRIBUTIONS}
    ignored = [r for r in env.requirements if _requirement_name(r) in harness]
    reqs = [r for r in env.requirements if r not in ignored]
    result = Prepared(key=path.name, path=str(path), python="", built=False, seconds=0.0,
                      tasks=0, ignored=ignored)  # fmt: skip
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds it ready
        if not is_ready(path):
            shutil.rmtree(path, ignore_errors=True)  # an interrupted build
            try:
                _build(path, env, reqs, ignored, config)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            result.built = True
    result.python = json.loads((path / MANIFEST).read_text())["python_version"]
    result.seconds = time.monotonic() - start
    return result


def _build(path: Path, env: TaskEnvironment, reqs: list[str], ignored: list[str],
           config: PrepareConfig) -> None:  # fmt: skip
    python = find_python(env.python)
    _run([python, "-m", "venv", "--without-pip", str(path)], 120, "venv")
    if reqs:
        _install(path, reqs, config)
    copy_harness(path, env.python)
    if env.editable is not None:
        install_editable(path, env.editable)
    version = subprocess.run([str(path / "bin" / "python"), "-c",
                              "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=60).stdout.strip()  # fmt: skip
    manifest = {"format": FORMAT, "key": path.name, "python": env.python,
                "python_version": version, "requirements": list(env.requirements),
                "ignored": ignored, "harness": harness_versions(env.python),
                "editable": dataclasses.asdict(env.editable) if env.editable else None}  # fmt: skip
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def prepare_environments(tasks: list[Task], config: PrepareConfig) -> list[Prepared]:
    """Each distinct environment of `tasks` built once (in key order); a build that fails
    is reported in its `error` and the others still build."""
    groups: dict[str, tuple[TaskEnvironment, int]] = {}
    for task in tasks:
        if task.environment is not None:
            key = environment_key(task.environment)
            env, n = groups.get(key, (task.environment, 0))
            groups[key] = (env, n + 1)
    out = []
    for key in sorted(groups):
        env, n = groups[key]
        try:
            prepared = build_environment(env, config)
        except TaskEnvironmentError as e:
            path = environment_path(env, config.cache_dir)
            prepared = Prepared(key=key, path=str(path), python=env.python, built=False,
                                seconds=0.0, tasks=n, error=str(e))  # fmt: skip
        prepared.tasks = n
        out.append(prepared)
    return out


def prepared_summary(prepared: list[Prepared]) -> dict:
    return {"environments": [asdict(p) for p in prepared],
            "built": sum(p.built for p in prepared),
            "cached": sum(not p.built and not p.error for p in prepared),
            "failed": sum(bool(p.error) for p in prepared)}  # fmt: skip
