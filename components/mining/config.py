"""How a repository is mined (`MineConfig`, the preset's `mine` section), what came of
it (`MineReport`) and the one error a repository that cannot be mined raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.tasks.mutations import get_operator
from components.tasks.task import ENVIRONMENT_PYTHON_MIN, SPLITS
from components.typed_config import doc


class MineError(RuntimeError):
    """The repository cannot be mined (one line: what is wrong with it)."""


@dataclass(frozen=True)
class MineConfig:
    seed: int = field(default=0, metadata=doc("seed of the candidate order"))
    max_candidates: int = field(default=60, metadata=doc("mutants tried per repository"))
    max_tasks: int = field(default=20, metadata=doc("tasks kept per repository"))
    max_per_function: int = field(default=2, metadata=doc("tasks kept per function"))
    budget_s: float = field(default=900.0, metadata=doc("wall-clock bound per repository"))
    suite_timeout_s: float = field(
        default=300.0, metadata=doc("bound on one run of the repository's tests (a hang)")
    )
    per_test_timeout_s: float = field(
        default=10.0,
        metadata=doc("pytest-timeout per test; kept in each task's `limits` for verification"),
    )
    memory_mb: int = field(
        default=0,
        metadata=doc(
            "address space per test process, MiB (0 = the sandbox's); kept in each task's "
            "`limits` for verification"
        ),
    )
    baseline_runs: int = field(
        default=2,
        metadata=doc("runs of the unmutated suite: a test whose outcome differs is flaky"),
    )
    deselect_failing: bool = field(
        default=True,
        metadata=doc(
            "deselect tests that fail, hang or are flaky before mutation (and test files "
            "that do not import), with the reason in the report; False: refuse the repository"
        ),
    )
    python: str = field(default="3.11", metadata=doc("the environment's Python version"))
    split: str = field(
        default="auto", metadata=doc("auto (by family hash) | train | val | test (whole repo)")
    )
    val_fraction: float = field(default=0.2, metadata=doc("auto: share of families in val"))
    test_fraction: float = field(default=0.2, metadata=doc("auto: share of families in test"))
    split_salt: str = field(default="mined-v1", metadata=doc("salt of the family hash"))
    operators: tuple[str, ...] = field(default=(), metadata=doc("operator names (() = all)"))
    max_hidden_cases: int = field(
        default=64, metadata=doc("hidden cases kept per task (recorded calls, distinct args)")
    )

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "max_candidates",
            "max_tasks",
            "max_per_function",
            "baseline_runs",
            "max_hidden_cases",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.memory_mb, bool)
            or not isinstance(self.memory_mb, int)
            or not (self.memory_mb == 0 or self.memory_mb >= 32)
        ):
            problems.append(f"memory_mb must be 0 or an integer >= 32, got {self.memory_mb!r}")
        for name in ("budget_s", "suite_timeout_s", "per_test_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0 < value < float("inf"))
            ):
                problems.append(f"{name} must be a positive number, got {value!r}")
        fractions = (self.val_fraction, self.test_fraction)
        if not all(isinstance(f, int | float) and 0 <= f <= 1 for f in fractions) or (
            sum(fractions) > 1
        ):
            problems.append("val_fraction and test_fraction must be in [0, 1] with sum <= 1")
        parts = self.python.split(".") if isinstance(self.python, str) else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            problems.append(f"python must be MAJOR.MINOR, got {self.python!r}")
        elif tuple(int(p) for p in parts) < ENVIRONMENT_PYTHON_MIN:
            least = ".".join(map(str, ENVIRONMENT_PYTHON_MIN))
            problems.append(
                f"python must be {least} or newer (task environments), got {self.python}"
            )
        if self.split not in ("auto", *SPLITS):
            problems.append(f"split must be auto or one of {', '.join(SPLITS)}, got {self.split!r}")
        if problems:
            raise ValueError("MineConfig: " + "; ".join(problems))
        for name in self.operators:
            get_operator(name)


@dataclass
class MineReport:
    repository: str
    ok: bool = False
    error: str = ""  # the one-line reason nothing was mined
    source_modules: int = 0
    test_files: int = 0
    tests: int = 0
    covered_functions: int = 0  # functions the suite calls that hold a candidate
    candidates: int = 0  # edits inside covered functions
    tried: int = 0
    kept: list[str] = field(default_factory=list)  # task ids
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count
    drops: list[dict] = field(default_factory=list)  # {"candidate", "reason"}
    # test node id or test file -> why it was left out before mutation (fails, hangs, flaky)
    deselected: dict[str, str] = field(default_factory=dict)
    distribution: str = ""  # NAME==VERSION installed editable ("" = path only)
    stopped_by: str = ""  # "budget_s" when the clock ended the run, else ""
    environment: dict = field(default_factory=dict)
    setup_s: float = 0.0
    mutant_tests_s: float = 0.0
    gate_s: float = 0.0
    cases_s: float = 0.0  # recording and checking the hidden cases of kept mutants
    methods_passed_over: int = 0  # candidates in methods, left untried: no hidden cases
    seconds: float = 0.0

    def line(self) -> str:
        if not self.ok:
            return f"MINE ERROR {self.repository}: {self.error}"
        return (f"mined {self.repository}: {len(self.kept)} task(s) from {self.tried} "
                f"mutant(s) tried ({self.candidates} candidates) in {self.seconds:.1f}s")  # fmt: skip
