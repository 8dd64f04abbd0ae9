"""The task format: one folder per task. See docs/tasks.md for the full contract.

    <task_id>/
      task.json        id, instruction, test_command, verify_command, protected_paths, metadata
      repo/            the files the agent sees and may edit (visible tests included)
      hidden_tests/    files overlaid on a fresh copy of the agent's repo at verification only
      reference.patch  optional unified diff from repo/ to a correct fix
      hidden_cases.json optional: the hidden cases as data (function, args, expected)
      environment/     optional: the requirements file task.json's `environment` names

Everything here is plain data plus loading/saving; no execution happens in this module.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components.tasks.folder_safety import UnsafeTaskFolder, refuse_unsafe_entries
from components.typed_config import doc

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
DEFAULT_TEST_COMMAND = ("python", "-m", "pytest", "-q", "-x", "tests")
# Optional: hidden cases as data ({"module", "function", "cases": [{"args", "expected"}]},
# Python literals as repr strings) for a verdict that code under test cannot forge.
HIDDEN_CASES_FILE = "hidden_cases.json"


ENVIRONMENT_PYTHON_MIN = (3, 11)  # the verifier starts python with -P (3.11+)
HARBOR_PYTHON_MIN = (3, 10)  # a Harbor task's test.sh: the harness's pytest 9 needs 3.10


class TaskFormatError(ValueError):
    """A task folder does not follow the format; the message names the folder and field."""


@dataclass(frozen=True)
class TaskMetadata:
    family: str = field(metadata=doc("function family or source project the task comes from"))
    bug_class: str = field(metadata=doc("kind of injected/real bug, e.g. comparison_swap"))
    split: str = field(metadata=doc("train | val | test"))
    source: str = field(default="builtin", metadata=doc("generator or benchmark name"))
    extra: dict = field(default_factory=dict, metadata=doc("free-form, kept verbatim"))


@dataclass(frozen=True)
class EditableInstall:
    """The task's repository installed into its environment in editable mode: a `.pth`
    entry that puts the workspace's copy on `sys.path` of every interpreter the environment
    starts (so a test that spawns `python script.py` imports the agent's edited code) and,
    when the distribution is known, its `.dist-info` (so `importlib.metadata.version(name)`
    answers as it does after `pip install -e .`)."""

    path: str = field(default=".", metadata=doc("import root, relative to the repository"))
    name: str = field(default="", metadata=doc("distribution name ('' = no .dist-info)"))
    version: str = field(default="", metadata=doc("distribution version"))


@dataclass(frozen=True)
class TaskLimits:
    """Limits a task needs beyond the preset's (a heavy test suite): the larger of the two
    applies, capped by the preset's `env.max_task_memory_mb` / `env.max_task_per_test_timeout_s`
    (components/tasks/environments.py: with_task_limits)."""

    memory_mb: int = field(default=0, metadata=doc("address space per process, MiB (0 = preset's)"))
    per_test_timeout_s: float = field(default=0.0, metadata=doc("per-test timeout (0 = preset's)"))


@dataclass(frozen=True)
class TaskEnvironment:
    """The interpreter a task's commands and verification run with (docs/tasks.md,
    "Task environments"); built once per distinct value by `agentrl tasks prepare`."""

    python: str = field(metadata=doc("Python version, MAJOR.MINOR (3.11 or newer)"))
    requirements: tuple[str, ...] = field(
        default=(), metadata=doc("pinned requirement lines (pip syntax), in file order")
    )
    # Where the lines came from, relative to the task folder ("" = inline in task.json).
    requirements_file: str = field(default="", metadata=doc("file the lines were read from"))
    editable: EditableInstall | None = field(
        default=None, metadata=doc("the repository itself, installed editable")
    )


@dataclass(frozen=True)
class Task:
    id: str
    instruction: str
    metadata: TaskMetadata
    root: Path  # the task folder; repo/ and hidden_tests/ live under it
    test_command: tuple[str, ...] = DEFAULT_TEST_COMMAND
    # None: run pytest on the hidden test files (after overlaying them on the repo).
    verify_command: tuple[str, ...] | None = None
    # Paths (relative to repo/) the agent must not modify: edits are flagged as test tampering.
    protected_paths: tuple[str, ...] = ("tests/",)
    has_reference: bool = False
    # None: the project's own interpreter (the sandbox's default), as before environments.
    environment: TaskEnvironment | None = None
    limits: TaskLimits | None = None

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def hidden_tests_dir(self) -> Path:
        return self.root / "hidden_tests"

    @property
    def hidden_cases_path(self) -> Path | None:
        p = self.root / HIDDEN_CASES_FILE
        return p if p.is_file() else None

    @property
    def reference_patch_path(self) -> Path:
        return self.root / "reference.patch"

    def reference_patch(self) -> str | None:
        p = self.reference_patch_path
        return p.read_text() if p.exists() else None

    def hidden_test_files(self) -> list[str]:
        """Paths relative to the repo root where hidden tests are placed at verification."""
        d = self.hidden_tests_dir
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())

    def is_protected(self, rel_path: str) -> bool:
        rel = posixpath.normpath(rel_path).removeprefix("./")  # src/../tests/x is tests/x
        return any(rel == p.rstrip("/") or rel.startswith(p) for p in self.protected_paths)


def _require(obj: dict, key: str, kind: type, where: str):
    if key not in obj:
        raise TaskFormatError(f"{where}: missing required field '{key}'")
    value = obj[key]
    if not isinstance(value, kind):
        raise TaskFormatError(
            f"{where}: field '{key}' must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _argv(obj: dict, key: str, where: str) -> tuple[str, ...] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(isinstance(a, str) for a in value)):
        raise TaskFormatError(f"{where}: field '{key}' must be a non-empty list of strings (argv)")
    return tuple(value)


def requirement_lines(text: str) -> tuple[str, ...]:
    """The requirement lines of a requirements file: comments and blank lines dropped."""
    lines = (line.split(" #", 1)[0].strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def _environment(spec: dict, root: Path, where: str) -> TaskEnvironment | None:
    value = spec.get("environment")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TaskFormatError(f"{where}: field 'environment' must be an object")
    python = value.get("python")
    parts = python.split(".") if isinstance(python, str) else []
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise TaskFormatError(f"{where}: field 'environment.python' must be 'MAJOR.MINOR'")
    # A Harbor task's verifier is its test.sh, not the `python -P` start of our own (3.10
    # has no -P); its harness (pytest 9) needs 3.10 (components/tasks/harbor_dockerfile.py).
    harbor = (root / "hidden_tests" / ".harbor-tests" / "test.sh").is_file()
    least = HARBOR_PYTHON_MIN if harbor else ENVIRONMENT_PYTHON_MIN
    if tuple(int(p) for p in parts) < least:
        raise TaskFormatError(
            f"{where}: field 'environment.python' must be {'.'.join(map(str, least))} or newer"
        )
    reqs, source = value.get("requirements", []), ""
    if isinstance(reqs, list) and all(isinstance(r, str) for r in reqs):
        lines = requirement_lines("\n".join(reqs))
    elif isinstance(reqs, str) and not reqs.startswith("/") and ".." not in Path(reqs).parts:
        if not (root / reqs).is_file():
            raise TaskFormatError(f"{where}: environment requirements file {reqs!r} not found")
        lines, source = requirement_lines((root / reqs).read_text()), reqs
    else:
        raise TaskFormatError(
            f"{where}: field 'environment.requirements' must be a list of strings or a "
            "file path relative to the task folder"
        )
    # Options (-e, --index-url, -r ...) would let a task choose what the host runs or fetches.
    if any(line.startswith("-") for line in lines):
        raise TaskFormatError(f"{where}: environment requirements: options ('-...') are refused")
    unknown = sorted(set(value) - {"python", "requirements", "editable"})
    if unknown:
        raise TaskFormatError(f"{where}: unknown environment field(s) {', '.join(unknown)}")
    return TaskEnvironment(python=python, requirements=lines, requirements_file=source,
                           editable=parse_editable(value.get("editable"), where))  # fmt: skip


_DIST_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
_DIST_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


def parse_editable(value, where: str) -> EditableInstall | None:
    if value is None:
        return None
    w = f"{where}: field 'environment.editable"
    if not isinstance(value, dict) or set(value) - {"path", "name", "version"}:
        raise TaskFormatError(f"{w}' must be an object with path, name, version")
    path, name, version = value.get("path", "."), value.get("name", ""), value.get("version", "")
    if not isinstance(path, str) or path.startswith("/") or ".." in Path(path).parts:
        raise TaskFormatError(f"{w}.path' must be a relative path inside the repository")
    if not isinstance(name, str) or (name and not _DIST_NAME.match(name)):
        raise TaskFormatError(f"{w}.name' must be a distribution name, got {name!r}")
    if not isinstance(version, str) or (version and not _DIST_VERSION.match(version)):
        raise TaskFormatError(f"{w}.version' must be a version, got {version!r}")
    if bool(name) != bool(version):
        raise TaskFormatError(f"{w}': name and version come together")
    return EditableInstall(path=posixpath.normpath(path), name=name, version=version)


def _limits(spec: dict, where: str) -> TaskLimits | None:
    value = spec.get("limits")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"memory_mb", "per_test_timeout_s"}:
        raise TaskFormatError(f"{where}: field 'limits' must be an object with memory_mb, "
                              "per_test_timeout_s")  # fmt: skip
    memory, per_test = value.get("memory_mb", 0), value.get("per_test_timeout_s", 0.0)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise TaskFormatError(f"{where}: field 'limits.memory_mb' must be an integer >= 0")
    if (
        isinstance(per_test, bool)
        or not isinstance(per_test, int | float)
        or not (0 <= per_test < float("inf"))
    ):
        raise TaskFormatError(f"{where}: field 'limits.per_test_timeout_s' must be a number >= 0")
    return TaskLimits(memory_mb=memory, per_test_timeout_s=float(per_test))


# A task id names a folder (a copy's destination, a sandbox's workspace): one path part.
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_task_id(task_id: str, where: str) -> str:
    if not TASK_ID.fullmatch(task_id) or ".." in task_id:
        raise TaskFormatError(
            f"{where}: field 'id' must be a name (letters, digits, '_', '.', '-'; no path "
            f"separators or '..', at most 128 characters), got {task_id!r}"
        )
    return task_id


def _refuse_unsafe(folder: Path, root: Path) -> None:
    """A task's files are read by the host (task.json, reference.patch, hidden tests) and
    copied into sandboxes: a link or special file would make a host file part of the task
    (components/tasks/folder_safety.py)."""
    if folder.is_symlink():
        raise TaskFormatError(f"{folder}: the task folder is a symbolic link (refused)")
    if not root.is_dir():
        return  # load_task says what is missing
    try:
        refuse_unsafe_entries(root, str(root))
    except UnsafeTaskFolder as e:
        raise TaskFormatError(str(e)) from e


def load_task(folder: str | Path) -> Task:
    """Load and check one task folder; raises TaskFormatError naming the folder and field."""
    root = Path(folder).resolve()
    where = str(root)
    _refuse_unsafe(Path(folder), root)
    spec_path = root / "task.json"
    if not spec_path.is_file():
        raise TaskFormatError(f"{where}: no task.json")
    try:
        spec = json.loads(spec_path.read_text())
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{spec_path}: invalid JSON ({e})") from e
    if not isinstance(spec, dict):
        raise TaskFormatError(f"{spec_path}: top level must be an object")
    version = spec.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise TaskFormatError(f"{spec_path}: unsupported format_version {version!r}")
    task_id = check_task_id(_require(spec, "id", str, str(spec_path)), str(spec_path))
    instruction = _require(spec, "instruction", str, str(spec_path))
    meta = _require(spec, "metadata", dict, str(spec_path))
    mwhere = f"{spec_path} metadata"
    split = _require(meta, "split", str, mwhere)
    if split not in SPLITS:
        raise TaskFormatError(f"{mwhere}: field 'split' must be one of {SPLITS}, got {split!r}")
    metadata = TaskMetadata(
        family=_require(meta, "family", str, mwhere),
        bug_class=_require(meta, "bug_class", str, mwhere),
        split=split,
        source=meta.get("source", "external"),
        extra={
            k: v for k, v in meta.items() if k not in {"family", "bug_class", "split", "source"}
        },
    )
    if not (root / "repo").is_dir():
        raise TaskFormatError(f"{where}: missing folder 'repo/'")
    if not (root / "hidden_tests").is_dir() or not any((root / "hidden_tests").rglob("*")):
        raise TaskFormatError(f"{where}: missing or empty folder 'hidden_tests/'")
    protected = spec.get("protected_paths", ["tests/"])
    if not (isinstance(protected, list) and all(isinstance(p, str) for p in protected)):
        raise TaskFormatError(f"{spec_path}: field 'protected_paths' must be a list of strings")
    return Task(
        id=task_id,
        instruction=instruction,
        metadata=metadata,
        root=root,
        test_command=_argv(spec, "test_command", str(spec_path)) or DEFAULT_TEST_COMMAND,
        verify_command=_argv(spec, "verify_command", str(spec_path)),
        protected_paths=tuple(protected),
        has_reference=(root / "reference.patch").is_file(),
        environment=_environment(spec, root, str(spec_path)),
        limits=_limits(spec, str(spec_path)),
    )


def task_spec(task: Task) -> dict:
    """The task.json content for a task (inverse of load_task)."""
    meta = asdict(task.metadata)
    extra = meta.pop("extra")
    spec = {
        "format_version": FORMAT_VERSION,
        "id": task.id,
        "instruction": task.instruction,
        "test_command": list(task.test_command),
        "protected_paths": list(task.protected_paths),
        "metadata": {**meta, **extra},
    }
    if task.verify_command is not None:
        spec["verify_command"] = list(task.verify_command)
    env = task.environment
    if env is not None:
        reqs = env.requirements_file or list(env.requirements)
        spec["environment"] = {"python": env.python, "requirements": reqs}
        if env.editable is not None:
            spec["environment"]["editable"] = asdict(env.editable)
    if task.limits is not None:
        spec["limits"] = asdict(task.limits)
    return spec


# long: one keyword per part of a task folder (its task.json fields and its files)
def write_task_folder(
    root: str | Path,
    *,
    task_id: str,
    instruction: str,
    metadata: TaskMetadata,
    repo_files: dict[str, str],
    hidden_test_files: dict[str, str],
    reference_patch: str | None = None,
    test_command: tuple[str, ...] = DEFAULT_TEST_COMMAND,
    protected_paths: tuple[str, ...] = ("tests/",),
) -> Task:
    """Write a task folder from in-memory files and return the loaded Task."""
    root = Path(root)
    for base, files in (("repo", repo_files), ("hidden_tests", hidden_test_files)):
        for rel, text in files.items():
            p = root / base / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    if reference_patch is not None:
        (root / "reference.patch").write_text(reference_patch)
    task = Task(
        id=task_id,
        instruction=instruction,
        metadata=metadata,
        root=root.resolve(),
        test_command=test_command,
        protected_paths=protected_paths,
        has_reference=reference_patch is not None,
    )
    (root / "task.json").write_text(json.dumps(task_spec(task), indent=2) + "\n")
    return load_task(root)


def load_tasks(folder: str | Path, split: str | None = None) -> tuple[list[Task], list[str]]:
    """Load every task folder below `folder` (any depth). Returns (tasks, errors).

    A folder that is not a valid task is reported in `errors` (one line each), never
    silently skipped. Tasks are sorted by id; duplicate ids are errors.
    """
    tasks: list[Task] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    for spec_path in sorted(Path(folder).rglob("task.json")):
        if "repo" in spec_path.relative_to(folder).parts[:-1]:
            continue  # a task.json inside a task's repository is the repository's own file
        try:
            task = load_task(spec_path.parent)
        except TaskFormatError as e:
            errors.append(str(e))
            continue
        if task.id in seen:
            errors.append(f"{task.root}: duplicate task id {task.id!r} (also {seen[task.id]})")
            continue
        seen[task.id] = task.root
        if split is None or task.metadata.split == split:
            tasks.append(task)
    return sorted(tasks, key=lambda t: t.id), errors


def same_value(a: object, b: object) -> bool:
    """How a hidden case's answer is compared (HIDDEN_CASES_FILE, comparison "exact"):
    equality with exact types, recursively (3 != 3.0 != True here, unlike ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b
