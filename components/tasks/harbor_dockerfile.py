"""A Harbor task's environment/Dockerfile, translated into what the sandbox gives (issue 46).

Published Harbor datasets are written for Docker; most of what their Dockerfiles say has a
sandbox equivalent, and that is what import takes (`read_dockerfile`):
  - comments, LABEL/ARG/CMD/ENTRYPOINT/...: nothing to run;
  - `FROM python:3.X[-variant]` for any 3.X this machine has (PATH or pyenv, as mined
    environments find theirs, environments.find_python) from 3.10 on (the verifier's
    harness, pytest 9, needs 3.10);
  - `ENV`: the variables test.sh runs with (harbor.py), but the ones the sandbox and the
    harness own (LD_*, PYTHONHOME, PYTHONSAFEPATH, PYTEST_*) are refused, and PATH/HOME are
    the sandbox's (recorded, not applied);
  - `WORKDIR`: where the tree is mounted for test.sh and solve.sh (a fresh top-level path,
    not one of the sandbox's system folders);
  - `COPY`/`ADD` of the task's own build context (environment/) into WORKDIR: the repo;
  - `RUN pip install ...` (pip, pip3, python -m pip, uv pip): pinned lines as they are,
    unpinned ones resolved to exact versions at import time (`resolve_requirements`: the
    harness's own packages at the project's versions, others by pip's resolver against the
    registry or a wheelhouse) and recorded in the task; `mkdir` is a no-op (folders exist).
Anything else is refused with one line naming the task, the file and the line.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from components.tasks.harbor import WORKDIR, HarborRefusal
from components.tasks.task import HARBOR_PYTHON_MIN

PYTHON_IMAGE = re.compile(
    r"^(?:docker\.io/)?(?:library/)?python:(?P<version>3\.\d+)(?:\.\d+)?(?:-[a-z0-9.-]+)?$"
)
INSTALLER_IMAGES = ("ghcr.io/astral-sh/uv",)  # COPY --from them brings the installer only
IGNORED_INSTRUCTIONS = (
    "COMMENT",
    "LABEL",
    "ARG",
    "CMD",
    "ENTRYPOINT",
    "SHELL",
    "STOPSIGNAL",
    "ONBUILD",
    "MAINTAINER",
)
# ENV names the sandbox or the harness sets: a task cannot have them.
OWNED_ENV = re.compile(
    r"^(LD_\w+|PYTHONHOME|PYTHONSAFEPATH|PYTHONSTARTUP|PYTEST_\w+|BASH_ENV|ENV)$"
)
SANDBOX_ENV = ("PATH", "HOME")  # the sandbox's own; recorded, not applied
# Top-level folders the sandbox binds from the host or uses itself: not a WORKDIR.
SYSTEM_ROOTS = frozenset(
    {
        "",
        "bin",
        "boot",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "run",
        "sbin",
        "sys",
        "tmp",
        "usr",
        "var",
        "logs",
        "tests",
        "solution",
        "agentrl-calls",
    }
)
_PINNED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[^\s;=<>~!]+")
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[^\s;]+)*")
_NOT_REQUIREMENTS = ("pip", "setuptools", "wheel")  # `pip install -U pip`: the env has no pip


@dataclass(frozen=True)
class HarborEnvironment:
    """What environment/Dockerfile asks for, as far as the sandbox can give it."""

    python: str
    requirements: tuple[str, ...]  # pinned (name==version), as written
    workdir: str
    copies: tuple[tuple[str, str], ...]  # (source in the build context, path under WORKDIR)
    unpinned: tuple[str, ...] = ()  # requirement lines to resolve at import
    env: tuple[tuple[str, str], ...] = ()  # ENV, applied to test.sh
    env_ignored: tuple[str, ...] = ()  # ENV names the sandbox owns (PATH, HOME)


def _pip_command(words: list[str]) -> list[str] | None:
    """The arguments after `install` when `words` is a pip install, else None."""
    for prefix in (
        ["pip", "install"],
        ["pip3", "install"],
        ["python", "-m", "pip", "install"],
        ["python3", "-m", "pip", "install"],
        ["uv", "pip", "install"],
    ):
        if words[: len(prefix)] == prefix:
            return words[len(prefix) :]
    return None


def _requirements(command: list[str], where: str, context: Path) -> tuple[list[str], list[str]]:
    """(pinned, unpinned) requirement lines of one `pip install ...` command."""
    lines: list[str] = []
    args = iter(command)
    for arg in args:
        if arg in ("-r", "--requirement"):
            name = next(args, "")
            path = context / name
            if not _inside(path, context) or not path.is_file():
                raise HarborRefusal(
                    f"{where}: requirements file {name} is not in the build context (environment/)"
                )
            lines += [
                ln.split(" #", 1)[0].strip()
                for ln in path.read_text().splitlines()
                if ln.strip() and not ln.strip().startswith("#")
            ]
        elif arg in (
            "-i",
            "--index-url",
            "--extra-index-url",
            "-f",
            "--find-links",
            "-e",
            "--editable",
            "-c",
            "--constraint",
        ):
            raise HarborRefusal(
                f"{where}: pip {arg}: the sandbox installs from the registry "
                "or a wheelhouse only (no other sources)"
            )
        elif not arg.startswith("-"):
            lines.append(arg)  # -q, --no-cache-dir, --system, -U: how to install, not what
    pinned, unpinned = [], []
    for line in lines:
        if _PINNED.fullmatch(line):
            pinned.append(line)
        elif _REQUIREMENT.fullmatch(line):
            if re.split(r"[<>=!~\[]", line)[0].lower() not in _NOT_REQUIREMENTS:
                unpinned.append(line)
        else:
            raise HarborRefusal(
                f"{where}: {line!r} is not a package requirement (name, "
                "name==version, name>=version)"
            )
    return pinned, unpinned


def _inside(path: Path, root: Path) -> bool:
    resolved, root = path.resolve(), root.resolve()
    return resolved == root or root in resolved.parents


def _env_pairs(value: str, where: str) -> list[tuple[str, str]]:
    """ENV's `K=V K2="v 2"` or legacy `K v` form -> [(K, V)]."""
    words = shlex.split(value)
    if words and "=" not in words[0]:
        pairs = [(words[0], " ".join(words[1:]))]
    else:
        pairs = [tuple(w.split("=", 1)) for w in words]
    for name, _ in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise HarborRefusal(f"{where}: {name!r} is not a variable name")
        if OWNED_ENV.match(name):
            raise HarborRefusal(
                f"{where}: {name} is set by the sandbox's harness; a task cannot set it"
            )
    return pairs


def _python(value: str, where: str) -> str:
    from components.tasks.environments import TaskEnvironmentError, find_python

    m = PYTHON_IMAGE.match(value.split()[0])
    if m is None:
        raise HarborRefusal(
            f"{where}: base image {value!r} is not a Python image; the sandbox runs Python "
            "environments only (no apt packages, services or other languages)"
        )
    version = m["version"]
    if tuple(int(p) for p in version.split(".")) < HARBOR_PYTHON_MIN:
        raise HarborRefusal(
            f"{where}: python {version}: the verifier's harness (pytest 9) "
            "needs Python 3.10 or newer"
        )
    try:
        find_python(version)
    except TaskEnvironmentError as e:
        raise HarborRefusal(f"{where}: {e}") from e
    return version


def _workdir(workdir: str, value: str, where: str) -> str:
    path = PurePosixPath(workdir) / value
    parts = [p for p in path.parts[1:] if p != "."]
    if ".." in parts or not parts or parts[0] in SYSTEM_ROOTS:
        raise HarborRefusal(
            f"{where}: WORKDIR {path} is not a fresh top-level folder the "
            f"sandbox can mount the tree at (such as {WORKDIR})"
        )
    return str(PurePosixPath("/", *parts))


def _copies(value: str, workdir: str, context: Path, where: str) -> list[tuple[str, str]]:
    """(source, path under WORKDIR) pairs of one COPY/ADD; [] for the uv installer's."""
    words = shlex.split(value)
    sources, dest = [w for w in words[:-1] if not w.startswith("--")], words[-1]
    source_image = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
    if source_image is not None:
        if not source_image.startswith(INSTALLER_IMAGES):
            raise HarborRefusal(f"{where}: copies from another image ({source_image})")
        return []  # the uv binary: we install with pip
    target = PurePosixPath(workdir) / dest
    if not (target == PurePosixPath(workdir) or PurePosixPath(workdir) in target.parents):
        raise HarborRefusal(f"{where}: copies to {target}, outside WORKDIR {workdir}")
    rel = target.relative_to(workdir).as_posix()
    rel = "" if rel == "." else rel
    globbed = any(c in src for src in sources for c in "*?[")
    as_folder = dest.endswith("/") or len(sources) > 1 or globbed  # Docker's rule for dest
    out = []
    for src in sources:
        if "://" in src:
            raise HarborRefusal(f"{where}: {src} is a download (no network)")
        if not _inside(context / src, context):
            raise HarborRefusal(
                f"{where}: {src} is outside the task's build context "
                "(environment/): only the task's own files are copied"
            )
        matches = sorted(context.glob(src)) if globbed else [context / src]
        if not matches or not all(m.exists() for m in matches):
            raise HarborRefusal(f"{where}: {src} is not in the build context (environment/)")
        out += [
            (m.relative_to(context).as_posix(), f"{rel}/" if rel and as_folder else rel)
            for m in matches
        ]
    return out


def read_dockerfile(path: Path, *, tests_image: bool = False, task: str = "") -> HarborEnvironment:
    """environment/Dockerfile (or tests/Dockerfile when `tests_image`: its COPY of the
    tests is Harbor's own) -> what the sandbox builds; HarborRefusal names the task, the file
    and the line."""
    from dockerfile_parse import DockerfileParser

    context = path.parent
    with open(path, "rb") as f:
        structure = DockerfileParser(fileobj=f).structure
    python, workdir = None, WORKDIR
    pinned, unpinned, copies, env, ignored = [], [], [], [], []
    prefix = f"{task}: " if task else ""
    for ins in structure:
        kind, value = ins["instruction"], ins["value"].strip()
        where = f"{prefix}{path.parent.name}/Dockerfile line {ins['startline'] + 1} ({kind})"
        if kind in IGNORED_INSTRUCTIONS:
            continue
        if kind == "FROM":
            if python is not None:
                raise HarborRefusal(f"{where}: a multi-stage build cannot run in the sandbox")
            python = _python(value, where)
        elif kind == "WORKDIR":
            workdir = _workdir(workdir, value, where)
        elif kind == "ENV":
            for name, text in _env_pairs(value, where):
                (ignored.append(name) if name in SANDBOX_ENV else env.append((name, text)))
        elif kind == "RUN":
            for part in re.split(r"\s*(?:&&|;)\s*", value):
                words = shlex.split(part)
                if not words or (words[0] == "mkdir" and not tests_image):
                    continue  # folders: the tree's own are there; the sandbox makes the rest
                pip = _pip_command(words)
                if pip is None:
                    raise HarborRefusal(
                        f"{where}: {part!r}: the sandbox installs Python "
                        "packages only (no system packages or network)"
                    )
                got = _requirements(pip, where, context)
                pinned, unpinned = pinned + got[0], unpinned + got[1]
        elif kind in ("COPY", "ADD"):
            copies += [] if tests_image else _copies(value, workdir, context, where)
        else:
            raise HarborRefusal(f"{where}: {kind} cannot be honoured by the sandbox")
    if python is None:
        raise HarborRefusal(f"{prefix}{path.parent.name}/Dockerfile: no FROM line")
    return HarborEnvironment(
        python, tuple(pinned), workdir, tuple(copies), tuple(unpinned), tuple(env), tuple(ignored)
    )


def resolve_requirements(
    python: str, unpinned: list[str], wheelhouse: str = "", timeout_s: float = 300.0
) -> dict[str, str]:
    """{requirement as written: the exact pins it resolved to} for `pip install` lines
    without a version, at import time. The harness's packages (pytest, ...) are the
    project's versions (environments.py copies those whatever is asked); the rest go through
    pip's resolver for that Python (wheels only, as environments are built: the registry, or
    the wheelhouse alone), every distribution it would install pinned. HarborRefusal: why
    not."""
    from components.tasks.environments import HARNESS_DISTRIBUTIONS, find_python, harness_versions

    resolved: dict[str, str] = {}
    others = []
    for line in unpinned:
        name = re.split(r"[<>=!~\[]", line)[0].lower().replace("_", "-")
        if name in HARNESS_DISTRIBUTIONS:
            resolved[line] = f"{name}=={harness_versions()[name]}"
        else:
            others.append(line)
    if not others:
        return resolved
    argv = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        find_python(python),
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        "--no-input",
        "--disable-pip-version-check",
        "--only-binary",
        ":all:",
        *others,
    ]
    if wheelhouse:
        argv += ["--no-index", "--find-links", str(Path(wheelhouse).resolve())]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise HarborRefusal(f"resolving {' '.join(others)} timed out after {timeout_s:g}s") from e
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:]
        raise HarborRefusal(
            f"cannot resolve {' '.join(others)} for python {python}: " + " ".join(tail)
        )
    pins = sorted(
        f"{i['metadata']['name'].lower()}=={i['metadata']['version']}"
        for i in json.loads(run.stdout)["install"]
    )
    for line in others:
        resolved[line] = " ".join(pins)  # the whole resolved set, recorded once per line
    return resolved
