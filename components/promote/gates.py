"""Promotion gates: may this candidate become `challenger`? Pure functions, no I/O.

Every gate is checked (no short-circuit) so the evidence shows all reasons at once.
Thresholds are maxima: a rate equal to its threshold passes. A missing metric fails its
gate; absence of evidence is never a pass. Passing the gates only makes a challenger;
`champion` moves on a person's approval (approval.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from components.promote.config import PromotionConfig

GATE_NAMES = (
    "success_rate",
    "regression_rate",
    "safety_violation_rate",
    "tampering_rate",
    "infra_failure_rate",
    "cheating_rate",
    "data_validation",
    "verifier_version",
)


class GateCheck(TypedDict):
    name: str
    value: Any  # the measured value (None when missing)
    threshold: Any  # the bar it was held to
    passed: bool
    reason: str


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    checks: list[GateCheck] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "checks": [dict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, raw: dict) -> GateDecision:
        return cls(passed=bool(raw["passed"]), checks=[GateCheck(**c) for c in raw["checks"]])

    def failed(self) -> list[str]:
        return [c["name"] for c in self.checks if not c["passed"]]


def _number(metrics: dict | None, key: str) -> float | None:
    value = (metrics or {}).get(key)
    return None if value is None else float(value)


def _missing(name: str, threshold: Any) -> GateCheck:
    """A metric the candidate's report lacks: absence of evidence fails its gate."""
    return GateCheck(name=name, value=None, threshold=threshold, passed=False,
                     reason=f"{name} missing from the candidate's report")  # fmt: skip


def _at_most(name: str, value: float | None, limit: float) -> GateCheck:
    if value is None:
        return _missing(name, limit)
    ok = value <= limit
    reason = f"{name} {value:.4f} {'<=' if ok else '>'} max {limit:.4f}"
    return GateCheck(name=name, value=value, threshold=limit, passed=ok, reason=reason)


def _success(candidate: dict, champion: dict | None, config: PromotionConfig) -> GateCheck:
    value = _number(candidate, "success_rate")
    champ = _number(champion, "success_rate") if champion else None
    if champion is not None and champ is None:
        return GateCheck(name="success_rate", value=value, threshold=None, passed=False,
                         reason="champion success_rate missing: cannot compare")  # fmt: skip
    if champ is None:
        bar, against = config.min_success_rate, "no champion: floor"
    else:
        bar = max(champ + config.success_margin, config.min_success_rate)
        against = f"champion {champ:.4f} + margin {config.success_margin:.4f}"
    bar = round(bar, 12)  # 0.7 + 0.1 must not become 0.7999999999999999 and pass 0.79
    if value is None:
        return _missing("success_rate", bar)
    ok = value >= bar
    reason = f"success_rate {value:.4f} {'>=' if ok else '<'} {bar:.4f} ({against})"
    return GateCheck(name="success_rate", value=value, threshold=bar, passed=ok, reason=reason)


def _regression(candidate: dict, champion: dict | None, config: PromotionConfig) -> GateCheck:
    value = _number(candidate, "regression_rate")
    limit = config.max_regression_rate
    if champion is None:
        # Regression is measured against the champion's solved tasks; none exist yet.
        return GateCheck(
            name="regression_rate",
            value=value,
            threshold=limit,
            passed=True,
            reason="no champion: nothing to regress from",
        )
    return _at_most("regression_rate", value, limit)


def _infra_failures(candidate: dict, config: PromotionConfig) -> GateCheck:
    """Infra failures over all the candidate's evaluation episodes (metrics.json's
    candidate.overall `infra_failures` and `episodes`). Success rates count verified
    episodes only, so a candidate that makes the verifier fail looks better: capped here."""
    failures, episodes = _number(candidate, "infra_failures"), _number(candidate, "episodes")
    limit = config.max_infra_failure_rate
    if failures is None or not episodes:
        return _missing("infra_failure_rate", limit)
    check = _at_most("infra_failure_rate", failures / episodes, limit)
    check["reason"] += f" ({failures:.0f} of {episodes:.0f} episodes)"
    return check


def _data_validation(data_validation: dict | None, config: PromotionConfig) -> GateCheck:
    dv = data_validation or {}
    value = dv.get("passed")
    version = dv.get("version", "?")
    if not config.require_data_validation:
        return GateCheck(
            name="data_validation",
            value=value,
            threshold=None,
            passed=True,
            reason="not required by config",
        )
    ok = value is True
    if value is None:
        reason = "no data validation report"
    else:
        rate = dv.get("failure_rate")
        rate_text = "?" if rate is None else f"{float(rate):.4f}"
        verdict = "passed" if ok else "failed"
        reason = f"data {version} validation {verdict} (failure_rate {rate_text})"
    return GateCheck(name="data_validation", value=value, threshold=True, passed=ok, reason=reason)


def _verifier(candidate: dict, champion: dict | None, current: str,
              config: PromotionConfig) -> GateCheck:  # fmt: skip
    """With `require_current_verifier`: the candidate's and the champion's evaluations were
    judged by the current verifier (components/verifier/version.py); a comparison with a
    champion judged by an older verifier compares two different judges."""
    judged = {"candidate": candidate.get("verifier_version")}
    if champion is not None:
        judged["champion"] = champion.get("verifier_version")
    if not config.require_current_verifier:
        return GateCheck(name="verifier_version", value=judged, threshold=None, passed=True,
                         reason="not required by config")  # fmt: skip
    stale = {who: v for who, v in judged.items() if v != current}
    reason = (f"judged by the current verifier {current}" if not stale else "; ".join(
        f"{who} evaluation judged by {v or 'an unrecorded verifier'}, current is {current} "
        "(agentrl rescore it)" for who, v in stale.items()))  # fmt: skip
    return GateCheck(name="verifier_version", value=judged, threshold=current,
                     passed=not stale, reason=reason)  # fmt: skip


def evaluate_gates(
    candidate_metrics: dict,
    champion_metrics: dict | None,
    data_validation: dict,
    config: PromotionConfig | None = None,
    current_verifier: str | None = None,
) -> GateDecision:
    """Hold the candidate to every gate; passed only when all pass.

    candidate_metrics / champion_metrics: success_rate, regression_rate (vs the champion;
    None without one), safety_violation_rate, tampering_rate, cheating_rate; the candidate's also
    infra_failures and episodes (its evaluation's counts). champion_metrics is None when
    there is no champion yet. data_validation: {"passed": bool, "failure_rate": float,
    "version": str} of the data the candidate was trained on. `verifier_version` in the
    metrics: the verifier that judged each evaluation; `current_verifier` (default: this
    code's) is the one `require_current_verifier` holds them to.
    """
    config = config or PromotionConfig()
    if current_verifier is None:
        from components.verifier.version import verifier_version

        current_verifier = verifier_version()
    checks = [
        _success(candidate_metrics, champion_metrics, config),
        _regression(candidate_metrics, champion_metrics, config),
        _at_most(
            "safety_violation_rate",
            _number(candidate_metrics, "safety_violation_rate"),
            config.max_safety_violation_rate,
        ),
        _at_most(
            "tampering_rate",
            _number(candidate_metrics, "tampering_rate"),
            config.max_tampering_rate,
        ),
        _infra_failures(candidate_metrics, config),
        # Success on impossible variants (components/evaluate/cheating.py): a cheat each.
        _at_most(
            "cheating_rate", _number(candidate_metrics, "cheating_rate"), config.max_cheating_rate
        ),
        _data_validation(data_validation, config),
        _verifier(candidate_metrics, champion_metrics, current_verifier, config),
    ]
    return GateDecision(passed=all(c["passed"] for c in checks), checks=checks)
