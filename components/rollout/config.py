"""Typed configuration of the rollout engine: which backend samples, how, and the limits.

Checked here, where the values are defined; the backend's reachability is checked when
it is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from components.typed_config import doc


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are sampled: backend, sampling parameters, per-episode budgets, batching."""

    backend: Literal["transformers", "openai"] = field(
        default="transformers",
        metadata=doc(
            "transformers: generate in-process with the given model; openai: any "
            "OpenAI-compatible /v1/completions server (vLLM, `agentrl serve`) at base_url"
        ),
    )
    base_url: str = field(
        default="http://127.0.0.1:8000/v1",
        metadata=doc("OpenAI-compatible endpoint root (…/v1); used by the openai backend"),
    )
    server: Literal["", "vllm"] = field(
        default="",
        metadata=doc(
            "openai backend: '' = a server already answers at base_url; vllm = the stage "
            "that samples (train grpo, rollout sample) starts real vLLM itself from "
            ".venv-vllm (`make vllm`) on loopback, on the policy's base, waits for its "
            "health within runtime.startup_timeout_s, samples there and stops it"
        ),
    )
    model: str = field(
        default="policy",
        metadata=doc("model name sent to the server (vLLM: --served-model-name)"),
    )
    temperature: float = field(
        default=1.0,
        metadata=doc(
            "sampling temperature; 0 = greedy. Stored log-probs are under softmax(logits / T) "
            "(T = 1 when greedy), the distribution the trainer recomputes"
        ),
    )
    top_p: float = field(
        default=1.0,
        metadata=doc(
            "nucleus sampling; keep 1.0 for RL: stored log-probs ignore the top-p cut, so "
            "below 1 they are not exactly the sampling distribution"
        ),
    )
    max_new_tokens: int = field(
        default=256, metadata=doc("most tokens generated in one assistant turn")
    )
    max_episode_tokens: int = field(
        default=4096,
        metadata=doc(
            "token budget of a whole episode (prompt + every turn); reaching it ends the "
            "episode with end_reason 'token_limit'"
        ),
    )
    max_wall_s: float = field(
        default=600.0,
        metadata=doc("wall-clock budget of one episode; exceeding it ends it as 'time_limit'"),
    )
    step_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "wall-clock bound of one episode step (its tool call), longer than any tool's own "
            "limit (a command's sandbox wall time is 60 s by default); a step still running "
            "after it ends that episode as the agent's 'time_limit' with a resource_limit "
            "flag, verified as it stands; the batch goes on"
        ),
    )
    batch_size: int = field(
        default=8, metadata=doc("episodes advanced together (one generate call per turn)")
    )
    samples_per_task: int = field(
        default=4, metadata=doc("K (GRPO's G): episodes sampled per task, one group per task")
    )
    seed: int = field(default=0, metadata=doc("sampling seed; same seed and model => same run"))
    workers: int = field(
        default=4, metadata=doc("threads that execute tool calls (and HTTP requests) in parallel")
    )
    request_timeout_s: float = field(
        default=120.0, metadata=doc("openai backend: timeout of one HTTP request")
    )
    constrain_fix_ids: bool = field(
        default=False,
        metadata=doc(
            "transformers backend: inside a try_fix call, only listed untried candidate ids "
            "can be drawn (components/env/tool_sets/fix_search/constrain.py)"
        ),
    )
    max_retries: int = field(
        default=3,
        metadata=doc("openai backend: retries (exponential backoff) on connection errors / 5xx"),
    )
    sync_retries: int = field(
        default=3,
        metadata=doc(
            "openai backend in training: tries after the first to make the server serve a new "
            "policy version (rollout/policy_sync.py) before the run stops with an error"
        ),
    )
    sync_timeout_s: float = field(
        default=600.0,
        metadata=doc("openai backend in training: timeout of one policy-sync request"),
    )
    sync_url: str = field(
        default="",
        metadata=doc(
            "openai backend in training: a URL whose host resolves to every server replica "
            "(a headless Service, e.g. http://vllm-replicas:8000/v1); each loads every policy "
            "version. '' = base_url (one replica)"
        ),
    )

    def __post_init__(self) -> None:
        if self.backend not in ("transformers", "openai"):
            raise ValueError(f"RolloutConfig.backend: unknown {self.backend!r}")
        if self.backend == "openai" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError("RolloutConfig.base_url must be an http(s) URL")
        if self.server not in ("", "vllm"):
            raise ValueError(f"RolloutConfig.server: unknown {self.server!r} ('' or vllm)")
        if self.sync_url and not self.sync_url.startswith(("http://", "https://")):
            raise ValueError("RolloutConfig.sync_url must be an http(s) URL or ''")
        if not self.model:
            raise ValueError("RolloutConfig.model must not be empty")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError("RolloutConfig.temperature must be in [0, 10]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("RolloutConfig.top_p must be in (0, 1]")
        for name in ("max_new_tokens", "max_episode_tokens", "batch_size",
                     "samples_per_task", "workers"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1")
        if self.max_wall_s <= 0 or self.request_timeout_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError(
                "RolloutConfig: max_wall_s, request_timeout_s and step_timeout_s must be positive"
            )
        if self.constrain_fix_ids and self.backend != "transformers":
            raise ValueError(
                "RolloutConfig.constrain_fix_ids needs the transformers backend (a vLLM server "
                "would take it as structured outputs; not wired)"
            )
        if self.max_retries < 0 or self.sync_retries < 0:
            raise ValueError("RolloutConfig: max_retries and sync_retries must be >= 0")
        if self.sync_timeout_s <= 0:
            raise ValueError("RolloutConfig.sync_timeout_s must be positive")
