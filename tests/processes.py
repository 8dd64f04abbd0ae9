"""Helpers for tests that stop a command the way a terminal does."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """`preexec_fn` for a child that a test will Ctrl-C: SIGINT at its default, as in a
    terminal. A test run started in the background (`cmd &`, nohup) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
