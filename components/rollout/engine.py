"""Rollout engine: K multi-turn episodes per task, batched, keeping the exact sampled tokens.

Each turn, the prompts of every live episode go to the backend in one call (in-process
`model.generate` with left padding, or an OpenAI-compatible server); each completion is
parsed into an Action, the episodes step in a thread pool (tool execution), and finished
episodes are verified while the others keep sampling (continuous batching: a finished
slot is refilled from the queue at once).

Token-exactness, the point of this module: an episode's token sequence is built only by
appending, never by re-rendering text. It starts as `prompt_ids(events)` (system + task +
assistant header). A turn appends the *sampled* ids as returned by the backend (mask 1,
with their log-probs), then the environment turn tokenized as context (mask 0): `\\n`,
the tool-response user turn, the next assistant header (each piece tokenized on its own,
as `chat.tokenize_trajectory` does). A completion cut off by its token cap has no
`<|im_end|>`; the engine closes the turn with an `<|im_end|>` context token, so the model
still sees a well-formed transcript, and the trainer never trains on a token the policy
did not sample. Decoding the sampled ids to text and tokenizing that text again can give
different ids (BPE is not injective over id sequences), which would make the
policy-gradient ratio pi_new/pi_old compare probabilities of different tokens.

The engine never names a tool: what the episodes offer, and any decoding constraint, is the
environment's tool set (`EpisodeEnv.tools`, components/env/tool_sets/); the constraint is
applied when `RolloutConfig.constrain_fix_ids` is on and the set has one.

Stored log-probs are log softmax(logits / T)[sampled id] (T = 1 for greedy), computed
from the full-precision logits of the step that sampled the token: what
`components.train.losses.token_logprobs(logits, ids, temperature=T)` recomputes. Top-p
truncation is not included (keep top_p = 1 for RL).

End reasons: "finished" (the agent called finish), "max_steps", "time_limit" (set by
EpisodeEnv), "token_limit" (decided here, through `EpisodeEnv.stop`: the episode's prompt
+ generated tokens reached `max_episode_tokens`, or the model's context). A backend or
harness error aborts the episode (`EpisodeEnv.abort`): an infra failure (status
"infra_failure", reward None), kept in the output and flagged so group statistics can
leave it out.

A step is bounded in time (`RolloutConfig.step_timeout_s`, issue 44): a tool call still
running when its turn's deadline passes ends that episode only, as the agent's doing: a
`resource_limit` flag saying so (penalized like a command the sandbox killed), end reason
"time_limit", and the tree verified as it stands, as for any episode out of time; never an
infra failure, and the batch goes on. A thread cannot be killed, but what it waits on can:
every sandboxed command still running in the episode's workspace is killed at once (its
process group and cgroups, `sandbox.process.stop_commands_in`), no new one may start
there, and the call is given STUCK_GRACE_S to return before the episode is verified, so
the verifier never snapshots a tree that a live process is still writing, and no process
of the episode outlives it. A call that still has not returned (one holding the GIL) is
left to finish in the background: the tool pool is replaced, and verification runs in a
pool of its own, so neither waits on it. The deadline needs the stuck call to release the
GIL (waiting on a sandboxed process, I/O); the monitor's and tools' own bounds (RE2
patterns, argument and patch limits) are what keep a call from holding it. An episode on
an environment server (env.remote) has no workspace in this process: its commands are the
server's to bound (its request timeout, components/env_service/).

torch / transformers are imported inside functions: the CLI imports this module.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv, EpisodeResult
from components.env.tool_sets import DecodingConstraint, tool_set
from components.env_service.client import open_episode
from components.policy.chat import (
    chat_format,
    end_of_turn_id,
    environment_turn_pieces,
    parse_tool_call,
    prompt_ids,
)
from components.rollout.completion import Completion, GenerateFn
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from components.sandbox.process import stop_commands_in
from components.seeding import derive_seed
from components.tasks.task import Task


@dataclass
class Rollout:
    """One sampled episode: its verified result and the exact tokens the trainer consumes.

    input_ids, assistant_mask and sampling_logprobs are aligned: the mask is 1 on tokens
    the policy sampled, and sampling_logprobs[t] is the log-prob of input_ids[t] under the
    sampling distribution there (0.0 where the mask is 0).
    """

    result: EpisodeResult
    input_ids: list[int]
    assistant_mask: list[int]
    sampling_logprobs: list[float]
    group_id: str  # the task id: GRPO's group
    sample_index: int  # 0..K-1 within the group
    # Per sampled turn, the policy version that produced it (Completion.policy_version).
    policy_versions: list[str] = field(default_factory=list)

    @property
    def policy_version(self) -> str:
        """The oldest version that sampled any turn: what the episode's staleness counts."""
        return self.policy_versions[0] if self.policy_versions else ""

    @property
    def infra_failure(self) -> bool:
        """True for harness/backend faults: no reward; exclude from group statistics."""
        return self.result.status != "ok"

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.assistant_mask)


@dataclass(frozen=True)
class Constraint:
    """A tool set's decoding constraint for one generate call: the spec and, per prompt,
    that episode's constraint (None: that row is not masked)."""

    spec: DecodingConstraint
    rows: list


def constraint_for(envs: Sequence[EpisodeEnv], config: RolloutConfig) -> Constraint | None:
    """The decoding constraint of these episodes' tool set for their next turn, when the
    rollout config asks for one (None otherwise)."""
    if not config.constrain_fix_ids or not envs or envs[0].tools.constraint is None:
        return None
    return Constraint(envs[0].tools.constraint, [env.decoding_constraint() for env in envs])


# ---------------------------------------------------------------------------------------
# In-process backend (transformers)


# long: the sampling settings every backend takes by the same names (keyword-only)
def generate_transformers(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: list[int],
    *,
    temperature: float,
    top_p: float,
    seed: int | Sequence[int],
    top_logprobs: int = 0,
    constraint: Constraint | None = None,
) -> list[Completion]:
    """Batched sampling with `model.generate`: left padding, per-row token caps.

    One generate call for the batch (its length is the largest cap; each row is cut at its
    own cap afterwards). Rows that end early are padded by generate only after their
    `<|im_end|>`, so a row's real tokens are everything up to its first `<|im_end|>`.
    `constraint`: a tool set's decoding constraint with one entry per prompt
    (`Constraint`); the stored log-probs stay the model's own.
    `seed`: one int for the batch (one torch stream, which every row draws from), or one
    per prompt: each row then draws from its own stream (`RowSampler`), so what a row
    samples does not depend on which rows share its batch or in which order.
    """
    import torch

    eos = end_of_turn_id(tokenizer)
    input_ids, attention_mask = _left_padded(prompts, tokenizer.pad_token_id)
    width = input_ids.shape[1]
    device = model.device
    greedy = temperature == 0.0
    rows = None if isinstance(seed, int) or greedy else list(seed)
    kwargs = _generate_kwargs(
        tokenizer, width, max(max_new_tokens), eos,
        temperature=temperature, top_p=top_p, constraint=constraint, row_seeds=rows,
    )  # fmt: skip
    seed = seed if isinstance(seed, int) else 0  # per-row streams: the global one is unused
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs
        )
    generated = out.sequences[:, width:].cpu()  # [B, S]
    picked, top_steps = _sampled_logprobs(
        out.logits, generated, 1.0 if greedy else temperature, top_logprobs
    )
    completions = []
    for i, cap in enumerate(max_new_tokens):
        row = generated[i].tolist()
        ends = [j for j, t in enumerate(row) if t == eos]
        n, reason = (
            (ends[0] + 1, "stop") if ends and ends[0] < cap else (min(cap, len(row)), "length")
        )
        tops = [
            dict(zip(top.indices[i].tolist(), top.values[i].float().tolist(), strict=True))
            for top in top_steps[:n]
        ]
        completions.append(Completion(row[:n], picked[i, :n].tolist(), reason, top_logprobs=tops))
    return completions


def _left_padded(prompts: list[list[int]], pad: int):
    """The prompts as one left-padded batch: (input_ids, attention_mask), both [B, W]."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention_mask[i, width - len(p) :] = 1
    return input_ids, attention_mask


def _generate_kwargs(
    tokenizer, width: int, max_new: int, eos: int, *, temperature: float, top_p: float,
    constraint: Constraint | None, row_seeds: list[int] | None = None,
) -> dict:  # fmt: skip
    """`model.generate` settings: plain softmax(logits / T) sampling (greedy at T = 0),
    raw logits returned, and the tool set's decoding constraint when asked for. With
    `row_seeds`, the draw is `RowSampler`'s (after the constraint) and generate takes the
    one token it leaves (do_sample off: nothing else reads torch's global stream)."""
    from transformers import LogitsProcessorList

    greedy = temperature == 0.0
    kwargs = {
        "max_new_tokens": max_new,
        "do_sample": not greedy and row_seeds is None,
        "return_dict_in_generate": True,
        "output_logits": True,  # raw logits: the stored log-probs must not be top-p filtered
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id,
    }
    processors = LogitsProcessorList()
    if constraint is not None:
        processors.append(constraint.spec.logits_processor(tokenizer, width, constraint.rows))
    if row_seeds is not None:
        processors.append(RowSampler(row_seeds, temperature, top_p))
    if processors:
        kwargs["logits_processor"] = processors
    if not greedy and row_seeds is None:
        # top_k=0 turns off transformers' default top-k of 50: sampling is exactly
        # softmax(logits / T), optionally top-p cut.
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    return kwargs


class RowSampler:
    """A logits processor that samples each row from softmax(scores / T), top-p cut, with
    the row's own torch.Generator (seeded once per generate call from its seed), and keeps
    only the drawn token: what transformers' sampling does, with one random stream per row
    instead of one for the batch. Runs after any decoding constraint, on its output."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float) -> None:
        import torch

        self.temperature, self.top_p = temperature, top_p
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1).cpu()  # [B, V]
        if self.top_p < 1.0:  # keep the smallest top set with mass >= top_p (the best always)
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        picked = torch.stack([torch.multinomial(probs[i], 1, generator=g)
                              for i, g in enumerate(self.generators)])  # [B, 1]  # fmt: skip
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, picked.to(scores.device), 0.0)


def _sampled_logprobs(step_logits, generated, scale: float, top_logprobs: int):
    """log softmax(logits / scale) of each sampled id, [B, S] on the CPU, and per step the
    top-k (values, indices) when asked for. One step at a time keeps memory O(B*V)."""
    import torch

    picked_steps, top_steps = [], []
    for s, logits in enumerate(step_logits):  # S tensors of [B, V]
        logp = torch.log_softmax(logits.float() / scale, dim=-1)  # [B, V]
        index = generated[:, s : s + 1].to(logits.device)
        picked_steps.append(logp.gather(-1, index).squeeze(-1).cpu())
        if top_logprobs:
            top_steps.append(logp.topk(top_logprobs, dim=-1))
    return torch.stack(picked_steps, dim=1), top_steps  # [B, S]


def _token_limit(policy, config: RolloutConfig) -> int:
    """An episode's token budget: max_episode_tokens, and for the in-process model its
    context length (a server checks its own)."""
    if config.backend == "transformers":
        return min(config.max_episode_tokens, policy.config.max_position_embeddings)
    return config.max_episode_tokens


def make_generate_fn(policy, tokenizer, config: RolloutConfig) -> GenerateFn:
    """The backend as a function: `policy` is a transformers model, or an OpenAI client
    (`OpenAICompletionsClient`, or None to build one from config.base_url)."""
    if config.backend == "openai":
        from components.rollout.openai_backend import OpenAICompletionsClient

        client = policy if policy is not None else OpenAICompletionsClient.from_config(config)
        if not hasattr(client, "complete_batch"):  # e.g. a model where the server was meant
            raise TypeError(
                f"rollout.backend is openai: sampling needs the server's client, not a "
                f"{type(client).__name__} (pass None to reach rollout.base_url)"
            )
        return lambda prompts, caps, seed: client.complete_batch(
            prompts, caps, temperature=config.temperature, top_p=config.top_p, seed=seed
        )
    if policy is None:
        raise ValueError("the transformers backend needs a model")
    policy.eval()
    return lambda prompts, caps, seed, constraint=None: generate_transformers(
        policy, tokenizer, prompts, caps,
        temperature=config.temperature, top_p=config.top_p, seed=seed,
        constraint=constraint,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Episodes


# How long a stuck step's call gets to return once its commands were killed.
STUCK_GRACE_S = 10.0


@dataclass
class _Live:
    env: EpisodeEnv
    task: Task
    group_id: str
    sample_index: int
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    policy_versions: list[str] = field(default_factory=list)
    stuck: bool = False  # a step outlived step_timeout_s: the episode ended as the agent's


def _encode_context(tokenizer, pieces: Sequence[str]) -> list[int]:
    # Each piece on its own, like chat._encode_segments: the same ids tokenize_trajectory gives.
    encoded = tokenizer(list(pieces), add_special_tokens=False)["input_ids"]
    return [t for piece in encoded for t in piece]


def environment_turn_ids(tokenizer, observation: str, closed: bool) -> list[int]:
    """Context ids after an assistant turn: [<|im_end|>] (if the turn was cut), "\\n",
    the tool-response turn, the next assistant header."""
    return _encode_context(tokenizer, environment_turn_pieces(tokenizer, observation, closed))


def _finish(live: _Live) -> Rollout:
    """Verify and score a finished episode (an aborted one is an infra failure)."""
    try:
        result = live.env.finish(num_tokens=len(live.ids))
    except Exception as exc:  # noqa: BLE001 - a harness fault is data, not a crash
        live.env.abort(f"verification failed: {exc!r}")
        result = live.env.finish(num_tokens=len(live.ids))
    return Rollout(
        result, live.ids, live.mask, live.logprobs, live.group_id, live.sample_index,
        live.policy_versions,
    )  # fmt: skip


def _start(task: Task, k: int, tokenizer, config, env_config, sandbox_config, policy_name):
    episode_id = f"{policy_name}-{task.id}-s{config.seed}-k{k}"
    # In this process, or on the environment server the preset names (env.remote).
    env = open_episode(
        task, env_config, sandbox_config,
        policy_name=policy_name, episode_id=episode_id, max_wall_s=config.max_wall_s,
    )  # fmt: skip
    ids = prompt_ids(tokenizer, env.events)
    return _Live(env, task, task.id, k, ids, [0] * len(ids), [0.0] * len(ids))


def _step(live: _Live, action: Action, completion: Completion, text: str, prompt_tokens: int
          ) -> dict | None:  # fmt: skip
    """Apply one parsed action with its sampled tokens (and their text, and the prompt's
    length, for traces); the environment's answer, or None when the tool crashed (the
    episode is aborted)."""
    try:
        return live.env.step(action, token_ids=completion.token_ids, logprobs=completion.logprobs,
                             completion=text, prompt_tokens=prompt_tokens)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a tool crash is a harness fault, not the policy's
        if not live.stuck:  # a call that outlived its deadline was already judged the agent's
            live.env.abort(f"tool execution failed: {exc!r}")
        return None


def _end_stuck(live: _Live, timeout_s: float) -> None:
    """A step outlived its deadline: the episode ends as the agent's, recorded (module doc)."""
    live.stuck = True
    live.env.safety_flags.append({
        "step": live.env.steps, "category": "resource_limit",
        "reason": f"a tool call ran past the rollout's step limit of {timeout_s:g} s; the "
                  "episode was ended",
    })  # fmt: skip
    live.env.stop("time_limit")
    workspace = getattr(live.env, "workspace", None)  # None: an environment server's episode
    if workspace is not None:
        stop_commands_in(workspace.root)


def _returned(fut: Future, within_s: float) -> bool:
    try:
        fut.result(timeout=within_s)
    except FutureTimeout:
        return False
    return True


def _generate_turn(
    generate: GenerateFn, live: list[_Live], config: RolloutConfig, limit: int, seed: int
) -> list[Completion]:
    """One completion per live episode, each capped by its remaining token budget; a
    backend fault becomes an error completion for each (those episodes only)."""
    caps = [min(config.max_new_tokens, limit - len(ep.ids)) for ep in live]
    constraint = constraint_for([ep.env for ep in live], config)
    extra = {} if constraint is None else {"constraint": constraint}
    # One stream per episode and turn: a draw never depends on the batch it is in.
    seeds = [derive_seed(seed, ep.env.episode_id, len(ep.policy_versions)) for ep in live]
    try:
        return generate([ep.ids for ep in live], caps, seeds, **extra)
    except Exception as exc:  # noqa: BLE001 - a backend fault fails these episodes only
        return [Completion(error=f"backend failed: {exc!r}") for _ in live]


def _advance(
    live: list[_Live], completions: list[Completion], tokenizer, pool: ThreadPoolExecutor,
    limit: int, config: RolloutConfig,
) -> bool:  # fmt: skip
    """Append each sampled turn (mask 1), step the episodes in the pool (tool execution),
    then append each environment turn as context (mask 0), or stop the episode when the
    next turn would not fit: it needs room for the context and one sampled token. A step
    past the turn's deadline (step_timeout_s per round of the pool's workers) ends its
    episode (`_end_stuck`); returns whether such a call is still running after its grace
    (the pool then holds its thread)."""
    eos = end_of_turn_id(tokenizer)
    stepping = []
    for ep, c in zip(live, completions, strict=True):
        if c.error:
            ep.env.abort(c.error)
            continue
        prompt_tokens = len(ep.ids)
        ep.ids += c.token_ids
        ep.mask += [1] * len(c.token_ids)
        ep.logprobs += c.logprobs
        ep.policy_versions.append(c.policy_version)
        text = tokenizer.decode(c.token_ids, skip_special_tokens=False)
        action = parse_tool_call(text, chat_format(tokenizer))
        stepping.append((ep, c, pool.submit(_step, ep, action, c, text, prompt_tokens)))
    rounds = math.ceil(len(stepping) / config.workers) if stepping else 0
    deadline, stuck = time.monotonic() + rounds * config.step_timeout_s, False
    for ep, c, fut in stepping:
        try:
            event = fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            _end_stuck(ep, config.step_timeout_s)
            # Its commands are dead: the call returns, unless it holds the GIL (module doc).
            stuck = not _returned(fut, STUCK_GRACE_S) or stuck
            continue
        if ep.env.done:
            continue
        closed = bool(c.token_ids) and c.token_ids[-1] == eos
        context_ids = environment_turn_ids(tokenizer, event["observation"], closed)
        if len(ep.ids) + len(context_ids) >= limit:
            ep.env.stop("token_limit")
            continue
        ep.ids += context_ids
        ep.mask += [0] * len(context_ids)
        ep.logprobs += [0.0] * len(context_ids)
    return stuck


def sample_episodes(
    tasks: Sequence[Task],
    policy,
    tokenizer,
    config: RolloutConfig,
    env_config: EnvConfig,
    sandbox_config: SandboxConfig,
    *,
    policy_name: str = "model",
    generate_fn: GenerateFn | None = None,
) -> list[Rollout]:
    """K = config.samples_per_task episodes per task, advanced `batch_size` at a time.

    `policy` is a transformers causal LM (backend "transformers") or an
    `OpenAICompletionsClient` / None (backend "openai"). `generate_fn` overrides the
    backend (tests, benchmarks). Returns the rollouts in (task, sample) order; infra
    failures are included and flagged (`Rollout.infra_failure`).
    """
    if config.constrain_fix_ids and tool_set(env_config.tool_set).constraint is None:
        raise ValueError(
            f"RolloutConfig.constrain_fix_ids: tool set {env_config.tool_set!r} has no "
            "decoding constraint"
        )
    generate = generate_fn or make_generate_fn(policy, tokenizer, config)
    limit = _token_limit(policy, config)
    queue = deque((task, k) for task in tasks for k in range(config.samples_per_task))
    live: list[_Live] = []
    finishing: list[Future] = []
    # Tool steps and verification in pools of their own: a stuck step (module docstring)
    # leaves its tool pool behind, never the verification of any episode.
    tools = ThreadPoolExecutor(max_workers=config.workers)
    with ThreadPoolExecutor(max_workers=config.workers) as verifying:
        try:
            while queue or live:
                while queue and len(live) < config.batch_size:
                    task, k = queue.popleft()
                    # No try: a workspace that cannot be created is a broken harness, not data.
                    ep = _start(task, k, tokenizer, config, env_config, sandbox_config,
                                policy_name)  # fmt: skip
                    if len(ep.ids) >= limit:  # the task alone fills the budget
                        ep.env.stop("token_limit")
                        finishing.append(verifying.submit(_finish, ep))
                    else:
                        live.append(ep)
                if not live:
                    continue
                completions = _generate_turn(generate, live, config, limit, config.seed)
                if _advance(live, completions, tokenizer, tools, limit, config):
                    tools.shutdown(wait=False)  # its stuck thread finishes on its own
                    tools = ThreadPoolExecutor(max_workers=config.workers)
                # Finished episodes are verified while the others keep sampling.
                finishing += [verifying.submit(_finish, ep) for ep in live if ep.env.done]
                live = [ep for ep in live if not ep.env.done]
            rollouts = [f.result() for f in finishing]
        finally:
            tools.shutdown(wait=False)
    order = {task.id: i for i, task in enumerate(tasks)}
    return sorted(rollouts, key=lambda r: (order[r.group_id], r.sample_index))


def rollout_summary(rollouts: Sequence[Rollout]) -> dict:
    """Counts for logging: end reasons, infra failures, tokens."""
    reasons: dict[str, int] = {}
    for r in rollouts:
        reasons[r.result.end_reason] = reasons.get(r.result.end_reason, 0) + 1
    ok = [r for r in rollouts if not r.infra_failure]
    return {
        "episodes": len(rollouts),
        "infra_failures": len(rollouts) - len(ok),
        "end_reasons": reasons,
        "success_rate": sum(r.result.success for r in ok) / len(ok) if ok else 0.0,
        "mean_reward": sum(r.result.reward or 0.0 for r in ok) / len(ok) if ok else 0.0,
        "generated_tokens": sum(r.num_generated_tokens for r in rollouts),
        "invalid_calls": sum(r.result.invalid_calls for r in rollouts),
    }
