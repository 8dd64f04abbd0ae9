"""Ctrl-C and SIGTERM of the long commands themselves (issue 45, deliverable 3 and finding
6): `agentrl tasks check` and `agentrl env eval` on a generated suite and `agentrl tasks
mine` on the fixture library, stopped by SIGINT or SIGTERM to their process group while
they work: exit 130 / 143 within a few seconds, no `agentrl-*` mount left, no process of
their group, no temporary folder (the `agentrl-ws-*` workspaces, `agentrl-verify-*` work
areas and `agentrl-mine-*` folders are removed). `python -m flows.retrain` is
tests/flows/test_retrain_start.py's (slow), `agentrl reproduce`'s rerun
tests/test_reproduce_during_pipeline.py's (slow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_signals import (
    ROOT,
    SIGNALS,
    agentrl_mounts,
    assert_nothing_left,
    start,
    stop,
    unmount_below,
)

AGENTRL = [sys.executable, "-m", "components.cli"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """Enough generated tasks that neither command ends before it is stopped."""
    out = tmp_path_factory.mktemp("suite") / "tasks"
    made = subprocess.run(
        [*AGENTRL, "tasks", "generate", "--out", str(out), "--n", "40", "--seed", "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    return out


def wait_for_a_sandbox(
    tmp: Path,
    budget_s: float = 240,
    prefixes: tuple[str, ...] = ("agentrl-ws-", "agentrl-verify-", "agentrl-mine-"),
) -> None:
    """Until the command has a workspace or a work area (named by one of `prefixes`) in its
    TMPDIR `tmp` (mounted where it may mount): it is in its work."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        names = [p.name for p in tmp.iterdir()]
        if any(n.startswith(prefixes) for n in names):
            time.sleep(1.0)  # a few more start
            return
        time.sleep(0.1)
    pytest.fail(f"no sandbox in {tmp} within {budget_s}s")


COMMANDS = {
    "tasks check": lambda suite, out: [
        "tasks",
        "check",
        "--tasks",
        str(suite),
        "--report",
        str(out / "gate.json"),
    ],
    # its work folder (agentrl-mine-*: the repository's copy, the mutants' trees) first
    "tasks mine": lambda suite, out: [
        "tasks",
        "mine",
        "--repo",
        str(ROOT / "tests" / "fixtures" / "mine_repo"),
        "--out",
        str(out / "mined"),
    ],
    "env eval": lambda suite, out: [
        "env",
        "eval",
        "--tasks",
        str(suite),
        "--policy",
        "oracle",
        "--out",
        str(out / "eval.json"),
        "--quiet",
    ],
}


@pytest.mark.integration  # a suite generated, then sandboxes on a busy machine: a minute each
@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", list(COMMANDS))
@SIGNALS
def test_a_long_command_stopped_in_its_sandboxes_leaves_nothing(suite, tmp_path, command, how):
    argv = [*AGENTRL, *COMMANDS[command](suite, tmp_path)]
    proc = start(argv, tmp_path)
    try:
        wait_for_a_sandbox(tmp_path / "tmp")
        assert proc.poll() is None, "it ended before it was stopped"
        # (mining's first work, the baseline suite, mounts no workspace)
        assert agentrl_mounts(tmp_path) or os.geteuid() != 0 or command == "tasks mine"
        took, rest = stop(proc, how)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            unmount_below(tmp_path)
    assert proc.returncode == 128 + how, rest[-3000:]
    # 2-3 s on this 2-core machine alone; up to 10 s niced beside a running suite
    assert took < 12, f"{took:.1f}s: {rest[-3000:]}"
    name = "interrupted" if how == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == f"agentrl {command}: {name}"
    assert "Traceback" not in rest
    assert_nothing_left(proc, tmp_path)
