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
import shlex
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from components.tasks.harbor import (
    CASES_FILE,
    HARBOR_TESTS,
    WORKDIR,
    HarborRefusal,
    add_reference_from_solution,
    run_verifier,
)
from components.tasks.task import (
    Task,
    TaskEnvironment,
    TaskFormatError,
    TaskMetadata,
    load_task,
    task_spec,
    write_task_folder,
)

PYTHON_IMAGE = re.compile(
    r"^(?:docker\.io/)?(?:library/)?python:(?P<version>3\.\d+)(?:\.\d+)?(?:-[a-z0-9.-]+)?$"
)
INSTALLER_IMAGES = ("ghcr.io/astral-sh/uv",)  # COPY --from them brings the installer only
IGNORED_INSTRUCTIONS = ("LABEL", "ARG", "CMD", "ENTRYPOINT", "SHELL", "STOPSIGNAL", "ONBUILD")


@dataclass(frozen=True)
class HarborEnvironment:
    """What environment/Dockerfile asks for, as far as the sandbox can give it."""

    python: str
    requirements: tuple[str, ...]
    workdir: str
    copies: tuple[tuple[str, str], ...]  # (source in the build context, path under WORKDIR)


# ----------------------------------------------------------------------------- reading


def _pins(command: list[str], where: str, context: Path) -> list[str]:
    """The requirements of one `pip install ...` command (pinned, or refused)."""
    pins: list[str] = []
    args = iter(command)
    for arg in args:
        if arg in ("-r", "--requirement"):
            path = context / next(args, "")
            if not path.is_file():
                raise HarborRefusal(f"{where}: requirements file {path.name} not in the context")
            pins += [ln.strip() for ln in path.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]  # fmt: skip
        elif arg.startswith("-"):
            continue  # --system, --no-cache-dir, -q: how to install, not what
        else:
            pins.append(arg)
    for pin in pins:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[^\s;]+", pin):
            raise HarborRefusal(f"{where}: {pin!r} is not a pinned package (name==version)")
    return pins


def _pip_command(words: list[str]) -> list[str] | None:
    """The arguments after `install` when `words` is a pip install, else None."""
    for prefix in (["pip", "install"], ["pip3", "install"], ["python", "-m", "pip", "install"],
                   ["python3", "-m", "pip", "install"], ["uv", "pip", "install"]):  # fmt: skip
        if words[: len(prefix)] == prefix:
            return words[len(prefix) :]
    return None


def read_dockerfile(path: Path, *, tests_image: bool = False) -> HarborEnvironment:
    """environment/Dockerfile (or tests/Dockerfile when `tests_image`: its COPY of the
    tests is Harbor's own) -> what the sandbox builds; HarborRefusal names the line."""
    from dockerfile_parse import DockerfileParser

    context = path.parent
    parser = DockerfileParser(fileobj=open(path, "rb"))  # noqa: SIM115 - parser keeps it
    python, workdir = None, WORKDIR
    requirements: list[str] = []
    copies: list[tuple[str, str]] = []
    for ins in parser.structure:
        kind, value = ins["instruction"], ins["value"].strip()
        where = f"{path.parent.name}/Dockerfile line {ins['startline'] + 1} ({kind})"
        if kind == "FROM":
            m = PYTHON_IMAGE.match(value.split()[0])
            if python is not None:
                raise HarborRefusal(f"{where}: a multi-stage build cannot run in the sandbox")
            if m is None:
                raise HarborRefusal(
                    f"{where}: base image {value!r} is not a Python image; the sandbox runs "
                    "Python environments only (no apt packages, services or other languages)"
                )
            python = m["version"]
        elif kind == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / value)
        elif kind == "RUN":
            for part in re.split(r"\s*(?:&&|;)\s*", value):
                words = shlex.split(part)
                pip = _pip_command(words) if words else []
                if pip is None:
                    raise HarborRefusal(f"{where}: {part!r}: the sandbox installs pinned Python "
                                        "packages only (no system packages or network)")  # fmt: skip
                requirements += _pins(pip, where, context)
        elif kind in ("COPY", "ADD"):
            words = shlex.split(value)
            sources, dest = words[:-1], words[-1]
            source_image = next(
                (w.split("=", 1)[1] for w in sources if w.startswith("--from=")), None
            )
            sources = [w for w in sources if not w.startswith("--")]
            if source_image is not None:
                if not source_image.startswith(INSTALLER_IMAGES):
                    raise HarborRefusal(f"{where}: copies from another image ({source_image})")
                continue  # the uv binary: we install with pip
            if tests_image:
                continue  # tests/Dockerfile copies the tests: Harbor's /tests, ours too
            target = PurePosixPath(workdir) / dest
            if not (target == PurePosixPath(workdir) or PurePosixPath(workdir) in target.parents):
                raise HarborRefusal(f"{where}: copies to {target}, outside WORKDIR {workdir}")
            for src in sources:
                if "://" in src:
                    raise HarborRefusal(f"{where}: {src} is a download (no network)")
                resolved = (context / src).resolve()
                if resolved != context.resolve() and context.resolve() not in resolved.parents:
                    raise HarborRefusal(f"{where}: {src} is outside the build context")
                rel = target.relative_to(workdir).as_posix()
                copies.append((src, "" if rel == "." else rel))
        elif kind not in IGNORED_INSTRUCTIONS:
            raise HarborRefusal(f"{where}: {kind} cannot be honoured by the sandbox")
    if python is None:
        raise HarborRefusal(f"{path}: no FROM line")
    return HarborEnvironment(python, tuple(requirements), workdir, tuple(copies))


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


def import_harbor_task(src: Path, dest_root: Path, *, split: str = "test") -> Path:
    """One Harbor task folder -> a task folder in dest_root (without reference.patch:
    `add_reference_from_solution` runs solve.sh in the sandbox). HarborRefusal: why not."""
    where = src.name
    if not (src / "task.toml").is_file():
        raise HarborRefusal(f"{where}: no task.toml")
    try:
        config = tomllib.loads((src / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise HarborRefusal(f"{where}: task.toml is not TOML ({e})") from e
    _check_toml(config, f"{where}/task.toml")
    if not (src / "tests" / "test.sh").is_file():
        raise HarborRefusal(f"{where}: no tests/test.sh")
    if not (src / "environment" / "Dockerfile").is_file():
        raise HarborRefusal(f"{where}: no environment/Dockerfile")
    env = read_dockerfile(src / "environment" / "Dockerfile")
    requirements = list(env.requirements)
    if (src / "tests" / "Dockerfile").is_file():
        requirements += read_dockerfile(src / "tests" / "Dockerfile", tests_image=True).requirements
    if env.workdir != WORKDIR:
        raise HarborRefusal(f"{where}: WORKDIR {env.workdir}: only {WORKDIR} is mapped")
    repo = _repo_files(env, src / "environment")
    if not repo:
        raise HarborRefusal(f"{where}: the Dockerfile copies no files into {WORKDIR}")
    task_id = re.sub(r"[^A-Za-z0-9._-]", "-", where)
    meta = config.get("metadata") or {}
    folder = dest_root / task_id
    for rel, data in repo.items():  # bytes as the image has them (write_task_folder writes text)
        (folder / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "repo" / rel).write_bytes(data)
    write_task_folder(
        folder,
        task_id=task_id,
        instruction=(src / "instruction.md").read_text()
        if (src / "instruction.md").is_file()
        else "",
        metadata=TaskMetadata(
            family=str(meta.get("category") or "harbor"),
            bug_class=str(meta.get("bug_class") or "harbor"),
            split=meta.get("split") if meta.get("split") in ("train", "val", "test") else split,
            source="harbor",
            extra={"harbor": {"task_toml": config, "workdir": env.workdir}},
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
    _write_environment(folder, env.python, requirements)
    return folder


def _write_environment(folder: Path, python: str, requirements: list[str]) -> None:
    """The task's environment in task.json; none when the project's interpreter is that
    Python and nothing beyond the harness (pytest) is asked for."""
    from components.tasks.environments import HARNESS_DISTRIBUTIONS

    extra = [
        r for r in requirements if re.split(r"[=\[]", r)[0].lower() not in HARNESS_DISTRIBUTIONS
    ]
    if python == f"{sys.version_info[0]}.{sys.version_info[1]}" and not extra:
        return
    task = load_task(folder)
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


def determinism_problem(task: Task, cfg, runs: int = 3) -> str | None:
    """None when the buggy repo fails and the reference fix passes in each of `runs` runs
    of test.sh; else what differed."""
    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-gate-") as tmp:
        buggy = Path(tmp) / "buggy"
        shutil.copytree(task.repo_dir, buggy, symlinks=True)
        shutil.copytree(task.hidden_tests_dir, buggy, dirs_exist_ok=True)
        trees = {"buggy": buggy}
        if task.has_reference:
            trees["solution"] = _tree_with_patch(task, Path(tmp) / "solution")
        for name, tree in trees.items():
            got = [run_verifier(task, tree, cfg) for _ in range(runs)]
            rewards = [(r.reward, r.lost, tuple(r.forged)) for r in got]
            if len(set(rewards)) > 1:
                return f"{name} state gives different results over {runs} runs: {rewards}"
            if got[0].lost or got[0].forged:
                return f"{name} state: {got[0].lost or got[0].forged[0]}"
            if got[0].passed != (name == "solution"):
                return f"{name} state {'passes' if got[0].passed else 'fails'} (reward {got[0].reward})"
    return None


def convert_harbor(
    src: Path, staging: Path, cfg, runs: int = 3, wheelhouse: str = ""
) -> tuple[list[Path], list[str]]:
    """Every Harbor task under `src` (src itself when it holds task.toml) -> task folders in
    staging, each solution turned into reference.patch and each checked deterministic over
    `runs` runs; returns (folders, one-line refusal per task not converted)."""
    from components.tasks.environments import (
        PrepareConfig,
        TaskEnvironmentError,
        prepare_environments,
        task_python_env,
    )

    roots = [src] if (src / "task.toml").is_file() else sorted(
        p.parent for p in src.glob("*/task.toml"))  # fmt: skip
    folders, errors = [], []
    for root in roots:
        try:
            _check_test_sh(root / "tests" / "test.sh", root.name)
            folder = import_harbor_task(root, staging)
            task = load_task(folder)
            task_cfg = cfg
            if task.environment is not None:  # built now (registry or wheelhouse), like `prepare`
                (built,) = prepare_environments([task], PrepareConfig(
                    cache_dir=cfg.environments_dir, wheelhouse=wheelhouse))  # fmt: skip
                if built.error:
                    raise HarborRefusal(f"{root.name}: environment: {built.error.splitlines()[0]}")
                path = task_python_env(task, cfg.environments_dir)
                task_cfg = dataclasses.replace(cfg, python_env=path)
            add_reference_from_solution(folder, task_cfg)
            problem = determinism_problem(load_task(folder), task_cfg, runs)
            if problem:
                raise HarborRefusal(f"{root.name}: {problem}")
        except (HarborRefusal, TaskEnvironmentError, TaskFormatError) as e:
            errors.append(str(e).splitlines()[0])
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            # one malformed task is refused by name; the rest of the dataset still imports
            errors.append(f"{root.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        else:
            folders.append(folder)
            continue
        shutil.rmtree(staging / re.sub(r"[^A-Za-z0-9._-]", "-", root.name), ignore_errors=True)
    if not roots:
        errors.append(f"{src}: no Harbor task (no task.toml in it or its subfolders)")
    return folders, errors
