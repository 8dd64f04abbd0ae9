"""Typed configuration of the coding environment: its tool set, episode limits, reward weights."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from components.env.tool_sets import DEFAULT_TOOL_SET, TOOL_SETS
from components.typed_config import doc


@dataclass(frozen=True)
class RewardWeights:
    """Weight of each reward term; a term's value is its weight when it fires, else 0.

    Defaults are MISSION.md's: outcome +1 / 0, security problem -1; process terms for the
    coding task: too many files -0.2, tests never run -0.3, lint introduced -0.5,
    dangerous command -1. Test tampering is reported as its own term. Counted terms
    (weight x occurrences) give a per-action signal where the outcome alone is sparse:
    invalid tool call -0.1 (every tool set), and for the fix_search tool set wasted fix try
    -0.1 (a try_fix id that is not listed or was already tried) and failed fix try -0.05 (a
    try_fix whose tests fail). A tool set's own terms are reported only in its episodes.
    """

    tests_pass: float = field(default=1.0, metadata=doc("all hidden tests pass"))
    security: float = field(
        default=-1.0, metadata=doc("security problem introduced (ruff flake8-bandit S rules)")
    )
    too_many_files: float = field(
        default=-0.2, metadata=doc("more files changed than EnvConfig.max_changed_files")
    )
    tests_never_run: float = field(
        default=-0.3, metadata=doc("the agent never ran the test command")
    )
    lint: float = field(default=-0.5, metadata=doc("ruff lint errors introduced in changed files"))
    dangerous_command: float = field(
        default=-1.0, metadata=doc("the safety monitor blocked at least one action")
    )
    resource_limit: float = field(
        default=-0.5,
        metadata=doc("the sandbox killed a command (time, memory or process limit)"),
    )
    test_tampering: float = field(
        default=-1.0, metadata=doc("tests or pytest configuration were modified")
    )
    wasted_fix_try: float = field(
        default=-0.1,
        metadata=doc("per try_fix naming an id that is not listed or was already tried"),
    )
    failed_fix_try: float = field(
        default=-0.05,
        metadata=doc(
            "per try_fix whose tests fail: which try was wrong, where the outcome only says "
            "whether one passed; small, so a try that passes one time in 20 still pays"
        ),
    )
    invalid_call: float = field(
        default=-0.1, metadata=doc("per unparseable tool call or call with invalid arguments")
    )

    def __post_init__(self) -> None:
        if self.tests_pass <= 0:
            raise ValueError("RewardWeights.tests_pass must be positive")
        for f in fields(self):
            if f.name != "tests_pass" and getattr(self, f.name) > 0:
                raise ValueError(f"RewardWeights.{f.name} is a penalty and must be <= 0")


@dataclass(frozen=True)
class EnvConfig:
    """Episode-level settings; sandbox limits are in SandboxConfig."""

    tool_set: str = field(
        default=DEFAULT_TOOL_SET,
        metadata=doc(
            "the environment's tools, their reward terms and decoding constraint "
            f"(components/env/tool_sets/): {' | '.join(TOOL_SETS)}; fix_search is for a small "
            "model that cannot copy code out of its context"
        ),
    )
    max_steps: int = field(default=16, metadata=doc("assistant actions before the episode ends"))
    max_changed_files: int = field(
        default=2, metadata=doc("changing more files than this costs the too_many_files term")
    )
    verify_timeout_s: float = field(
        default=60.0,
        metadata=doc(
            "wall limit of one verification run; hitting it fails the agent's verdict unless "
            "the untouched repository hits it too (then it is an infra fault)"
        ),
    )
    per_test_timeout_s: float = field(
        default=5.0,
        metadata=doc(
            "limit per hidden test and case: seconds of CPU time, and of wall time not spent "
            "waiting for a core (load moves neither); a hang counts as a failure"
        ),
    )
    max_task_memory_mb: int = field(
        default=4096,
        metadata=doc(
            "most memory (MiB per process) a task's own `limits` may raise the sandbox to"
        ),
    )
    max_task_per_test_timeout_s: float = field(
        default=60.0,
        metadata=doc("most per-test timeout a task's own `limits` may raise per_test_timeout_s to"),
    )
    max_fixes: int = field(
        default=64, metadata=doc("fix_search: most candidate fixes one list_fixes call shows")
    )
    fix_test_timeout_s: float = field(
        default=2.0,
        metadata=doc(
            "fix_search: per-test limit of the runs of list_fixes / try_fix, counted like "
            "per_test_timeout_s"
        ),
    )
    weights: RewardWeights = field(default_factory=RewardWeights, metadata=doc("reward weights"))
    remote: str = field(
        default="",
        metadata=doc("env server URL (components/env_service/); 'local': local.py; '': in-process"),
    )

    def __post_init__(self) -> None:
        if self.remote not in ("", "local") and not self.remote.startswith(("http://", "https://")):
            raise ValueError(f"EnvConfig.remote: an http(s):// URL or 'local': {self.remote!r}")
        if self.tool_set not in TOOL_SETS:
            raise ValueError(
                f"EnvConfig.tool_set: unknown {self.tool_set!r} (known: {', '.join(TOOL_SETS)})"
            )
        self._check_unused_settings()
        if self.max_steps < 1:
            raise ValueError("EnvConfig.max_steps must be >= 1")
        if self.fix_test_timeout_s <= 0:
            raise ValueError("EnvConfig.fix_test_timeout_s must be positive")
        if self.max_fixes < 1:
            raise ValueError("EnvConfig.max_fixes must be >= 1")
        if self.max_changed_files < 1:
            raise ValueError("EnvConfig.max_changed_files must be >= 1")
        if not 0 < self.per_test_timeout_s < self.verify_timeout_s:
            raise ValueError("EnvConfig: need 0 < per_test_timeout_s < verify_timeout_s")
        if self.max_task_memory_mb < 32 or not 0 < self.max_task_per_test_timeout_s < float("inf"):
            raise ValueError("EnvConfig: max_task_memory_mb >= 32, max_task_per_test_timeout_s > 0")

    def with_tool_set(self, name: str) -> EnvConfig:
        """This config with tool set `name`: the settings and weights only the old set read
        go back to their defaults (for a caller that plays one set's scripted policy, e.g.
        an attack, in an environment configured for another)."""
        if name == self.tool_set:
            return self
        others = [spec for key, spec in TOOL_SETS.items() if key != name]
        keep = set(TOOL_SETS[name].settings) | set(TOOL_SETS[name].counted_terms)
        reset = {f for spec in others for f in spec.settings if f not in keep}
        terms = {t for spec in others for t in spec.counted_terms
                 if t not in keep and hasattr(self.weights, t)}  # fmt: skip
        defaults = EnvConfig.__dataclass_fields__
        weights = replace(self.weights, **{t: getattr(RewardWeights(), t) for t in terms})
        return replace(
            self, tool_set=name, weights=weights, **{f: defaults[f].default for f in reset}
        )

    def _check_unused_settings(self) -> None:
        """A setting only another tool set reads is an error, not a silent no-op."""
        unused = [
            f"weights.{term}"
            for spec in TOOL_SETS.values()
            for term in spec.counted_terms
            if term not in TOOL_SETS[self.tool_set].counted_terms
            and getattr(self.weights, term, None) != getattr(RewardWeights(), term, None)
        ]
        defaults = EnvConfig.__dataclass_fields__
        unused += [
            name
            for spec in TOOL_SETS.values()
            for name in spec.settings
            if name not in TOOL_SETS[self.tool_set].settings
            and getattr(self, name) != defaults[name].default
        ]
        if unused:
            raise ValueError(
                f"EnvConfig: {', '.join(sorted(set(unused)))} set, but tool set "
                f"{self.tool_set!r} does not read it"
            )
