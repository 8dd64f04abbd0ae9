"""`ast.parse` that is safe to call from several threads at once.

The task gate, rescoring and pooled episodes parse Python in worker threads. CPython 3.11
keeps the AST constructor's recursion depth in one per-interpreter state, and two threads
converting trees at the same time can corrupt it: `SystemError: AST constructor recursion
depth mismatch` (python/cpython#106905), which made the gate refuse a sound task at random.
One lock around the conversion removes that; parsing is a small share of any stage's time.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename, mode)
