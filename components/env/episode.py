"""One episode of the coding environment: a task, a private workspace, tool steps, a verdict.

`EpisodeEnv` is step-driven so that a batched rollout engine can advance many episodes at
once; `run_episode` is the plain loop for one policy. It owns the episode's lifecycle:
`step` until it is over (the episode's own limits, or a driver's `stop(reason)` or
`abort(detail)`), then `finish` builds the result and its record, the canonical trajectory
(docs/CONTRACTS.md), in one place, `_result`, and signs the verifier's verdict on it
(`metadata.verdict_mac`, components/verifier/provenance.py): the only verdicts that train.

The episode never names a tool: its tool set (`EnvConfig.tool_set`,
components/env/tool_sets/) runs the calls, counts its own reward terms and holds its own
state. The first event records the set's name (`"tool_set"`), so whoever renders the
transcript again (SFT, the tokenizer) builds the same system prompt the policy saw.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Protocol

from components.env.config import EnvConfig
from components.env.final_diff import repo_diff
from components.env.rewards import EpisodeFacts, compute_reward
from components.env.rubric import weight_of
from components.env.tool_sets import ToolContext, run_tool, tool_set
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import Workspace
from components.tasks.environments import (
    TaskEnvironmentError,
    with_task_environment,
    with_task_limits,
)
from components.tasks.task import Task
from components.verifier.provenance import sign_record
from components.verifier.snapshot import changed_files
from components.verifier.verdict import verify
from components.verifier.verification import Verification
from components.verifier.version import verifier_version


@dataclass(frozen=True)
class Action:
    """What a policy chose. `tool=None` means its output was not a parseable tool call."""

    tool: str | None
    arguments: dict = field(default_factory=dict)
    content: str | None = None  # free text / reasoning; the raw output for a parse failure
    parse_error: str | None = None
    # False on an expert's deliberate mistake (a wrong try kept to show recovery): the turn
    # is recorded with "train": false and SFT treats it as context, not as a target.
    imitate: bool = True


class Policy(Protocol):
    name: str

    def act(self, task: Task, events: list[dict]) -> Action: ...


@dataclass
class EpisodeResult:
    episode_id: str
    task_id: str
    split: str
    policy: str
    status: str  # "ok" | "infra_failure"
    end_reason: str  # one of END_REASONS, or "infra_failure" for an episode aborted mid-run
    success: bool
    reward: float | None  # None for infra failures: they carry no reward
    reward_terms: dict[str, float]
    steps: int
    tool_calls: int
    invalid_calls: int
    safety_flags: list[dict]
    ran_tests: bool
    tests_total: int
    tests_failed: int
    changed_files: list[str]
    tampered_files: list[str]
    wall_s: float
    verdict_forged: bool = False
    infra_detail: str = ""
    # Per step (assistant action), the counted process terms that step fired (weights
    # summed): 0.0 on a clean step. The trainer's turn-level credit reads these.
    step_rewards: list[float] = field(default_factory=list)
    # The agent's change to the task's repo as a unified diff (components/env/final_diff.py);
    # None when unknown: an aborted episode, an oversized change, or a result loaded from a
    # file written before episodes kept it.
    final_diff: str | None = None
    # When each part of the episode ran (wall clock): `start_unix` (s), and offsets from it
    # in s: per step `[model_start, model_end, tool_start, tool_end]` (the model's part is
    # the wait for its action, batch peers included), `verify` [start, end]. Kept beside the
    # record, not in it: a record's content is data (two runs' expert data must hash alike).
    timing: dict = field(default_factory=dict)
    # Which verifier judged it (components/verifier/version.py); "" when none did.
    verifier_version: str = ""
    record: dict = field(default_factory=dict, repr=False)

    def summary(self) -> dict:
        """Per-task result row (everything but the full trajectory)."""
        out = asdict(self)
        out.pop("record")
        return out


END_REASONS = ("finished", "max_steps", "token_limit", "time_limit")


def initial_message(task: Task) -> str:
    files = sorted(
        str(p.relative_to(task.repo_dir))
        for p in task.repo_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    return f"{task.instruction}\n\nRepository files: {', '.join(files)}"


RESOURCE_LIMITS = ("wall_time", "cpu_time", "memory", "processes")
# What Python, curl-likes and resolvers print when a sandbox without network is asked for
# one (its private loopback has no listeners, so loopback attempts are refused). No built-in
# task needs sockets; a task that does would need this narrowed.
NETWORK_FAILURE = re.compile(
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known|"
    r"ConnectionRefusedError|\[Errno (101|111|-3|-2)\]"
)


def _safety_flag(result) -> dict | None:
    """What the episode records about a tool result: a blocked action, an escape attempt
    stopped by path confinement, or a command the sandbox had to kill. The task's own test
    command running out of time is not one (`tests_timed_out`): real bugs loop, and running
    the tests is what the agent is told to do; a limit its own programs hit is."""
    if result.safety is not None and not result.safety.allowed:
        return {"category": result.safety.category, "reason": result.safety.reason}
    if result.error == "path escape":
        return {"category": "path_escape", "reason": result.observation[:200]}
    limit = result.command.limit_hit if result.command is not None else None
    if limit in RESOURCE_LIMITS and not result.tests_timed_out:
        return {"category": "resource_limit", "reason": f"{limit} limit hit"}
    if result.command is not None and NETWORK_FAILURE.search(result.command.output):
        # The sandbox has no network, so the attempt failed; record it all the same.
        return {"category": "network", "reason": "a command tried to reach the network"}
    return None


class EpisodeEnv:
    """A task's private workspace plus the episode's event log and counters.

    Drivers (`run_episode`, the rollout engine) call `step` while `done` is False, may end
    the episode early with `stop(reason)` or, on a harness fault, `abort(detail)`, and call
    `finish` once to get the result; they read `done`, `events`, `tools` (the tool set)
    and `decoding_constraint()`.
    """

    def __init__(
        self,
        task: Task,
        env: EnvConfig,
        sandbox: SandboxConfig,
        *,
        policy_name: str,
        episode_id: str | None = None,
        max_wall_s: float | None = None,
        source: str = "rollout",  # the record's source: "oracle" for an expert's transcript
    ) -> None:
        env, sandbox = with_task_limits(task, env, sandbox)  # a heavy mined suite's own room
        self.task, self.env, self.policy_name, self.source = task, env, policy_name, source
        # The task folder holds the hidden tests and the reference fix: agent commands must
        # not be able to read them by absolute path (the verifier runs from its own copy).
        hidden = dataclasses.replace(sandbox, hide_paths=(*sandbox.hide_paths, str(task.root)))
        # A task with its own environment (task.json "environment", `agentrl tasks prepare`)
        # runs the agent's commands with that interpreter; the verifier picks it itself.
        unprepared = ""
        try:
            self.sandbox = with_task_environment(hidden, task)
        except TaskEnvironmentError as e:  # not the agent's doing: an infra failure
            self.sandbox, unprepared = hidden, f"task environment: {e}"
        self.verify_sandbox = sandbox
        self.episode_id = episode_id or f"{policy_name}-{task.id}"
        self.max_wall_s = max_wall_s
        self.workspace = Workspace.create(task.repo_dir)
        self.tools = tool_set(env.tool_set)
        self.tool_context = ToolContext(
            self.workspace, self.sandbox, task, env, self.tools.new_state(), Counter()
        )
        self.events: list[dict] = [
            {"role": "user", "content": initial_message(task), "tool_set": self.tools.name}
        ]
        self.steps = self.tool_calls = self.invalid_calls = 0
        self.step_rewards: list[float] = []
        self.safety_flags: list[dict] = []
        self.ran_tests = False
        self.done = False
        self.end_reason = ""
        self.infra_detail = ""  # set by abort(): the result is an unverified infra failure
        self.started = time.monotonic()
        self.started_unix = self._step_end = time.time()
        self.step_times: list[list[float]] = []
        self.verify_time: list[float] = []
        if unprepared:
            self.abort(unprepared)

    def stop(self, reason: str) -> None:
        """End the episode: no more steps. `reason` is one of END_REASONS; an episode that
        is already over keeps the reason it ended with."""
        if reason not in END_REASONS:
            raise ValueError(f"unknown end reason {reason!r} (one of {', '.join(END_REASONS)})")
        if not self.done:
            self.done, self.end_reason = True, reason

    def abort(self, detail: str) -> None:
        """End the episode on an infrastructure fault (a backend, tool or verifier crash):
        `finish` then returns an infra failure without verification or reward, since the
        episode's data cannot be trusted. The first fault is the one reported."""
        self.done = True
        self.infra_detail = self.infra_detail or detail or "aborted"

    @property
    def tool_state(self):
        """The tool set's own per-episode state (e.g. fix_search's last listing)."""
        return self.tool_context.state

    def decoding_constraint(self):
        """This episode's decoding constraint for the next turn (None: no mask): what the
        tool set's `DecodingConstraint.live` makes of its state; None for a set without one."""
        constraint = self.tools.constraint
        return None if constraint is None else constraint.live(self.tool_context.state)

    def step(
        self,
        action: Action,
        *,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        completion: str | None = None,
        prompt_tokens: int | None = None,
    ) -> dict:
        """Apply one action; returns the environment event appended to the log.

        `token_ids` / `logprobs`: what a model sampled for this action, kept on its
        assistant event (the ids the trainer uses verbatim); `completion` (its decoded
        text) and `prompt_tokens` (the context it saw) are kept there too, for traces."""
        if self.done:
            raise RuntimeError(f"episode {self.episode_id} is already over")
        model_end = time.time()
        self.steps += 1
        invalid_before, counts_before = self.invalid_calls, Counter(self.tool_context.counts)
        assistant = {"role": "assistant", "action": action.tool, "arguments": action.arguments}
        if action.content:
            assistant["content"] = action.content
        if not action.imitate:
            assistant["train"] = False
        if token_ids is not None:
            assistant["token_ids"] = list(token_ids)
            assistant["logprobs"] = list(logprobs or [])
        if completion is not None:
            assistant["completion"] = completion
        if prompt_tokens is not None:
            assistant["prompt_tokens"] = prompt_tokens
        self.events.append(assistant)
        tool_start = time.time()
        if action.tool is None:
            self.invalid_calls += 1
            event = {
                "role": "environment",
                "observation": f"error: invalid tool call: {action.parse_error or 'unparseable'}",
                "truncated": False,
                "error": True,
            }
        else:
            self.tool_calls += 1
            result = run_tool(self.tools, self.tool_context, action.tool, action.arguments)
            flag = _safety_flag(result)
            if flag is not None:
                self.safety_flags.append({"step": self.steps, **flag})
            if result.error is not None and result.error.startswith("invalid arguments"):
                self.invalid_calls += 1
            self.ran_tests = self.ran_tests or result.ran_tests
            event = {"role": "environment", "observation": result.observation,
                     "truncated": result.truncated}  # fmt: skip
            if not result.ok:
                event["error"] = True
        self.events.append(event)
        model_start, self._step_end = self._step_end, time.time()
        self.step_times.append([round(t - self.started_unix, 4)
                                for t in (model_start, model_end, tool_start, self._step_end)])  # fmt: skip
        # The counted terms this step fired (weights summed): the trainer's turn-level credit.
        w = self.env.weights
        fired = self.tool_context.counts - counts_before
        self.step_rewards.append(
            w.invalid_call * (self.invalid_calls - invalid_before)
            + sum(weight_of(term, w) * fired[term.name] for term in self.tools.rubric)
        )
        if self.tools.ends_episode(action.tool):
            self.stop("finished")
        elif self.steps >= self.env.max_steps:
            self.stop("max_steps")
        elif self.max_wall_s is not None and time.monotonic() - self.started > self.max_wall_s:
            self.stop("time_limit")
        return event

    def finish(self, *, num_tokens: int | None = None) -> EpisodeResult:
        """Verify the workspace (unless aborted), keep the agent's diff, compute the reward,
        build the result and its record, free the workspace. `num_tokens`: the episode's
        token count, for a driver that has one. A verifier crash propagates (the workspace
        is freed; `abort` and `finish` again give the infra-failure result)."""
        if not self.done:
            self.stop("max_steps")
        if self.infra_detail:
            self.workspace.cleanup()
            return self._result(None, None, num_tokens)
        try:
            verify_start = time.time()
            v = verify(self.task, self.workspace.root, self.env, self.verify_sandbox)
            self.verify_time = [
                round(t - self.started_unix, 4) for t in (verify_start, time.time())
            ]
            # What the verifier observed (tampering, a forged or lost verdict, a limit the
            # agent's code hit) is recorded like what the monitor saw during the episode.
            self.safety_flags += [{"step": "verify", **flag} for flag in v.flags]
            try:
                diff = repo_diff(
                    self.task.repo_dir,
                    self.workspace.root,
                    changed_files(self.task.repo_dir, self.workspace.root),
                )
            except OSError:  # a file the agent left unreadable: the diff is unknown
                diff = None
        finally:
            self.workspace.cleanup()
        return self._result(v, diff, num_tokens)

    def _result(
        self, v: Verification | None, diff: str | None, num_tokens: int | None
    ) -> EpisodeResult:
        """The one builder of an episode's result and record; `v` None: aborted."""
        wall = round(time.monotonic() - self.started, 3)
        ok = v is not None and v.status == "ok"
        reward, terms, success = None, {}, False
        if ok:
            facts = EpisodeFacts(
                ran_tests=self.ran_tests,
                safety_categories=tuple(f["category"] for f in self.safety_flags),
                invalid_calls=self.invalid_calls,
                counts=dict(self.tool_context.counts),
            )
            breakdown = compute_reward(v, facts, self.env)
            reward, terms, success = breakdown.total, breakdown.terms, breakdown.success
        status = "ok" if ok else "infra_failure"
        end_reason = self.end_reason or "infra_failure"
        judged_by = verifier_version() if v is not None else ""
        record = {
            "schema_version": 1,
            "id": self.episode_id,
            "task_id": self.task.id,
            "source": self.source,
            "task": self.task.instruction,
            "trajectory": self.events,
            "reward": reward,
            "reward_terms": terms,
            "final_diff": diff,
            "metadata": {
                "policy": self.policy_name,
                "model_version": None,
                "num_tool_calls": self.tool_calls,
                "num_invalid_calls": self.invalid_calls,
                "num_tokens": num_tokens,
                "split": self.task.metadata.split,
                "family": self.task.metadata.family,
                "bug_class": self.task.metadata.bug_class,
                "task_source": self.task.metadata.source,  # generated, benchmark, mined
                "end_reason": end_reason,
                "status": status,
                "success": success,
                "verifier_version": judged_by,
            },
        }
        if ok:  # the verdict this pipeline's verifier gave: only a signed one trains
            sign_record(record)
        return EpisodeResult(
            episode_id=self.episode_id,
            task_id=self.task.id,
            split=self.task.metadata.split,
            policy=self.policy_name,
            status=status,
            end_reason=end_reason,
            success=success,
            reward=reward,
            reward_terms=terms,
            steps=self.steps,
            tool_calls=self.tool_calls,
            invalid_calls=self.invalid_calls,
            safety_flags=self.safety_flags,
            ran_tests=self.ran_tests,
            tests_total=v.tests_total if v is not None else 0,
            tests_failed=v.tests_failed if v is not None else 0,
            changed_files=v.changed_files if v is not None else [],
            tampered_files=v.tampered_files if v is not None else [],
            wall_s=wall,
            verdict_forged=v.forged_pass if v is not None else False,
            infra_detail=(self.infra_detail if v is None else "" if ok else v.detail)[-500:],
            step_rewards=list(self.step_rewards),
            final_diff=diff,
            timing={
                "start_unix": round(self.started_unix, 4),
                "steps": self.step_times,
                "verify": self.verify_time,
            },  # fmt: skip
            verifier_version=judged_by,
            record=record,
        )


def episode_id_for(policy: str, task: Task, seed: int) -> str:
    digest = hashlib.sha256(f"{policy}:{task.id}:{seed}".encode()).hexdigest()[:8]
    return f"{policy}-{task.id}-{digest}"


def run_episode(
    task: Task,
    policy: Policy,
    env: EnvConfig,
    sandbox: SandboxConfig,
    *,
    seed: int = 0,
) -> EpisodeResult:
    """Run one policy on one task to the end and verify it."""
    episode = EpisodeEnv(
        task,
        env,
        sandbox,
        policy_name=policy.name,
        episode_id=episode_id_for(policy.name, task, seed),
        # a scripted expert's episodes are its transcripts (components/scripted), not rollouts
        source=getattr(policy, "source", "rollout"),
    )
    try:
        while not episode.done:
            episode.step(policy.act(task, episode.events))
    except Exception:
        episode.workspace.cleanup()
        raise
    return episode.finish()
