"""The one client of the environment server: the rollout engine, the evaluator (and whoever
else drives episodes) use it when the preset names a server (`env.remote`).

`open_episode` is the seam: it returns an in-process `EpisodeEnv` when `env.remote` is empty
(the embedded default) and a `RemoteEpisode` otherwise. A `RemoteEpisode` has the driver's
side of `EpisodeEnv` (`step`, `stop`, `abort`, `finish`, `done`, `events`, `steps`,
`safety_flags`, `tools`, `decoding_constraint()`), so the engine's loop is the same either
way; its tool set here is only the spec (prompt, decoding constraint): nothing in this
process runs a tool or a verifier. The server sends back the events it appended, and on
finish the result it computed, record and signature included.

Faults, never charged to the agent: a session the server lost (its worker died: 410, or the
server restarted: 404, or a connection that broke mid-request) is replayed once on a new
session, i.e. on another worker, by sending the same create and steps again; a replay whose
observations differ from the first run's (numbers aside: test timings vary) ends the episode
as an infra failure. A refused connection or a full queue (503) is retried with backoff for
`connect_budget_s`; a request the server timed out (504), a client-side timeout (the
server's request timeout plus a margin: the trainer never waits without bound), or a server
still unreachable after the budget ends the episode as an infra failure (status
"infra_failure", reward None), built here when the server cannot build it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from components.env.config import EnvConfig
from components.env.episode import (
    END_REASONS,
    Action,
    EpisodeEnv,
    EpisodeResult,
    episode_id_for,
    initial_message,
    run_episode,
)
from components.env.tool_sets import tool_set
from components.env_service.local import LOCAL, remote_url
from components.env_service.protocol import (
    BUSY,
    LOST_STATUSES,
    CreateRequest,
    FinishRequest,
    StepRequest,
    env_settings,
    result_from_dict,
)
from components.sandbox.config import SandboxConfig
from components.tasks.task import Task

_STUCK_LIMIT = re.compile(r"step limit of ([0-9.eE+-]+) s")
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


class EnvServiceError(RuntimeError):
    """The server could not answer (unreachable, timed out, refused): an infra fault."""


class SessionLost(EnvServiceError):
    """The server no longer holds the session: replay it on a new one."""


class Unreachable(EnvServiceError):
    """No answer at all (refused past the budget, or none within the timeout): the episode
    does not wait for the server again."""


@dataclass
class EnvClient:
    """HTTP to one server: retries what may be retried (module docstring), one line per
    error otherwise."""

    url: str
    connect_budget_s: float = 30.0
    create_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.http = httpx.Client(
            timeout=self.create_timeout_s, limits=httpx.Limits(max_connections=256)
        )

    def post(self, path: str, body: dict, timeout_s: float) -> dict:
        deadline, delay = time.monotonic() + self.connect_budget_s, 0.05
        while True:
            try:
                response = self.http.post(self.url + path, json=body, timeout=timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if time.monotonic() >= deadline:
                    raise Unreachable(f"{self.url} unreachable: {e}") from None
            except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                # the request may have been applied: only a replay on a new session is safe
                raise SessionLost(f"{self.url}{path}: connection broke ({e})") from None
            except httpx.TimeoutException:
                raise Unreachable(f"{self.url}{path}: no answer within {timeout_s:g} s") from None
            else:
                if response.status_code == 200:
                    return response.json()
                message = _message(response)
                if response.status_code in LOST_STATUSES and "/sessions/" in path:
                    raise SessionLost(message)
                if response.status_code != BUSY or time.monotonic() >= deadline:
                    raise EnvServiceError(f"{path}: {response.status_code} {message}")
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    def delete(self, path: str) -> None:
        """Best effort: the server frees the session's workspace (a lost one is gone anyway)."""
        with contextlib.suppress(httpx.HTTPError):
            self.http.delete(self.url + path, timeout=5.0)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


_CLIENTS: dict[str, EnvClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(url: str) -> EnvClient:
    """One client (one connection pool) per server URL in this process."""
    with _CLIENTS_LOCK:
        if url not in _CLIENTS:
            _CLIENTS[url] = EnvClient(url)
        return _CLIENTS[url]


def _comparable(events: Sequence[dict]) -> list[tuple]:
    """What a replay must reproduce: roles, errors and observations with numbers masked."""
    return [
        (
            e.get("role"),
            bool(e.get("error")),
            _NUMBERS.sub("#", str(e.get("observation", e.get("content", "")))),
        )
        for e in events
    ]


class RemoteEpisode:
    """An episode run by the environment server, driven like an `EpisodeEnv` (module
    docstring). `sandbox` is accepted for the same signature: the server's own applies."""

    # long: EpisodeEnv's signature, so the seam swaps one for the other
    def __init__(
        self,
        task: Task,
        env: EnvConfig,
        sandbox: SandboxConfig | None = None,
        *,
        policy_name: str,
        episode_id: str | None = None,
        max_wall_s: float | None = None,
        source: str = "rollout",
        client: EnvClient | None = None,
        retries: int = 1,
    ) -> None:
        self.task, self.env, self.policy_name, self.source = task, env, policy_name, source
        self.client = client or client_for(remote_url(env.remote, task, sandbox))
        self.retries = retries
        self.tools = tool_set(env.tool_set)  # the spec only: prompt and decoding constraint
        self.episode_id = episode_id or f"{policy_name}-{task.id}"
        self.create_body = CreateRequest(
            task_id=task.id,
            env=env_settings(env),
            policy_name=policy_name,
            episode_id=self.episode_id,
            max_wall_s=max_wall_s,
            source=source,
        ).model_dump()
        self.step_bodies: list[dict] = []  # what a replay sends again
        self.events: list[dict] = []
        self.steps, self.done, self.end_reason, self.infra_detail = 0, False, "", ""
        self.safety_flags: list[dict] = []
        self.server_flags = 0  # safety_flags[:server_flags] are the server's
        self.stop_reason: str | None = None
        self.constraint = None
        self.session: str | None = None
        self.unreachable = False  # set once a request got no answer at all
        self.worker: int | None = None
        self.request_timeout_s = self.client.create_timeout_s
        self.started = time.monotonic()
        try:
            self._open()
        except EnvServiceError as e:
            self.events = [
                {"role": "user", "content": initial_message(task), "tool_set": self.tools.name}
            ]
            self.abort(f"environment server: {e}")

    def _open(self) -> None:
        reply = self.client.post("/sessions", self.create_body, self.client.create_timeout_s)
        self.session = reply["session"]
        self.worker = reply["worker"]  # which worker holds it (the fault tests kill it)
        # the server's own bound, doubled for the wait for a worker, plus a margin
        self.request_timeout_s = 2 * float(reply["request_timeout_s"]) + 10.0
        self.events = []
        self._mirror(reply)

    def _mirror(self, state: dict) -> None:
        driver_flags = self.safety_flags[self.server_flags :]
        self.events += state["events"]
        self.steps, self.constraint = state["steps"], state["constraint"]
        self.safety_flags = [*state["safety_flags"], *driver_flags]
        self.server_flags = len(state["safety_flags"])
        if state["done"] and not self.done:
            self.done, self.end_reason = True, state["end_reason"]

    def _replay(self) -> None:
        """The episode again on a new session: the same create and steps (module docstring)."""
        if self.session is not None:
            self.client.delete(f"/sessions/{self.session}")
        seen = _comparable(self.events)
        done, end_reason = self.done, self.end_reason
        self.done, self.safety_flags, self.server_flags = (
            False,
            self.safety_flags[self.server_flags :],
            0,
        )
        self._open()
        for body in self.step_bodies:
            self._mirror(
                self.client.post(f"/sessions/{self.session}/step", body, self.request_timeout_s)
            )
        if _comparable(self.events) != seen:
            raise EnvServiceError("replay on a new session diverged from the first run")
        self.done = self.done or done
        self.end_reason = self.end_reason or end_reason

    def _request(self, op: str, body: dict) -> dict:
        """`op` on this episode's session; a lost session is replayed on a new one first
        (at most `retries` times)."""
        for attempt in range(self.retries + 1):
            try:
                if self.unreachable:
                    raise Unreachable("the server did not answer an earlier request")
                if attempt:
                    self._replay()
                return self.client.post(
                    f"/sessions/{self.session}/{op}", body, self.request_timeout_s
                )
            except SessionLost:
                if attempt == self.retries:
                    raise
            except Unreachable:
                self.unreachable = True
                raise
        raise AssertionError("the loop returns or raises")

    def stop(self, reason: str) -> None:
        if reason not in END_REASONS:
            raise ValueError(f"unknown end reason {reason!r} (one of {', '.join(END_REASONS)})")
        if not self.done:
            self.done, self.end_reason, self.stop_reason = True, reason, reason

    def abort(self, detail: str) -> None:
        self.done = True
        self.infra_detail = self.infra_detail or detail or "aborted"

    def decoding_constraint(self):
        return self.constraint

    # long: EpisodeEnv.step's keyword arguments, sent as they are
    def step(
        self,
        action: Action,
        *,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        completion: str | None = None,
        prompt_tokens: int | None = None,
    ) -> dict:
        """Apply one action on the server; the environment event it appended. An error is
        raised (the driver aborts the episode: an infra failure, as for a tool crash)."""
        if self.done:
            raise RuntimeError(f"episode {self.episode_id} is already over")
        body = StepRequest(
            action=dataclasses.asdict(action),
            token_ids=token_ids,
            logprobs=logprobs,
            completion=completion,
            prompt_tokens=prompt_tokens,
        ).model_dump()
        reply = self._request("step", body)
        self.step_bodies.append(body)
        self._mirror(reply)
        return reply["events"][-1]

    def finish(self, *, num_tokens: int | None = None) -> EpisodeResult:
        """The server's result (verdict, reward, signed record); an infra failure when the
        server cannot give one."""
        if not self.done:
            self.stop("max_steps")
        stuck = [
            float(m[1])
            for f in self.safety_flags[self.server_flags :]
            if (m := _STUCK_LIMIT.search(f.get("reason", "")))
        ]
        body = FinishRequest(
            stop_reason=self.stop_reason,
            stuck_after_s=stuck[0] if stuck else None,
            abort=self.infra_detail[-500:] or None,
            num_tokens=num_tokens,
        ).model_dump()
        if self.session is not None and not self.unreachable:
            try:
                if self.infra_detail:  # no replay for an episode that is over already
                    path = f"/sessions/{self.session}/finish"
                    reply = self.client.post(path, body, self.request_timeout_s)
                else:
                    reply = self._request("finish", body)
                return result_from_dict(reply["result"])
            except EnvServiceError as e:
                self.abort(f"environment server: {e}")
                self.client.delete(f"/sessions/{self.session}")
        return self._infra_result(num_tokens)

    def _infra_result(self, num_tokens: int | None) -> EpisodeResult:
        """An unverified infra failure, shaped as EpisodeEnv._result builds one (no reward)."""
        task = self.task
        record = {
            "schema_version": 1,
            "id": self.episode_id,
            "task_id": task.id,
            "source": self.source,
            "task": task.instruction,
            "trajectory": self.events,
            "reward": None,
            "reward_terms": {},
            "final_diff": None,
            "metadata": {
                "policy": self.policy_name,
                "model_version": None,
                "num_tool_calls": sum(
                    e.get("role") == "assistant" and e.get("action") is not None
                    for e in self.events
                ),
                "num_invalid_calls": 0,
                "num_tokens": num_tokens,
                "split": task.metadata.split,
                "family": task.metadata.family,
                "bug_class": task.metadata.bug_class,
                "task_source": task.metadata.source,
                "end_reason": self.end_reason or "infra_failure",
                "status": "infra_failure",
                "success": False,
                "verifier_version": "",
            },
        }
        return EpisodeResult(
            episode_id=self.episode_id,
            task_id=task.id,
            split=task.metadata.split,
            policy=self.policy_name,
            status="infra_failure",
            end_reason=self.end_reason or "infra_failure",
            success=False,
            reward=None,
            reward_terms={},
            steps=self.steps,
            tool_calls=record["metadata"]["num_tool_calls"],
            invalid_calls=0,
            safety_flags=self.safety_flags,
            ran_tests=False,
            tests_total=0,
            tests_failed=0,
            changed_files=[],
            tampered_files=[],
            wall_s=round(time.monotonic() - self.started, 3),
            infra_detail=self.infra_detail[-500:],
            step_rewards=[],
            record=record,
        )


# components/launch/config.py sets it in a Kubernetes stage outside the sandbox pool.
REQUIRE_ENV_REMOTE = "AGENTRL_REQUIRE_ENV_REMOTE"


class RemoteRequired(ValueError):
    """An in-process episode where this process must not run an agent's action."""


def require_remote_where_asked(env: EnvConfig) -> None:
    """Refuse an in-process episode in a pod that holds what an agent must not reach
    (AGENTRL_REQUIRE_ENV_REMOTE set: a GPU or CPU stage pod outside the sandbox pool)."""
    if os.environ.get(REQUIRE_ENV_REMOTE) and env.remote in ("", LOCAL):
        raise RemoteRequired(
            f"env.remote is {repr(env.remote) if env.remote else 'empty'}, but this stage runs "
            "outside the sandbox pool "
            f"({REQUIRE_ENV_REMOTE}): set env.remote to the environment server "
            "(http://env-service:8100, infra/base/env-service.yaml)"
        )


# long: EpisodeEnv's signature, so the engine's one call site stays one line
def open_episode(
    task: Task,
    env: EnvConfig,
    sandbox: SandboxConfig,
    *,
    policy_name: str,
    episode_id: str | None = None,
    max_wall_s: float | None = None,
    source: str = "rollout",
) -> EpisodeEnv | RemoteEpisode:
    """The episode a driver steps: in this process, or on `env.remote`'s server."""
    require_remote_where_asked(env)
    kind = RemoteEpisode if env.remote else EpisodeEnv
    return kind(
        task,
        env,
        sandbox,
        policy_name=policy_name,
        episode_id=episode_id,
        max_wall_s=max_wall_s,
        source=source,
    )


def run_remote_episode(
    task: Task, policy, env: EnvConfig, *, seed: int = 0, sandbox: SandboxConfig | None = None
) -> EpisodeResult:
    """`run_episode` through the server: one policy on one task to the end; a server fault
    is an infra failure, never raised (`sandbox`: a `local` server's settings)."""
    episode = RemoteEpisode(
        task,
        env,
        sandbox,
        policy_name=policy.name,
        episode_id=episode_id_for(policy.name, task, seed),
        source=getattr(policy, "source", "rollout"),
    )
    while not episode.done:
        action = policy.act(task, episode.events)
        try:
            episode.step(action)
        except EnvServiceError as e:
            episode.abort(f"environment server: {e}")
    return episode.finish()


def play_episode(
    task: Task, policy, env: EnvConfig, sandbox: SandboxConfig, *, seed: int = 0
) -> EpisodeResult:
    """`run_episode` in this process, or through `env.remote`'s server (the safety suite's
    one call): where AGENTRL_REQUIRE_ENV_REMOTE is set, never in this process."""
    require_remote_where_asked(env)
    if env.remote:
        return run_remote_episode(task, policy, env, seed=seed, sandbox=sandbox)
    return run_episode(task, policy, env, sandbox, seed=seed)


def evaluate_remote(
    tasks: list[Task],
    make_policy: Callable,
    env: EnvConfig,
    *,
    workers: int,
    seed: int,
    on_result: Callable | None = None,
    sandbox: SandboxConfig | None = None,
) -> list[EpisodeResult]:
    """`evaluate_policy` through the server: one episode per task, results in task order
    (`sandbox`: a `local` server's settings)."""

    def one(task: Task) -> EpisodeResult:
        result = run_remote_episode(task, make_policy(), env, seed=seed, sandbox=sandbox)
        if on_result is not None:
            on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, tasks))
