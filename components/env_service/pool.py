"""The environment server's worker processes: sessions pinned to workers, a bounded queue,
per-request timeouts, and a dead or stuck worker replaced with nothing left behind.

A session lives on the worker that created it (the one with the fewest sessions). A
worker answers one request at a time; a request waits for its worker at most the request
timeout, and no more than `max_queue` requests wait in all (more are refused with 503:
the client tries again). A request the worker does not answer within the timeout kills
that worker (its process and every process below it), removes its temporary folder
(workspaces, verifier snapshots) and starts a fresh one: its sessions are lost (410), and
each client replays its episode on a new session or records an infra failure. A worker
that died on its own is found and replaced the same way on the next request to it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from components.env_service.protocol import BUSY, SESSION_LOST, SESSION_UNKNOWN, TIMED_OUT
from components.env_service.worker import SessionError, worker_main
from components.runtime import descendants, remove_until_gone


@dataclass
class _Worker:
    index: int
    generation: int
    process: multiprocessing.process.BaseProcess
    conn: object
    tmp_dir: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: int = 0


@dataclass
class PoolMetrics:
    """Counters the server's /metrics reports."""

    started: float = field(default_factory=time.monotonic)
    sessions_created: int = 0
    sessions_finished: int = 0
    steps: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=10_000))  # monotonic stamps
    verdict_s: deque = field(default_factory=lambda: deque(maxlen=1_000))
    waiting: int = 0  # requests waiting for their worker: the queue depth
    refused_busy: int = 0
    timeouts: int = 0
    worker_restarts: int = 0


class WorkerPool:
    """N worker processes and the sessions on them (module docstring)."""

    def __init__(
        self,
        size: int,
        tasks_dir: str | Path,
        sandbox_values: dict,
        tmp_root: str,
        request_timeout_s: float,
        max_queue: int,
    ) -> None:
        self.tasks_dir, self.sandbox_values = str(tasks_dir), dict(sandbox_values)
        self.tmp_root = tmp_root
        self.request_timeout_s, self.max_queue = request_timeout_s, max_queue
        self.context = multiprocessing.get_context("spawn")
        self.metrics = PoolMetrics()
        self.sessions: dict[str, tuple[int, int]] = {}  # session -> (worker, generation)
        self.guard = threading.Lock()  # sessions, metrics, workers list
        self.workers = [self._spawn(i, 0) for i in range(size)]
        self.tasks = 0
        for w in self.workers:
            self.tasks = self._await_ready(w)

    def _spawn(self, index: int, generation: int) -> _Worker:
        tmp_dir = os.path.join(self.tmp_root, f"worker-{index}-{generation}")
        parent, child = self.context.Pipe()
        process = self.context.Process(
            target=worker_main,
            args=(child, self.tasks_dir, self.sandbox_values, tmp_dir),
            name=f"agentrl-env-worker-{index}",
            daemon=True,
        )
        process.start()
        child.close()
        return _Worker(index, generation, process, parent, tmp_dir)

    def _await_ready(self, worker: _Worker, budget_s: float = 120.0) -> int:
        if not worker.conn.poll(budget_s):
            raise RuntimeError(f"env worker {worker.index} did not start within {budget_s:g} s")
        reply = worker.conn.recv()
        if reply[0] != "ok":
            raise RuntimeError(f"env worker {worker.index}: {reply[2]}")
        return reply[1]["tasks"]

    def ready(self) -> bool:
        return all(w.process.is_alive() for w in self.workers)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def worker_of(self, session_id: str) -> int | None:
        """The index of the worker holding `session_id` (None: unknown)."""
        with self.guard:
            pinned = self.sessions.get(session_id)
        return None if pinned is None else pinned[0]

    def create(self, body: dict) -> dict:
        with self.guard:
            worker = min(self.workers, key=lambda w: w.sessions)
            session_id = secrets.token_hex(12)
            self.sessions[session_id] = (worker.index, worker.generation)
            worker.sessions += 1
        try:
            state = self._call(worker, "create", session_id, body)
        except SessionError:
            self._forget(session_id)
            raise
        with self.guard:
            self.metrics.sessions_created += 1
            self.tasks = state.pop("suite_tasks", self.tasks)  # as its worker last read them
        return {
            "session": session_id,
            "worker": worker.index,
            "request_timeout_s": self.request_timeout_s,
            **state,
        }

    def request(self, session_id: str, op: str, body: dict) -> dict:
        """`op` on a session: its worker's answer, or SessionError (404 unknown, 410 lost
        with its worker, 503 busy, 504 timed out)."""
        with self.guard:
            pinned = self.sessions.get(session_id)
            worker = None if pinned is None else self.workers[pinned[0]]
        if pinned is None:
            raise SessionError(SESSION_UNKNOWN, f"unknown session {session_id!r}")
        if worker.generation != pinned[1]:
            self._forget(session_id)
            raise SessionError(SESSION_LOST, f"session {session_id} lost: its worker was replaced")
        if op in ("finish", "close"):
            self._forget(session_id)  # gone whatever the answer: a retry replays the episode
        reply = self._call(worker, op, session_id, body)
        with self.guard:
            if op == "step":
                self.metrics.steps += 1
                self.metrics.step_times.append(time.monotonic())
            elif op == "finish":
                self.metrics.sessions_finished += 1
                self.metrics.verdict_s.append(reply["verdict_s"])
        return reply

    def _forget(self, session_id: str) -> None:
        with self.guard:
            pinned = self.sessions.pop(session_id, None)
            if pinned is not None and self.workers[pinned[0]].generation == pinned[1]:
                self.workers[pinned[0]].sessions -= 1

    def _call(self, worker: _Worker, op: str, session_id: str, body: dict) -> dict:
        with self.guard:
            if self.metrics.waiting >= self.max_queue:
                self.metrics.refused_busy += 1
                raise SessionError(BUSY, f"queue full ({self.max_queue} requests waiting)")
            self.metrics.waiting += 1
        try:
            acquired = worker.lock.acquire(timeout=self.request_timeout_s)
        finally:
            with self.guard:
                self.metrics.waiting -= 1
        if not acquired:
            raise SessionError(BUSY, f"worker {worker.index} busy for {self.request_timeout_s:g} s")
        try:
            if self.workers[worker.index] is not worker:  # replaced while this one waited
                raise SessionError(SESSION_LOST, f"session {session_id} lost: its worker died")
            if not worker.process.is_alive():
                self._replace(worker)
                raise SessionError(SESSION_LOST, f"session {session_id} lost: its worker died")
            worker.conn.send((op, session_id, body))
            if not worker.conn.poll(self.request_timeout_s):
                self._replace(worker)
                with self.guard:
                    self.metrics.timeouts += 1
                raise SessionError(
                    TIMED_OUT,
                    f"{op} took longer than {self.request_timeout_s:g} s; the worker was replaced",
                )
            reply = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._replace(worker)
            raise SessionError(
                SESSION_LOST, f"session {session_id} lost: its worker died"
            ) from None
        finally:
            worker.lock.release()
        if reply[0] != "ok":
            raise SessionError(reply[1], reply[2])
        return reply[1]

    def _replace(self, worker: _Worker) -> None:
        """Kill `worker` and everything below it, remove its folder, start its successor
        (the caller holds the worker's lock)."""
        with self.guard:
            if self.workers[worker.index] is not worker:
                return  # already replaced
        _kill_tree(worker.process.pid)
        worker.process.join(timeout=5)
        worker.conn.close()
        remove_until_gone(worker.tmp_dir)
        fresh = self._spawn(worker.index, worker.generation + 1)
        self._await_ready(fresh)
        with self.guard:
            self.workers[worker.index] = fresh
            self.metrics.worker_restarts += 1  # its sessions' generation is gone: 410 now

    def snapshot(self) -> dict:
        """The /metrics document."""
        now = time.monotonic()
        with self.guard:
            m = self.metrics
            recent = [t for t in m.step_times if now - t <= 60.0]
            window = min(60.0, max(1e-9, now - m.started))
            verdicts = sorted(m.verdict_s)
            return {
                "workers": len(self.workers),
                "worker_pids": self.worker_pids(),
                "tasks": self.tasks,
                "sessions_open": len(self.sessions),
                "sessions_created": m.sessions_created,
                "sessions_finished": m.sessions_finished,
                "steps_total": m.steps,
                "steps_per_s": round(len(recent) / window, 3),
                "queue_depth": m.waiting,
                "queue_limit": self.max_queue,
                "refused_busy": m.refused_busy,
                "request_timeouts": m.timeouts,
                "worker_restarts": m.worker_restarts,
                "verdict_s_mean": round(sum(verdicts) / len(verdicts), 4) if verdicts else None,
                "verdict_s_p95": verdicts[int(0.95 * (len(verdicts) - 1))] if verdicts else None,
            }

    def close(self) -> None:
        """Stop every worker (each frees its sessions and folder on SIGTERM)."""
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
        for w in self.workers:
            w.process.join(timeout=10)
            if w.process.is_alive():
                _kill_tree(w.process.pid)
            remove_until_gone(w.tmp_dir)


def _kill_tree(pid: int | None) -> None:
    """SIGKILL `pid` and its descendants (sandboxed commands run in sessions of their own,
    out of reach of a process-group kill)."""
    if pid is None:
        return
    for target in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)
