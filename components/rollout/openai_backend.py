"""Sampling through any OpenAI-compatible server: `vllm serve` at scale, `agentrl serve` locally.

What this client relies on (vLLM's OpenAI server, `/v1/completions`; `agentrl serve`
implements the same fields):
- `prompt` may be a list of token ids (vLLM's CompletionRequest accepts
  `list[int]`): the prompt is sent as the engine's exact ids, never as text.
- `logprobs: 1` returns the sampled token's log-prob per position in
  `choices[0].logprobs.token_logprobs`.
- `return_token_ids: true` (vLLM >= 0.10.2) adds `choices[0].token_ids`, the generated ids;
  `return_tokens_as_token_ids: true` makes `logprobs.tokens` strings "token_id:{id}". The
  client takes `token_ids` when present, else parses the "token_id:" strings, so it works
  with either.
- `skip_special_tokens: false` and `include_stop_str_in_output: true`, so `<|im_end|>` is kept.
- Which distribution the log-probs are under is the server's choice. `agentrl serve`
  returns log softmax(logits / T) (T = 1 when greedy), like the in-process backend. vLLM
  returns the raw model distribution (before temperature) by default and is switched with
  its `--logprobs-mode` option (`processed_logprobs`); at T = 1 without top-p/top-k the
  two agree. The trainer's `token_logprobs(..., temperature=T)` is the reference.

Each completion records the `model` the server answered under (vLLM and `agentrl serve`
answer with the requested adapter's name) as its `policy_version`: with the trainer's
policy sync (policy_sync.py) that name is the policy version.

Robustness: each request has a timeout; connection errors, timeouts and 5xx / 429
responses are retried with exponential backoff; after the last retry, or on any other
error (4xx, malformed response), the completion carries `error` and the engine turns that
episode into an infra failure instead of crashing the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig

_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class OpenAICompletionsClient:
    """A small `/v1/completions` client over httpx (the `openai` package is not a dependency)."""

    base_url: str
    model: str
    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 0.5
    workers: int = 8

    @classmethod
    def from_config(cls, config: RolloutConfig) -> OpenAICompletionsClient:
        return cls(
            base_url=config.base_url, model=config.model, timeout_s=config.request_timeout_s,
            max_retries=config.max_retries, workers=max(config.batch_size, 1),
        )  # fmt: skip

    def _post(self, path: str, payload: dict) -> dict:
        url = self.base_url.rstrip("/") + path
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = httpx.post(url, json=payload, timeout=self.timeout_s)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRYABLE_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
            return response.json()
        raise RuntimeError(f"{url}: gave up after {self.max_retries + 1} attempts: {last}")

    def complete(
        self, prompt: list[int], max_tokens: int, *, temperature: float, top_p: float, seed: int
    ) -> Completion:
        """One completion for a token-id prompt; never raises (errors go in `.error`)."""
        payload = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        try:
            body = self._post("/completions", payload)
            completion = parse_completion_choice(body["choices"][0])
        except Exception as exc:  # noqa: BLE001 - any failure is an infra failure of this episode
            return Completion(error=f"openai backend: {exc}"[:1000])
        # The name the server answered under: with a policy sync, the policy version.
        completion.policy_version = str(body.get("model") or "")
        return completion

    def complete_batch(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        *,
        temperature: float,
        top_p: float,
        seed: int | Sequence[int],
    ) -> list[Completion]:
        """Concurrent requests (the server batches them); one seed per prompt (`seed` + i,
        or the i-th of a list: the engine's per-episode streams)."""
        seeds = [seed + i for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
        with ThreadPoolExecutor(max_workers=min(self.workers, len(prompts))) as pool:
            futures = [
                pool.submit(self.complete, p, n, temperature=temperature, top_p=top_p, seed=s)
                for p, n, s in zip(prompts, max_tokens, seeds, strict=True)
            ]
            return [f.result() for f in futures]

    def models(self) -> list[str]:
        response = httpx.get(self.base_url.rstrip("/") + "/models", timeout=self.timeout_s)
        response.raise_for_status()
        return [m["id"] for m in response.json()["data"]]


def parse_completion_choice(choice: dict) -> Completion:
    """A `/v1/completions` choice -> Completion (token ids + sampled-token log-probs)."""
    logprobs = choice.get("logprobs") or {}
    token_logprobs = logprobs.get("token_logprobs")
    if token_logprobs is None:
        raise ValueError("response has no logprobs.token_logprobs (request logprobs)")
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise ValueError("response has neither token_ids nor 'token_id:N' tokens")
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    if len(ids) != len(token_logprobs):
        raise ValueError(f"{len(ids)} token ids but {len(token_logprobs)} logprobs")
    if any(lp is None for lp in token_logprobs):
        raise ValueError("a generated token has no logprob")
    return Completion(
        token_ids=[int(t) for t in ids],
        logprobs=[float(lp) for lp in token_logprobs],
        finish_reason=choice.get("finish_reason") or "length",
    )
