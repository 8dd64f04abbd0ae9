"""A reward rubric's pieces: the facts an episode's terms read, and a term.

A term is a small function of the verification and the episode's facts with one name: the
key of its value in the reward breakdown and the `RewardWeights` field holding its weight.
A rubric is a tuple of terms: the common ones (components/env/rewards.py) plus each tool
set's own (`ToolSet.rubric`, components/env/tool_sets/).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.verifier.verification import Verification


@dataclass(frozen=True)
class EpisodeFacts:
    """What the environment observed during the episode, besides the verification."""

    ran_tests: bool
    safety_categories: tuple[str, ...]  # category of every blocked action, in order
    invalid_calls: int = 0  # unparseable calls, unknown tools and invalid arguments
    # Occurrences of the tool set's counted terms (e.g. fix_search's wasted_fix_try).
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Term:
    """One reward term. `reads(v, facts, env)` returns a bool (the term is worth its weight
    when True, else 0) or, for a counted term, how often it occurred (worth weight x count):
    the outcome says nothing about which turn was wasted, so a policy is charged per
    occurrence. `env` is the episode's EnvConfig."""

    name: str
    reads: Callable[[Verification, EpisodeFacts, Any], bool | int]
    counted: bool = False
    # Used only while RewardWeights has no field of this name (a plug-in set's new term: a
    # preset can set its weight once the field is added there).
    default_weight: float | None = None

    def value(self, weight: float, v: Verification, facts: EpisodeFacts, env: Any) -> float:
        got = self.reads(v, facts, env)
        if self.counted:
            return weight * got
        return weight if got else 0.0


def weight_of(term: Term, weights: Any) -> float:
    """The term's weight: the RewardWeights field of its name, else its default weight."""
    weight = getattr(weights, term.name, term.default_weight)
    if weight is None:
        raise ValueError(f"reward term {term.name!r} has no weight: add a RewardWeights field")
    return weight


def fired(reads: Callable[[Verification, EpisodeFacts, Any], bool]) -> Term:
    """A term worth its weight when `reads` says it fired; named after the function."""
    return Term(reads.__name__, reads)


def counted(reads: Callable[[Verification, EpisodeFacts, Any], int]) -> Term:
    """A term worth its weight per occurrence `reads` counts; named after the function."""
    return Term(reads.__name__, reads, counted=True)


def tool_count(name: str, default_weight: float | None = None) -> Term:
    """A counted term a tool set's tools count themselves (`ToolContext.counts[name]`)."""
    return Term(name, lambda v, facts, env: facts.counts.get(name, 0), True, default_weight)
