"""What a sandboxed command may do: its limits, the programs it may start and the
isolation it runs under (`SandboxConfig`), and the error a refused command raises."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_ALLOWED_PROGRAMS: tuple[str, ...] = (
    "python",
    "python3",
    "pytest",
    "ls",
    "cat",
    "head",
    "tail",
    "grep",
    "wc",
    "diff",
    "find",
    "echo",
    "pwd",
    "ruff",
    "true",
    "sort",
    "uniq",
)
ISOLATION_MODES = ("auto", "bwrap", "namespace", "none")


class SandboxError(RuntimeError):
    """A command was refused or could not be started (the message says why)."""


@dataclass(frozen=True)
class SandboxConfig:
    """The limits, programs and isolation of every command run in the sandbox."""

    wall_time_s: float = field(
        default=60.0, metadata={"help": "wall-clock limit per command, seconds"}
    )
    cpu_time_s: int = field(
        default=60, metadata={"help": "CPU-time limit per process (RLIMIT_CPU), seconds"}
    )
    memory_mb: int = field(
        default=1024,
        metadata={"help": "address-space limit per process and memory cgroup limit, MiB"},
    )
    max_processes: int = field(
        default=64, metadata={"help": "processes+threads of one command (pids cgroup)"}
    )
    max_output_bytes: int = field(
        default=16_384, metadata={"help": "bytes of merged stdout+stderr kept (head and tail)"}
    )
    max_file_bytes: int = field(
        default=16 * 1024 * 1024, metadata={"help": "largest file a command may write"}
    )
    network: bool = field(
        default=False, metadata={"help": "allow network access (off: empty net namespace)"}
    )
    isolation: str = field(
        default="auto",
        metadata={"help": "auto | bwrap | namespace | none (auto picks the strongest working)"},
    )
    allowed_programs: tuple[str, ...] = field(
        default=DEFAULT_ALLOWED_PROGRAMS,
        metadata={"help": "program basenames a command may start"},
    )
    hide_paths: tuple[str, ...] = field(
        default=(),
        metadata={"help": "extra host paths masked inside the sandbox (bwrap), e.g. task dirs"},
    )
    python_env: str = field(
        default="",
        metadata={"help": "prefix of the environment whose python commands run with, mounted "
                  "read-only ('' = the project's interpreter); set per task from its "
                  "environment (components/tasks/environments.py)"},
    )  # fmt: skip
    environments_dir: str = field(
        default="~/.cache/agentrl/environments",
        metadata={"help": "where `agentrl tasks prepare` builds task environments and "
                  "episodes and the verifier find them"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.wall_time_s, int | float) or not self.wall_time_s > 0:
            problems.append(f"wall_time_s must be a positive number, got {self.wall_time_s!r}")
        for name in ("cpu_time_s", "memory_mb", "max_processes", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.max_file_bytes, bool) or not isinstance(self.max_file_bytes, int):
            problems.append(f"max_file_bytes must be an integer, got {self.max_file_bytes!r}")
        elif self.max_file_bytes < 1024:
            problems.append(f"max_file_bytes must be >= 1024, got {self.max_file_bytes}")
        if isinstance(self.memory_mb, int) and 0 < self.memory_mb < 32:
            problems.append("memory_mb must be >= 32 (an interpreter needs that much)")
        if isinstance(self.max_processes, int) and 0 < self.max_processes < 4:
            problems.append("max_processes must be >= 4 (bwrap itself uses two)")
        if isinstance(self.max_output_bytes, int) and 0 < self.max_output_bytes < 256:
            problems.append("max_output_bytes must be >= 256")
        if not isinstance(self.network, bool):
            problems.append(f"network must be a bool, got {self.network!r}")
        if self.isolation not in ISOLATION_MODES:
            problems.append(f"isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        for name in ("allowed_programs", "hide_paths"):
            value = getattr(self, name)
            if not (isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)):
                problems.append(f"{name} must be a tuple of non-empty strings")
        if isinstance(self.allowed_programs, tuple) and any(
            "/" in p for p in self.allowed_programs
        ):
            problems.append("allowed_programs holds basenames, not paths")
        if isinstance(self.hide_paths, tuple) and any(
            not p.startswith("/") for p in self.hide_paths
        ):
            problems.append("hide_paths must be absolute paths")
        if not isinstance(self.python_env, str) or (
            self.python_env and not self.python_env.startswith("/")
        ):
            problems.append(f"python_env must be '' or an absolute path, got {self.python_env!r}")
        if not isinstance(self.environments_dir, str):
            problems.append("environments_dir must be a string")
        if problems:
            raise ValueError("invalid SandboxConfig: " + "; ".join(problems))
