"""What the environment server and its client say to each other (components/env_service/).

A session is one episode. `POST /sessions` creates it from a task id and the preset's env
settings (`CreateRequest`): the server reads the task from its own suite, so a client sends
ids, never files. `POST /sessions/{id}/step` applies one action (`StepRequest`) and answers
with the events it appended; `POST /sessions/{id}/finish` (`FinishRequest`) ends it and
answers with the episode's result: verdict, reward and reward breakdown, all computed on the
server, the record signed there. A finish carries no verdict, reward or flag of the
client's beyond what a driver may say about its own episode: the end reason it chose (one of
`END_REASONS`), an infra fault it saw (`abort`: the episode then carries no reward), and
that a step outlived its deadline (`stuck_after_s`: the server records the one
resource-limit flag the in-process engine records then, text and all). Anything else in a
body is refused (pydantic `extra="forbid"`).

Statuses a client acts on: 404 unknown session (a restarted server) and 410 session lost
(its worker died) mean "replay the episode on a new session"; 503 (queue full, not ready)
means "try again shortly"; 504 (the request outlived the server's per-request timeout)
means an infra failure, never the agent's doing.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from components.env.config import EnvConfig
from components.env.episode import END_REASONS, EpisodeResult
from components.typed_config import config_from_dict

SESSION_UNKNOWN = 404
SESSION_LOST = 410
BUSY = 503
TIMED_OUT = 504
LOST_STATUSES = (SESSION_UNKNOWN, SESSION_LOST)
MAX_REASON_CHARS = 500


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateRequest(_Strict):
    task_id: str = Field(min_length=1, max_length=200)
    env: dict = Field(default_factory=dict)  # EnvConfig's fields, `remote` left out
    policy_name: str = Field(min_length=1, max_length=200)
    episode_id: str = Field(min_length=1, max_length=300)
    max_wall_s: float | None = Field(default=None, gt=0)
    source: str = Field(default="rollout", max_length=50)


class ActionBody(_Strict):
    tool: str | None = None
    arguments: dict = Field(default_factory=dict)
    content: str | None = None
    parse_error: str | None = None
    imitate: bool = True


class StepRequest(_Strict):
    action: ActionBody
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    completion: str | None = None
    prompt_tokens: int | None = None


class FinishRequest(_Strict):
    stop_reason: str | None = None  # the driver's end reason (token_limit, time_limit, ...)
    stuck_after_s: float | None = Field(default=None, gt=0)  # a step outlived this deadline
    abort: str | None = Field(default=None, max_length=MAX_REASON_CHARS)  # an infra fault
    num_tokens: int | None = Field(default=None, ge=0)

    def model_post_init(self, _context) -> None:
        if self.stop_reason is not None and self.stop_reason not in END_REASONS:
            raise ValueError(f"stop_reason: one of {', '.join(END_REASONS)}")


def env_settings(env: EnvConfig) -> dict:
    """The env section a create request carries: every field but `remote` (the server runs
    the episode in-process on its side)."""
    values = dataclasses.asdict(env)
    values.pop("remote")
    return values


def env_from_settings(values: dict) -> EnvConfig:
    """The EnvConfig a create request names, checked like a preset's section (one line on a
    bad field); `remote` is refused: a server does not forward episodes."""
    if "remote" in values:
        raise ValueError("env.remote: a session's env settings cannot name another server")
    return config_from_dict(EnvConfig, values, "create request: env")


def result_to_dict(result: EpisodeResult) -> dict:
    return dataclasses.asdict(result)


def result_from_dict(values: dict) -> EpisodeResult:
    return EpisodeResult(**values)


def stuck_flag(steps: int, timeout_s: float) -> dict:
    """The resource-limit flag of an episode whose step outlived the driver's deadline:
    the rollout engine's `_end_stuck` text (components/rollout/engine.py), made here from a
    number so a client never writes a flag's text."""
    return {
        "step": steps,
        "category": "resource_limit",
        "reason": f"a tool call ran past the rollout's step limit of {timeout_s:g} s; the "
        "episode was ended",
    }
