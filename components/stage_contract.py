"""A pipeline stage's contract, declared once on its command (`@stage(...)` above a
`main_*` function): the preset sections the command reads and the typed result it leaves
in its result file.

The retrain flow caches a stage on the sections it declares (editing a section reruns
exactly the stages that read it) and reads the stage's result file into the declared
dataclass, so it reads fields rather than guessing keys. While a declared command runs,
its preset serves only the declared sections (components/preset.py asks `check_read`), so
the declaration cannot drift from what the command reads.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PolicyResult:
    """A stage that leaves a policy (policy init, SFT, RS, DPO, GRPO, merge)."""

    # The policy folder it trained or built; '' when it trained none (rejection sampling
    # that kept no episode): the flow keeps its previous candidate then.
    policy_dir: str


@dataclass(frozen=True)
class DataVersionResult:
    """The data snapshot: the data version it published (the log's newest entry)."""

    version: str


@dataclass(frozen=True)
class EvaluationResult:
    """Held-out evaluation (metrics.json): the candidate's aggregate (`overall`,
    `by_split`, ...) and the champion's on the same tasks, when one was compared."""

    candidate: dict
    champion: dict | None = None


@dataclass(frozen=True)
class PromotionResult:
    """The promotion request: the registered version, whether it passed the gates and
    awaits a person as the challenger, and each gate's check."""

    version: str
    challenger: bool
    model: str = "agentrl-coder"
    gate_checks: list = field(default_factory=list)


@dataclass(frozen=True)
class StageContract:
    """What a stage command reads from a preset and what its result file holds."""

    reads: tuple[str, ...]  # preset sections, in the order the stage's cache key lists them
    result: type | None  # a dataclass above; None: a report the flow logs but reads nothing of

    def read(self, values: dict):
        """`values` (the stage's result file) as the declared result (None for a report);
        a field the file lacks is an error naming it."""
        if self.result is None:
            return None
        fields = dataclasses.fields(self.result)
        required = {f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}  # fmt: skip
        missing = sorted(required - set(values))
        if missing:
            raise ValueError(f"stage result lacks {', '.join(missing)} "
                             f"(its contract's {self.result.__name__})")  # fmt: skip
        return self.result(**{f.name: values[f.name] for f in fields if f.name in values})


# The sections the running stage command declared (None: no stage command is running).
_DECLARED: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "stage_sections", default=None
)


def stage(*reads: str, result: type | None = None):
    """Declare a command a pipeline stage that reads preset sections `reads` and writes
    `result` (a dataclass above) into its result file."""

    def declare(main: Callable[[list[str]], int]):
        @functools.wraps(main)
        def command(argv: list[str]) -> int:
            token = _DECLARED.set(reads)
            try:
                return main(argv)
            finally:
                _DECLARED.reset(token)

        command.contract = StageContract(tuple(reads), result)
        return command

    return declare


def check_read(section: str, where: str) -> None:
    """Refuse a preset section the running stage command did not declare: the flow would
    not rerun the stage when that section changes."""
    declared = _DECLARED.get()
    if declared is not None and section not in declared:
        raise RuntimeError(f"{where}: this stage declares the sections {', '.join(declared)} "
                           f"but read {section!r}; add it to its @stage(...)")  # fmt: skip
