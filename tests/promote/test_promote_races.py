"""Promotion under real concurrency and real kills (slow tier; issue 18).

Processes come from a fork server (promote_driver.py) so they start their decisions
together and a SIGKILL lands inside a decision. After every trial:
- the audit chain verifies and, once the next command has completed a decision a kill
  left half done, the registry's champion/challenger are the ones the audit log records;
- the story is consistent: a version is approved only right after its own request
  (never after it was superseded, never twice);
- nothing is stuck: rollback or re-approve still works.

PROMOTE_TRIALS (default 5) sets the race trials, PROMOTE_KILLS (default 10) the kills per
command; the issue's acceptance run is PROMOTE_KILLS=100.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
from promote_helpers import candidate

from components.promote import audit, chain
from components.promote.approval import approve, rollback
from components.promote.audit import read_history
from components.promote.client import mlflow_client, reserved
from components.promote.lock import promotion_lock
from components.promote.registry import get_alias, get_aliases

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
TRIALS = int(os.environ.get("PROMOTE_TRIALS", "5"))
KILLS = int(os.environ.get("PROMOTE_KILLS", "10"))
CALIBRATE = 3


class ForkServer:
    def __init__(self, tmp_path: Path):
        self.stderr = tmp_path / "driver.err"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "promote_driver.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr.open("w"),
            text=True,
        )

    def _read(self, key: str) -> list[int]:
        line = self.proc.stdout.readline()
        assert line, f"fork server died: {self.stderr.read_text()[-2000:]}"
        return json.loads(line)[key]

    def start(self, ops: list[dict], start_in: float = 0.0) -> list[int]:
        self.proc.stdin.write(json.dumps({"ops": ops, "start_at": time.time() + start_in}) + "\n")
        self.proc.stdin.flush()
        return self._read("pids")

    def wait(self) -> list[int]:
        return self._read("exits")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path):
    s = ForkServer(tmp_path)
    yield s
    s.close()


def settle(cfg) -> list[str]:
    """What the next command does first (complete a decision a kill left half done), then
    check the invariants; returns the notes seen before settling."""
    problems, notes = audit.verify_log(cfg, aliases=get_aliases(cfg))
    assert problems == [], problems
    with promotion_lock(cfg):
        audit.reconcile(cfg, mlflow_client(cfg))
    assert audit.verify_log(cfg, aliases=get_aliases(cfg)) == ([], [])
    assert audit.audit_aliases(chain.scan(Path(cfg.audit_path), cfg.model_name)) == reserved(
        get_aliases(cfg)
    )
    assert_story(cfg)
    return notes


def assert_story(cfg) -> None:
    last: dict[str, str] = {}
    for rec in read_history(cfg):
        version, action = rec["version"], rec["action"]
        if action == "approved":
            assert last.get(version) == "challenger_set", (version, last.get(version))
        if action in ("challenger_set", "superseded", "approved", "rejected", "rolled_back"):
            last[version] = action


@pytest.mark.timeout(60 + 20 * TRIALS)
def test_two_approvals_at_once(cfg, checkpoint, server):
    first, _ = candidate(cfg, checkpoint)
    approve(first, "alice", "first", config=cfg)
    config = asdict(cfg)
    for trial in range(TRIALS):
        version, _ = candidate(cfg, checkpoint, n=trial + 2)
        ops = [{"op": "approve", "config": config, "version": version, "actor": who}
               for who in ("racer-a", "racer-b")]  # fmt: skip
        server.start(ops, start_in=0.2)
        assert sorted(server.wait()) == [0, 1], server.stderr.read_text()[-2000:]
        assert get_alias("champion", cfg) == version
        assert len(read_history(cfg, version=version, action="approved")) == 1
        settle(cfg)
        assert rollback("ops", "next trial", config=cfg)["version"] == first  # not stuck
    assert len(read_history(cfg, action="refused")) == TRIALS


@pytest.mark.timeout(60 + 20 * TRIALS)
def test_approve_against_request_and_approve(cfg, checkpoint, server):
    first, _ = candidate(cfg, checkpoint)
    approve(first, "alice", "first", config=cfg)
    config, rng, won = asdict(cfg), random.Random(0), Counter()
    for trial in range(TRIALS):
        pending, _ = candidate(cfg, checkpoint, n=100 + trial)
        ops = [
            # the request registers first (~1 s): a delay this wide gives both orders
            {"op": "approve", "config": config, "version": pending, "delay_s": rng.uniform(0, 3)},
            {"op": "request_and_approve", "config": config, "checkpoint": str(checkpoint),
             "n": 200 + trial},
        ]  # fmt: skip
        server.start(ops, start_in=0.2)
        exits = server.wait()
        assert exits[1] == 0 and exits[0] in (0, 1), server.stderr.read_text()[-2000:]
        won["approve first" if exits[0] == 0 else "request first"] += 1
        settle(cfg)
        newest = read_history(cfg, action="approved")[-1]["version"]
        assert get_alias("champion", cfg) == newest and newest != pending
        rollback("ops", "next trial", config=cfg)  # not stuck
        settle(cfg)
    print(f"approve vs request-and-approve, {TRIALS} trials: {dict(won)}")


def _started(server, op: dict) -> tuple[int, float]:
    """Fork `op` and wait until its child has opened the store: (pid, when it started its
    decision), so the kill lands in the decision, not in connecting."""
    ready = Path(op["ready"])
    ready.unlink(missing_ok=True)
    pid = server.start([op])[0]
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, server.stderr.read_text()[-2000:]
        time.sleep(0.002)
    return pid, time.monotonic()


@pytest.mark.timeout(120 + 15 * KILLS)
@pytest.mark.parametrize("command", ["approve", "rollback"])
def test_random_kills_leave_promotion_on_record(command, cfg, checkpoint, server, tmp_path):
    """SIGKILL `command` at a random point of its decision, KILLS times; then the next
    command completes it or it never happened, and the invariants hold."""
    rng, outcomes, config = random.Random(int(os.environ.get("PROMOTE_KILL_SEED", "0"))), Counter(), asdict(cfg)  # fmt: skip
    champion, _ = candidate(cfg, checkpoint)
    approve(champion, "alice", "first", config=cfg)
    runs: list[float] = []  # un-killed decisions size the window: the median of CALIBRATE
    for trial in range(KILLS + CALIBRATE):
        target, _ = candidate(cfg, checkpoint, n=trial + 2)
        if command == "rollback":
            approve(target, "bob", "to be rolled back", config=cfg)
        op = {"op": command, "config": config, "version": target, "ready": str(tmp_path / "go")}
        pid, started = _started(server, op)
        if trial < CALIBRATE:
            assert server.wait() == [0], server.stderr.read_text()[-2000:]
            runs.append(time.monotonic() - started)
            window = sorted(runs)[len(runs) // 2]
        else:
            time.sleep(rng.uniform(0, window))
            with contextlib.suppress(ProcessLookupError):  # it finished and was reaped
                os.kill(pid, signal.SIGKILL)
            exits = server.wait()
            assert exits[0] in (0, -9), server.stderr.read_text()[-2000:]
            outcomes[_outcome(cfg, command, target, exits[0])] += 1
        settle(cfg)
        _recover(cfg, command, target, champion)
        if command == "approve" and get_alias("champion", cfg) == target:
            champion = target
    print(f"{KILLS} kills of {command} within {window:.2f} s: {dict(outcomes)}")
    assert sum(outcomes.values()) == KILLS


def _outcome(cfg, command: str, target: str, exit_code: int) -> str:
    notes = audit.verify_log(cfg, aliases=get_aliases(cfg))[1]
    action = "approved" if command == "approve" else "rolled_back"
    recorded = any(
        r["action"] == action
        and (r["version"] == target or r.get("evidence", {}).get("rolled_back_from") == target)
        for r in read_history(cfg)
    )
    if exit_code == 0:
        return "finished before the kill"
    if any("was interrupted" in n for n in notes):
        return "killed after its record: completed by the next command"
    return "killed after its record, applied" if recorded else "killed before its record"


def _recover(cfg, command: str, target: str, champion: str) -> None:
    """The state is the one the audit log says; the next decision works."""
    if command == "approve":
        if read_history(cfg, version=target, action="approved"):
            assert get_alias("champion", cfg) == target
            assert rollback("ops", "after the kill", config=cfg)["version"] == champion
        else:
            assert get_alias("champion", cfg) == champion
            approve(target, "alice", "again after the kill", config=cfg)
    else:
        rolled = [r for r in read_history(cfg, action="rolled_back")
                  if r["evidence"]["rolled_back_from"] == target]  # fmt: skip
        if not rolled:
            assert get_alias("champion", cfg) == target
            rollback("ops", "again after the kill", config=cfg)
        assert get_alias("champion", cfg) == champion
    settle(cfg)
