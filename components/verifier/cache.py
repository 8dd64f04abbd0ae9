"""The process-global verdict cache: GRPO groups and fix searches re-verify identical trees.

Verdicts are kept by (task, hash of the final tree, settings, verifier version); the tree's
hash length-prefixes every entry's path, kind, mode and content (snapshot.py,
`Snapshot.digest`), so two trees never share it. Only verdicts that do not depend on timing
are kept (verdict.py decides), at most VERDICT_CACHE_SIZE, least recently used first out.
The control's outcome (does the untouched repository get a verdict?) is kept per task and
settings, and only when it did. Threads share both (verifications run in a pool).
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

from components.verifier.verification import Verification

VERDICT_CACHE_SIZE = 4096

_CONTROLS: dict[tuple[str, str], str] = {}
_VERDICTS: OrderedDict[tuple[str, str, str, str], Verification] = OrderedDict()
_LOCK = threading.Lock()
_STATS = {"hits": 0, "misses": 0}


def cached_verdict(key: tuple[str, str, str, str]) -> Verification | None:
    """A copy of the verdict kept for `key` (None: none), counted as a hit or a miss."""
    with _LOCK:
        hit = _VERDICTS.get(key)
        if hit is not None:
            _VERDICTS.move_to_end(key)
        _STATS["hits" if hit is not None else "misses"] += 1
    return copy.deepcopy(hit)


def keep_verdict(key: tuple[str, str, str, str], v: Verification) -> None:
    with _LOCK:
        _VERDICTS[key] = copy.deepcopy(v)
        while len(_VERDICTS) > VERDICT_CACHE_SIZE:
            _VERDICTS.popitem(last=False)


def cached_control(key: tuple[str, str]) -> str | None:
    """The control's outcome kept for `key`: "" (it got a verdict), or None when none was
    kept (a control without a verdict is tried again)."""
    with _LOCK:
        return _CONTROLS.get(key)


def keep_control(key: tuple[str, str], lost: str) -> None:
    with _LOCK:
        _CONTROLS[key] = lost


def verdict_cache_info() -> dict[str, int]:
    """Hits and misses of the verdict cache since the last clear, and its size."""
    with _LOCK:
        return {**_STATS, "size": len(_VERDICTS)}


def clear_verdict_cache() -> None:
    with _LOCK:
        _VERDICTS.clear()
        _CONTROLS.clear()
        _STATS.update(hits=0, misses=0)
