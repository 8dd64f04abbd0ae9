"""What a sampling backend returns, and the shape of a backend as a function.

The low-level piece both the rollout engine and its backends (openai_backend.py, the
in-process `generate_transformers`, `agentrl serve`) depend on; it imports nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Completion:
    """One backend completion: the sampled ids and their log-probs, or an error."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (ended with <|im_end|> or a stop string) | "length"
    error: str = ""  # non-empty: the backend failed; the episode becomes an infra failure
    # Per position, the top-k alternatives as {token_id: logprob} (only when asked for).
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # The policy version that sampled these tokens (a served backend's model/adapter name;
    # "" in-process): asynchronous training measures an episode's staleness from it.
    policy_version: str = ""


# (prompts, max_new_tokens per prompt, seed) -> one Completion per prompt, in order; the
# engine passes one seed per prompt (its episode's stream), other callers may pass one int.
# The in-process backend also takes `constraint=` (components/env/tool_sets/fix_search/constrain.py).
GenerateFn = Callable[[list[list[int]], list[int], int], list[Completion]]
