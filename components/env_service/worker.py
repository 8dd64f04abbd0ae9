"""One worker process of the environment server: it holds episodes and runs their tools and
verdicts, one request at a time.

The server (components/env_service/pool.py) starts N of these with multiprocessing's spawn
context and talks to each over a pipe: a request is `(op, session_id, body)`, the answer
`("ok", payload)` or `("error", status, message)`. Each worker reads the task suite itself
(from the server's folder, by id; `Suite` reads it again when it changes), keeps its
sessions in memory and writes every temporary folder (workspaces, verifier snapshots)
under a folder of its own, so whoever kills it can remove everything it left. It dies
with its server (PR_SET_PDEATHSIG: SIGTERM), and on SIGTERM, SIGINT or a closed pipe it
frees its sessions' workspaces and its folder before it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from components.env.episode import Action, EpisodeEnv
from components.env_service.protocol import (
    SESSION_UNKNOWN,
    ActionBody,
    CreateRequest,
    FinishRequest,
    StepRequest,
    env_from_settings,
    result_to_dict,
    stuck_flag,
)
from components.sandbox.config import SandboxConfig
from components.tasks.task import Task, load_tasks
from components.typed_config import config_from_dict

_PR_SET_PDEATHSIG = 1


class SessionError(Exception):
    """A request this worker refuses: `status` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _die_with_parent() -> None:
    """SIGTERM when the server process dies, however it dies (SIGKILL included)."""
    # not Linux: no prctl, and the closed pipe still ends the loop
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _episode_state(env: EpisodeEnv, events_from: int) -> dict:
    """What a client mirrors after a request: the events appended since `events_from` and the
    episode's driver-visible state."""
    return {
        "events": env.events[events_from:],
        "done": env.done,
        "end_reason": env.end_reason,
        "steps": env.steps,
        "safety_flags": env.safety_flags,
        "constraint": env.decoding_constraint(),
    }


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class Suite:
    """The task suite in the server's folder, as this worker last read it.

    The folder may be absent or empty when the server starts (a cluster's server starts
    before the flow generates its suite on the shared volume): it is read again before a
    session is created when the folder or its suite.json changed since the last read
    (`tasks generate --overwrite` replaces both), or when the session names an id the last
    read did not hold. An invalid suite is a 500 naming the folder and its first error."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.tasks: dict[str, Task] = {}
        self.read_at: tuple | None = None  # the stamps the last successful read saw

    def _stamps(self) -> tuple:
        return _stamp(self.folder), _stamp(self.folder / "suite.json")

    def read(self) -> None:
        stamps = self._stamps()  # before reading: a change made while it reads is seen next
        tasks, errors = load_tasks(self.folder) if self.folder.is_dir() else ([], [])
        if errors:
            raise SessionError(500, f"invalid task in {self.folder}: {errors[0]}")
        self.tasks, self.read_at = {t.id: t for t in tasks}, stamps

    def get(self, task_id: str) -> Task:
        if task_id not in self.tasks or self._stamps() != self.read_at:
            self.read()
        task = self.tasks.get(task_id)
        if task is None:  # the id is the only thing a client says about a task
            raise SessionError(
                404,
                f"unknown task {task_id!r} in the server's suite "
                f"({self.folder}: {len(self.tasks)} tasks)",
            )
        return task


class Sessions:
    """The episodes one worker holds, by session id."""

    def __init__(self, suite: Suite, sandbox: SandboxConfig) -> None:
        self.suite, self.sandbox = suite, sandbox
        self.open: dict[str, EpisodeEnv] = {}

    def handle(self, op: str, session_id: str, body: dict) -> dict:
        if op == "create":
            return self.create(session_id, CreateRequest(**body))
        if op == "close":
            self.close(session_id)
            return {}
        env = self.open.get(session_id)
        if env is None:
            raise SessionError(SESSION_UNKNOWN, f"unknown session {session_id!r}")
        if op == "step":
            return self.step(env, StepRequest(**body))
        if op == "finish":
            return self.finish(session_id, env, FinishRequest(**body))
        raise SessionError(400, f"unknown operation {op!r}")

    def create(self, session_id: str, request: CreateRequest) -> dict:
        task = self.suite.get(request.task_id)
        try:
            env_config = env_from_settings(request.env)
        except ValueError as e:
            raise SessionError(422, str(e)) from None
        env = EpisodeEnv(
            task,
            env_config,
            self.sandbox,
            policy_name=request.policy_name,
            episode_id=request.episode_id,
            max_wall_s=request.max_wall_s,
            source=request.source,
        )
        self.open[session_id] = env
        return {**_episode_state(env, 0), "suite_tasks": len(self.suite.tasks)}

    def step(self, env: EpisodeEnv, request: StepRequest) -> dict:
        before = len(env.events)
        action: ActionBody = request.action
        env.step(
            Action(
                action.tool, action.arguments, action.content, action.parse_error, action.imitate
            ),
            token_ids=request.token_ids,
            logprobs=request.logprobs,
            completion=request.completion,
            prompt_tokens=request.prompt_tokens,
        )
        return _episode_state(env, before)

    def finish(self, session_id: str, env: EpisodeEnv, request: FinishRequest) -> dict:
        """The verdict, reward and record, computed here; the session is gone afterwards. A
        verifier crash is an infra failure, as in the rollout engine's `_finish`."""
        del self.open[session_id]
        if request.stuck_after_s is not None and not env.done:
            env.safety_flags.append(stuck_flag(env.steps, request.stuck_after_s))
        if request.stop_reason is not None:
            env.stop(request.stop_reason)
        if request.abort:
            env.abort(request.abort)
        start = time.monotonic()
        try:
            result = env.finish(num_tokens=request.num_tokens)
        except Exception as exc:  # noqa: BLE001 - a harness fault is data, not a crash
            env.abort(f"verification failed: {exc!r}")
            result = env.finish(num_tokens=request.num_tokens)
        return {"result": result_to_dict(result), "verdict_s": time.monotonic() - start}

    def close(self, session_id: str) -> None:
        env = self.open.pop(session_id, None)
        if env is not None:
            env.workspace.cleanup()

    def close_all(self) -> None:
        for session_id in list(self.open):
            self.close(session_id)


def worker_main(conn, tasks_dir: str, sandbox_values: dict, tmp_dir: str) -> None:
    """The worker's loop (a spawned process's target): answer requests until the pipe
    closes or SIGTERM; everything under `tmp_dir` is removed on the way out."""
    _die_with_parent()
    # SIGTERM (its server's stop) and SIGINT (a Ctrl-C reaches the terminal's whole process
    # group, workers included): a quiet exit through the `finally` below, no traceback
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    Path(tmp_dir).mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = tmp_dir  # workspaces, snapshots: all below it
    sessions = None
    try:
        suite = Suite(tasks_dir)
        try:
            suite.read()  # absent or empty: ready with 0 tasks, read again on a create
        except SessionError as e:
            conn.send(("error", e.status, str(e)))
            return
        sandbox = config_from_dict(SandboxConfig, sandbox_values, "env serve: sandbox")
        sessions = Sessions(suite, sandbox)
        conn.send(("ok", {"tasks": len(suite.tasks), "pid": os.getpid()}))
        while True:
            try:
                op, session_id, body = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = ("ok", sessions.handle(op, session_id, body))
            except SessionError as e:
                reply = ("error", e.status, str(e))
            except ValueError as e:  # a body pydantic refused
                reply = ("error", 422, " ".join(str(e).split())[:500])
            except Exception as e:  # noqa: BLE001 - a tool crash: the client aborts the episode
                reply = ("error", 500, f"{type(e).__name__}: {e}"[:500])
            conn.send(reply)
    finally:
        if sessions is not None:
            sessions.close_all()
        shutil.rmtree(tmp_dir, ignore_errors=True)
