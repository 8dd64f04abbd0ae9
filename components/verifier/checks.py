"""What every sandboxed check shares: the settings it reads, the sandbox it runs in, the
interpreter start, and how a verdict line is read off a process's output.

A check is one sandboxed run (the hidden tests under the harness, or the hidden cases under
the case runner) in a fresh tree; its program writes one marker line with a token last and
exits 0, so a line followed by a hang, a kill or another exit status came from the code
under test.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Protocol

from components.sandbox.config import SandboxConfig
from components.sandbox.process import CommandResult
from components.tasks.environments import task_python_env
from components.tasks.task import Task

# The interpreter start of every verification process (components/verifier/verdict.py).
ISOLATED_PYTHON = ("python", "-s", "-P", "-B")


def isolated_python(cfg: SandboxConfig) -> tuple[str, ...]:
    """ISOLATED_PYTHON for the interpreter `cfg` runs (its python_env, else the project's).
    Python before 3.11 has no -P: it exits 2 ("Unknown option: -P"), so every check of a
    task with a 3.10 environment gave no verdict (issue 46). There it runs without -P, which
    leaves the script's own folder first on sys.path: each check runs its script from a
    read-only tools folder of the verifier's own (a fresh random name, nothing of the
    agent's in it), never with `-c` (which would put the agent's tree there)."""
    version = _venv_version(cfg.python_env) if cfg.python_env else None
    if version is not None and version < (3, 11):
        return tuple(a for a in ISOLATED_PYTHON if a != "-P")
    return ISOLATED_PYTHON


def _venv_version(python_env: str) -> tuple[int, int] | None:
    """(major, minor) of a virtual environment's interpreter, from its pyvenv.cfg (None:
    not found: the flags stay as they are)."""
    from pathlib import Path

    try:
        text = (Path(python_env) / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            parts = value.strip().split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
    return None


class VerifierSettings(Protocol):
    """The episode settings a verification reads. components/env/config.py's EnvConfig has
    them (the verifier sits below the environment, so it names the fields, not the class);
    it must be a dataclass: a task's own limits replace fields (tasks/environments.py)."""

    @property
    def per_test_timeout_s(self) -> float: ...  # each hidden test and case, CPU and wall
    @property
    def verify_timeout_s(self) -> float: ...  # a whole verification process
    @property
    def max_task_memory_mb(self) -> int: ...  # the most a task's own limits may ask for
    @property
    def max_task_per_test_timeout_s(self) -> float: ...  # and per test


@dataclass
class Check:
    """What one sandboxed check (hidden cases or hidden tests) gave."""

    passed: bool = False
    total: int = 0
    failed: int = 0
    forged: list[str] = field(default_factory=list)  # how the verdict was bent
    lost: str = ""  # why there is no verdict ("": there is one)
    limit: str | None = None
    command: CommandResult | None = None
    detail: str = ""
    # Differential cases only: how many failed cases were answered with a plain value that
    # is neither the expected one nor the unfixed code's (None: not differential).
    answered_otherwise: int | None = None


def no_verdict(cmd: CommandResult, what: str) -> str:
    if cmd.limit_hit not in (None, "output"):
        return f"{what} hit its {cmd.limit_hit} limit"
    if cmd.exit_code >= 128:
        return f"{what} crashed (signal {cmd.exit_code - 128})"
    return f"{what} ended without a verdict (exit code {cmd.exit_code})"


def last_marker(output: str, marker: str) -> tuple[int, object]:
    """(times the marker line appears, the JSON after its last occurrence or None)."""
    n = output.count(marker)
    if not n:
        return 0, None
    try:
        return n, json.loads(output[output.rfind(marker) + len(marker) :].splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return n, None


def ran_after_verdict(cmd: CommandResult) -> str:
    """Why the process was not done when its verdict line was written ("" when it was):
    the harness and the case runner write theirs last and exit 0, so a line followed by a
    hang, a kill or another exit status came from the code under test."""
    if cmd.limit_hit not in (None, "output") or cmd.timed_out:
        return f"a verdict line was followed by a {cmd.limit_hit or 'wall_time'} limit hit"
    if cmd.exit_code != 0:
        return f"a verdict line was followed by exit status {cmd.exit_code}"
    return ""


def check_config(task: Task, env: VerifierSettings, sandbox: SandboxConfig) -> SandboxConfig:
    """The sandbox of a verification process: the verifier's wall limit, room for the
    verdict line, and the task folder and its store masked (the sandbox does not show them
    under bwrap anyway; this also covers a store inside a folder it does show)."""
    # A task with its own environment is verified with that interpreter, whatever the
    # episode's sandbox said (TaskEnvironmentError when it is not prepared).
    python_env = task_python_env(task, sandbox.environments_dir) or sandbox.python_env
    return dataclasses.replace(
        sandbox,
        python_env=python_env,
        wall_time_s=env.verify_timeout_s,
        cpu_time_s=max(sandbox.cpu_time_s, int(env.verify_timeout_s)),
        max_output_bytes=max(sandbox.max_output_bytes, 1 << 20),
        hide_paths=(*sandbox.hide_paths, str(task.root), str(task.root.parent)),
    )


def limit_of(cmd: CommandResult) -> str | None:
    """The sandbox limit the command hit (None: none, or only the output cap)."""
    return cmd.limit_hit if cmd.limit_hit not in (None, "output") else None
