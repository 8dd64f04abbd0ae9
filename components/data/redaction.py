"""Credential redaction: the one place secrets are found and replaced in text.

Both stages that write data use it: ingest (quarantined raw text) and validate (the
trajectories' text columns), so it sits below both. Patterns come from the config
(`ValidationConfig.secret_patterns`, DEFAULT_SECRET_PATTERNS); a pattern's leading
BOUNDARY becomes a look-behind here, so only the secret itself is replaced.
"""

from __future__ import annotations

import re

from components.data.config import BOUNDARY

REDACTED = "[REDACTED:{kind}]"


def secret_regex(patterns: dict[str, str]) -> re.Pattern:
    """One alternation with a named group per credential kind, for redaction in Python."""
    lookbehind = "(?<![A-Za-z0-9_])"
    return re.compile(
        "|".join(
            f"(?P<{name}>{lookbehind + rx.removeprefix(BOUNDARY) if rx.startswith(BOUNDARY) else rx})"
            for name, rx in patterns.items()
        )
    )


def secret_detector(patterns: dict[str, str]) -> str:
    """The same patterns as one RE2-friendly alternation (for vectorised pre-filtering)."""
    return "|".join(f"(?:{rx})" for rx in patterns.values())


def redact_text(text: str, rx: re.Pattern, counts: dict[str, int] | None = None) -> str:
    """`text` with every match of `rx` replaced by [REDACTED:<kind>]; `counts` tallies kinds."""

    def _sub(m: re.Match) -> str:
        if counts is not None:
            counts[m.lastgroup] = counts.get(m.lastgroup, 0) + 1
        return REDACTED.format(kind=m.lastgroup)

    return rx.sub(_sub, text)
