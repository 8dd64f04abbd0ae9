"""Verification: the verdict on one final tree, and the facts the reward terms need."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Verification:
    """What `verify` (components/verifier/verdict.py) found for one final tree."""

    status: str  # "ok" | "infra_error"
    tests_passed: bool = False
    tests_total: int = 0
    tests_failed: int = 0
    changed_files: list[str] = field(default_factory=list)
    tampered_files: list[str] = field(default_factory=list)
    lint_introduced: int = 0
    security_introduced: int = 0
    security_findings: list[str] = field(default_factory=list)
    # The code under test bent or ended the verdict: pytest reported a pass the recorder,
    # the canary or the hidden cases contradict, or the harness ended without a verdict.
    forged_pass: bool = False
    detail: str = ""
    wall_s: float = 0.0
    # What the verifier observed, as safety flags {"category", "reason"} (test_tampering,
    # resource_limit, network, path_escape, write_outside_workspace): an episode records
    # them next to the monitor's, and the reward reads them.
    flags: list[dict] = field(default_factory=list)
    limit_hit: str | None = None  # a sandbox limit a verification process ran into
    # Why the agent's tree gave no verdict ("" when it gave one). With status "ok" the
    # control verified normally: the failure is the agent's.
    verdict_lost: str = ""
    cached: bool = False  # this verdict was computed for an identical tree before
