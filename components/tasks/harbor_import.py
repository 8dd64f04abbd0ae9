"""Harbor tasks in: a Harbor task folder mapped to one of ours (docs/tasks.md).

Import (`import_harbor_task`) maps one to a task folder:
  - environment/Dockerfile, read with dockerfile-parse: a Python base image (`python:3.X`,
    any variant), `pip install` / `uv pip install` of pinned packages, `COPY`/`ADD` of the
    build context into WORKDIR and `WORKDIR` itself become the task's repo/ (what the
    image has at WORKDIR) and environment (components/tasks/environments.py: that Python
    and those pins, built offline once, like a mined repository's). tests/Dockerfile's
    pins (Harbor's separate verifier image) join them: verification runs in the same
    environment. Anything the sandbox cannot honour is refused with one line naming it:
    another base image (apt packages, another language), any other RUN, ENV/USER/EXPOSE/
    VOLUME/HEALTHCHECK, a COPY from another image (except the `uv` installer binary) or
    from outside the context, an ADD from a URL, and in task.toml network access asked
    for, GPUs/TPUs, MCP servers (services), a prebuilt docker_image or a Windows OS.
  - tests/ goes to hidden_tests/.harbor-tests/ (hidden from the agent, protected), but
    an agentrl export's tests/hidden_cases.json, which becomes the task's hidden cases
    (the verifier runs them itself: their expected values are never mounted);
  - solution/solve.sh is run once, in the sandbox, on a copy of repo/ at /app: what it
    changes is the task's reference.patch (the oracle's fix and the gate's check).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path, PurePosixPath

from components import shutdown
from components.tasks.folder_safety import UnsafeTaskFolder, refuse_unsafe_entries
from components.tasks.harbor import (
    CASES_FILE,
    HARBOR_TESTS,
    TIME_LIMITS,
    HarborRefusal,
    add_reference_from_solution,
    run_verifier,
)
from components.tasks.harbor_dockerfile import (
    HarborEnvironment,
    read_dockerfile,
    resolve_requirements,
)
from components.tasks.task import (
    Task,
    TaskEnvironment,
    TaskFormatError,
    TaskLimits,
    TaskMetadata,
    load_task,
    task_spec,
    write_task_folder,
)

# A prompt is text for a model's context: a bigger instruction.md is not a task's prompt
# (a 65 MB one was imported as is, issue 45 finding 8).
MAX_INSTRUCTION_BYTES = 1 << 20


def _check_toml(config: dict, where: str) -> None:
    env = config.get("environment") or {}
    for phase in ("environment", "agent", "verifier"):
        section = config.get(phase) or {}
        if section.get("network_mode") not in (None, "no-network") or section.get("allow_internet"):
            raise HarborRefusal(f"{where}: [{phase}] asks for network access; the sandbox has none")
    for key, why in (("gpus", "GPUs"), ("tpu", "TPUs"), ("mcp_servers", "MCP servers (services)"),
                     ("docker_image", "a prebuilt image"), ("healthcheck", "a service healthcheck")):  # fmt: skip
        if env.get(key):
            raise HarborRefusal(f"{where}: [environment] {key}: {why} cannot run in the sandbox")
    if env.get("os", "linux") != "linux":
        raise HarborRefusal(f"{where}: [environment] os = {env['os']!r}: the sandbox is Linux")
    if (config.get("verifier") or {}).get("environment"):
        raise HarborRefusal(f"{where}: [verifier] environment: a separate verifier image")


def _repo_files(env: HarborEnvironment, context: Path) -> dict[str, bytes]:
    """{path under WORKDIR: bytes} of what the Dockerfile copies there."""
    files: dict[str, bytes] = {}
    for src, dest in env.copies:
        source = context / src
        if source.is_dir():
            for p in sorted(source.rglob("*")):
                rel = p.relative_to(source).as_posix()
                if p.is_file() and rel != "Dockerfile" and not rel.startswith(".git/"):
                    files[str(PurePosixPath(dest) / rel) if dest else rel] = p.read_bytes()
        elif source.is_file():
            name = dest if dest and not dest.endswith("/") else f"{dest}{source.name}"
            files[name.lstrip("/")] = source.read_bytes()
        else:
            raise HarborRefusal(f"environment/Dockerfile: COPY {src}: not in the build context")
    return files


def _instruction(src: Path, where: str) -> str:
    """instruction.md: required (Harbor's prompt), at most MAX_INSTRUCTION_BYTES, UTF-8."""
    path = src / "instruction.md"
    if not path.is_file():
        raise HarborRefusal(f"{where}: no instruction.md (a Harbor task's prompt)")
    size = path.stat().st_size
    if size > MAX_INSTRUCTION_BYTES:
        raise HarborRefusal(
            f"{where}: instruction.md is {size} bytes, over the limit of "
            f"{MAX_INSTRUCTION_BYTES} (1 MiB) for a prompt"
        )
    text = path.read_text()
    if not text.strip():
        raise HarborRefusal(f"{where}: instruction.md is empty (a Harbor task's prompt)")
    return text


def _environment(
    src: Path, where: str, wheelhouse: str
) -> tuple[HarborEnvironment, list[str], dict]:
    """(the Dockerfile as read, every pinned requirement, {unpinned line: its pins})."""
    from components.tasks.environments import TaskEnvironmentError, _requirement_name

    env = read_dockerfile(src / "environment" / "Dockerfile", task=where)
    lines = list(env.requirements)
    unpinned = list(env.unpinned)
    if (src / "tests" / "Dockerfile").is_file():
        tests_env = read_dockerfile(src / "tests" / "Dockerfile", tests_image=True, task=where)
        lines += tests_env.requirements
        unpinned += tests_env.unpinned
    try:
        resolved = resolve_requirements(env.python, unpinned, wheelhouse)
    except (HarborRefusal, TaskEnvironmentError) as e:
        raise HarborRefusal(f"{where}: environment/Dockerfile: {e}") from e
    pins: dict[str, str] = {}
    for line in [*lines, *(p for pinned in resolved.values() for p in pinned.split())]:
        pins.setdefault(_requirement_name(line), line)  # a line as written wins over a resolve
    return env, list(pins.values()), resolved


def _limits(config: dict) -> TaskLimits | None:
    """[environment] memory_mb as the task's memory limit (capped by the preset's), and the
    per-test timeout an agentrl export recorded in [metadata]."""
    memory = (config.get("environment") or {}).get("memory_mb")
    per_test = (config.get("metadata") or {}).get("agentrl_per_test_timeout_s")
    memory = memory if isinstance(memory, int) and not isinstance(memory, bool) else 0
    ok = isinstance(per_test, int | float) and not isinstance(per_test, bool) and per_test > 0
    limits = TaskLimits(memory_mb=max(memory, 0), per_test_timeout_s=float(per_test) if ok else 0.0)
    return limits if limits != TaskLimits() else None


def _read_config(src: Path, where: str) -> dict:
    if not (src / "task.toml").is_file():
        raise HarborRefusal(f"{where}: no task.toml")
    try:
        config = tomllib.loads((src / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise HarborRefusal(f"{where}: task.toml is not TOML ({e})") from e
    _check_toml(config, f"{where}/task.toml")
    for name in ("tests/test.sh", "environment/Dockerfile"):
        if not (src / name).is_file():
            raise HarborRefusal(f"{where}: no {name}")
    return config


def import_harbor_task(
    src: Path, dest_root: Path, *, split: str = "test", wheelhouse: str = ""
) -> Path:
    """One Harbor task folder -> a task folder in dest_root (without reference.patch:
    `add_reference_from_solution` runs solve.sh in the sandbox). HarborRefusal: why not.
    Nothing is read before the folder is known to hold only folders and regular files."""
    where = src.name
    try:
        refuse_unsafe_entries(src, where)
    except UnsafeTaskFolder as e:
        raise HarborRefusal(str(e)) from e
    config = _read_config(src, where)
    instruction = _instruction(src, where)
    env, requirements, resolved = _environment(src, where, wheelhouse)
    repo = _repo_files(env, src / "environment")
    if not repo:
        raise HarborRefusal(f"{where}: the Dockerfile copies no files into {env.workdir}")
    task_id = re.sub(r"[^A-Za-z0-9._-]", "-", where)
    meta = config.get("metadata") or {}
    folder = dest_root / task_id
    for rel, data in repo.items():  # bytes as the image has them (write_task_folder writes text)
        (folder / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "repo" / rel).write_bytes(data)
    original = meta.get("original_id") if isinstance(meta.get("original_id"), str) else where
    harbor = {"task_toml": config, "workdir": env.workdir, "original_id": original}
    if env.env or env.env_ignored:
        harbor["env"] = dict(env.env)
        harbor["env_not_applied"] = list(env.env_ignored)  # PATH, HOME: the sandbox's
    if resolved:
        harbor["resolved_requirements"] = resolved  # `pip install x` as import resolved it
    write_task_folder(
        folder,
        task_id=task_id,
        instruction=instruction,
        metadata=TaskMetadata(
            family=str(meta.get("category") or "harbor"),
            bug_class=str(meta.get("bug_class") or "harbor"),
            split=meta.get("split") if meta.get("split") in ("train", "val", "test") else split,
            source="harbor",
            extra={"harbor": harbor},
        ),
        repo_files={},
        hidden_test_files={
            f"{HARBOR_TESTS}/{p.relative_to(src / 'tests').as_posix()}": p.read_text()
            for p in sorted((src / "tests").rglob("*"))
            if p.is_file() and p.relative_to(src / "tests").as_posix() != CASES_FILE
        },  # fmt: skip (the hidden cases' expected values stay out of /tests: harbor.py)
        test_command=("python", "-m", "pytest", "-q"),
        protected_paths=(f"{HARBOR_TESTS}/",),
    )
    if (src / "tests" / CASES_FILE).is_file():  # an agentrl export's hidden cases, back
        shutil.copy(src / "tests" / CASES_FILE, folder / CASES_FILE)
    if (src / "solution").is_dir():
        shutil.copytree(src / "solution", folder / "solution")
    _write_environment(folder, env.python, requirements, _limits(config))
    return folder


def _write_environment(
    folder: Path, python: str, requirements: list[str], limits: TaskLimits | None = None
) -> None:
    """The task's environment and limits in task.json; no environment when the project's
    interpreter is that Python and nothing beyond the harness (pytest) is asked for."""
    from components.tasks.environments import HARNESS_DISTRIBUTIONS

    extra = [
        r for r in requirements if re.split(r"[=\[]", r)[0].lower() not in HARNESS_DISTRIBUTIONS
    ]
    task = dataclasses.replace(load_task(folder), limits=limits)
    if python != f"{sys.version_info[0]}.{sys.version_info[1]}" or extra:
        task = dataclasses.replace(task, environment=TaskEnvironment(python, tuple(requirements)))
    (folder / "task.json").write_text(json.dumps(task_spec(task), indent=2) + "\n")


# ----------------------------------------------------------------------------- import


_FETCHES = re.compile(r"\b(apt-get|apt|apk|yum|curl|wget|uvx|pip3?|uv)\b\s")


def _check_test_sh(path: Path, where: str) -> None:
    """Refuse a test.sh that is missing or not a plain file, or that installs or downloads
    at verification time (no network)."""
    if path.is_symlink() or not path.is_file():
        raise HarborRefusal(f"{where}: tests/test.sh is missing or not a regular file (a "
                            "Harbor task's verifier)")  # fmt: skip
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        code = line.split("#", 1)[0]
        if m := _FETCHES.search(code):
            raise HarborRefusal(f"{where}: tests/test.sh line {n} runs {m[1]!r}: installing or "
                                "downloading at verification needs a network the sandbox has not")  # fmt: skip


def _tree_with_patch(task: Task, dest: Path) -> Path:
    from components.tasks.patching import apply_unified_diff

    shutil.copytree(task.repo_dir, dest, symlinks=True)
    if task.reference_patch() is not None:
        apply_unified_diff(dest, task.reference_patch())
    shutil.copytree(task.hidden_tests_dir, dest, dirs_exist_ok=True)
    return dest


def _solution_copies(task: Task) -> list[str]:
    """The task's tests that are a copy of a file the reference fix writes (a verifier that
    runs its own copy of the solution, never the agent's file)."""
    patch = task.reference_patch()
    if patch is None:
        return []
    from components.tasks.harbor_export import fixed_files

    fixed = {data.strip() for data in fixed_files(task, patch)[0].values() if data.strip()}
    tests = task.hidden_tests_dir / HARBOR_TESTS
    return sorted(
        f"tests/{p.relative_to(tests).as_posix()}"
        for p in tests.rglob("*")
        if p.is_file() and p.read_bytes().strip() in fixed
    )


def _runs(task: Task, tree: Path, cfg, runs: int) -> list:
    got = []
    for _ in range(runs):
        got.append(run_verifier(task, tree, cfg))
        if got[-1].command.limit_hit in TIME_LIMITS:
            break  # the limit bounds it: once is the verdict, not three times the wait
    return got


def _ignores_agent(task: Task, solution_passes: bool | None) -> str:
    copies = _solution_copies(task)
    return (
        "the verifier ignores the agent's code: the untouched buggy tree passes (reward 1)"
        + (" and so does the fixed tree" if solution_passes else "")
        + ", so any answer, or none, scores full marks"
        + (f"; {', '.join(copies)} is a copy of the solution the tests run" if copies else "")
    )


def determinism_problem(task: Task, cfg, runs: int = 3) -> str | None:
    """None when the buggy repo fails and the reference fix passes in each of `runs` runs
    of test.sh; else what is wrong, in words. A state stopped by the sandbox's time limit
    (a program that loops) fails, once: the limit bounds it (harbor.run_verifier)."""
    passed: dict[str, bool] = {}
    with shutdown.temporary_folder("agentrl-harbor-gate-") as tmp:
        buggy = Path(tmp) / "buggy"
        shutil.copytree(task.repo_dir, buggy, symlinks=True)
        shutil.copytree(task.hidden_tests_dir, buggy, dirs_exist_ok=True)
        trees = {"buggy": buggy}
        if task.has_reference:
            trees["solution"] = _tree_with_patch(task, Path(tmp) / "solution")
        for name, tree in trees.items():
            got = _runs(task, tree, cfg, runs)
            rewards = [(r.reward, r.lost, tuple(r.forged)) for r in got]
            if len(set(rewards)) > 1:
                return f"{name} state gives different results over {runs} runs: {rewards}"
            if got[0].lost or got[0].forged:
                return f"{name} state: {got[0].lost or got[0].forged[0]}"
            passed[name] = got[0].passed
            detail = got[0].detail.split(";", 1)[0]
    if passed["buggy"]:
        return _ignores_agent(task, passed.get("solution"))
    if not passed.get("solution", True):
        return f"the reference fix (solution/solve.sh) fails its own tests ({detail})"
    return None


def convert_harbor(
    src: Path, staging: Path, cfg, runs: int = 3, wheelhouse: str = ""
) -> tuple[list[Path], list[str]]:
    """Every Harbor task under `src` (src itself when it holds task.toml) -> task folders in
    staging, each solution turned into reference.patch and each checked deterministic over
    `runs` runs; returns (folders, one-line refusal per task not converted). Each task
    folder is checked to hold only folders and regular files before anything is read."""
    src = src.resolve()  # the user's own path; links inside the tasks are refused
    roots = [src] if (src / "task.toml").is_file() else sorted(
        p.parent for p in src.glob("*/task.toml"))  # fmt: skip
    folders, errors = [], []
    for root in roots:
        problem = _convert_one(root, staging, cfg, runs, wheelhouse)
        if problem is None:
            folders.append(staging / re.sub(r"[^A-Za-z0-9._-]", "-", root.name))
            continue
        errors.append(problem)
        shutil.rmtree(staging / re.sub(r"[^A-Za-z0-9._-]", "-", root.name), ignore_errors=True)
    if not roots:
        errors.append(f"{src}: no Harbor task (no task.toml in it or its subfolders)")
    return folders, errors


def _convert_one(root: Path, staging: Path, cfg, runs: int, wheelhouse: str) -> str | None:
    """None when the Harbor task at `root` converted into staging, else the refusal line."""
    from components.tasks.environments import (
        PrepareConfig,
        TaskEnvironmentError,
        prepare_environments,
        task_python_env,
    )

    try:
        refuse_unsafe_entries(root, root.name)
        _check_test_sh(root / "tests" / "test.sh", root.name)
        folder = import_harbor_task(root, staging, wheelhouse=wheelhouse)
        task = load_task(folder)
        task_cfg = cfg
        if task.environment is not None:  # built now (registry or wheelhouse), like `prepare`
            (built,) = prepare_environments(
                [task], PrepareConfig(cache_dir=cfg.environments_dir, wheelhouse=wheelhouse)
            )
            if built.error:
                raise HarborRefusal(f"{root.name}: environment: {built.error.splitlines()[0]}")
            task_cfg = dataclasses.replace(
                cfg, python_env=task_python_env(task, cfg.environments_dir)
            )
        add_reference_from_solution(folder, task_cfg)
        problem = determinism_problem(load_task(folder), task_cfg, runs)
        if problem:
            raise HarborRefusal(f"{root.name}: {problem}")
    except (HarborRefusal, TaskEnvironmentError, TaskFormatError, UnsafeTaskFolder) as e:
        return str(e).splitlines()[0]
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        # one malformed task is refused by name; the rest of the dataset still imports
        return f"{root.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None
