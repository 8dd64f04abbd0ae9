"""Seeds derived from a base seed and a position: the same (seed, parts) always gives the
same 32-bit seed, so a resumed or repeated run replays its draws exactly."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *parts: object) -> int:
    """A 32-bit seed for the draw named by `parts` (e.g. ("sample", iteration)) of run `seed`."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little")
