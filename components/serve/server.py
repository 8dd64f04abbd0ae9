"""`agentrl serve`: an OpenAI-compatible HTTP server for a local checkpoint (FastAPI + uvicorn).

The laptop stand-in for `vllm serve`: the rollout engine's OpenAI backend talks to either
unchanged. Endpoints: GET /v1/models, POST /v1/completions (prompt as a string or a list
of token ids), POST /v1/chat/completions (messages through the tokenizer's chat template).
Responses carry vLLM's extension fields: `token_ids` / `prompt_token_ids` with
`return_token_ids`, "token_id:{id}" strings in `logprobs.tokens` with
`return_tokens_as_token_ids`. Log-probs are log softmax(logits / T) of the sampled tokens
(T = 1 when greedy), the same numbers the in-process backend stores.

One request generates at a time (a lock around the model): no batching, which is fine for
tests and a laptop; scale is vLLM's job. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import secrets
import threading
import time

from pydantic import BaseModel, Field

from components.policy.chat import IM_END
from components.rollout.engine import Completion, generate_transformers


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    seed: int | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    stop: str | list[str] | None = None
    echo: bool = False
    # vLLM extensions
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class ChatCompletionRequest(BaseModel):
    model: str | None = None
    messages: list[dict]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stop: str | list[str] | None = None
    return_token_ids: bool = False


def _apply_stop(tokenizer, completion: Completion, stops: list[str], skip: bool):
    """Cut at the first stop string: the shortest token prefix whose text contains one."""
    if not stops:
        return completion, None
    for n in range(1, len(completion.token_ids) + 1):
        text = tokenizer.decode(completion.token_ids[:n], skip_special_tokens=skip)
        hit = min(((text.find(s), s) for s in stops if s in text), default=None)
        if hit is not None:
            cut = Completion(
                completion.token_ids[:n], completion.logprobs[:n], "stop",
                top_logprobs=completion.top_logprobs[:n],
            )  # fmt: skip
            return cut, hit[1]
    return completion, None


def create_app(model, tokenizer, model_name: str = "policy"):
    """The FastAPI app serving `model` (already loaded) as `model_name`."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="agentrl serve")
    lock = threading.Lock()
    context = getattr(model.config, "max_position_embeddings", None)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    model.eval()

    def generate(ids: list[int], max_tokens: int, temperature, top_p, seed, top_k: int):
        if not ids:
            raise HTTPException(400, "empty prompt")
        if context is not None and len(ids) + max_tokens > context:
            if len(ids) >= context:
                raise HTTPException(400, f"prompt of {len(ids)} tokens exceeds context {context}")
            max_tokens = context - len(ids)
        if any(not 0 <= t < len(tokenizer) for t in ids):
            raise HTTPException(400, "prompt token id out of range")
        seed = secrets.randbits(31) if seed is None else seed
        with lock:
            (c,) = generate_transformers(
                model, tokenizer, [ids], [max_tokens],
                temperature=temperature, top_p=top_p, seed=seed, top_logprobs=top_k,
            )  # fmt: skip
        return c

    def token_str(t: int, as_ids: bool) -> str:
        return f"token_id:{t}" if as_ids else tokenizer.decode([t], skip_special_tokens=False)

    @app.get("/v1/models")
    def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "agentrl",
                      "max_model_len": context}],
        }  # fmt: skip

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        if req.n != 1:
            raise HTTPException(400, "only n=1 is supported")
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            if len(prompt) != 1:
                raise HTTPException(400, "one prompt per request")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = list(prompt)
        c = generate(ids, req.max_tokens, req.temperature, req.top_p, req.seed, req.logprobs or 0)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        c, stop_reason = _apply_stop(tokenizer, c, stops, req.skip_special_tokens)
        text = tokenizer.decode(c.token_ids, skip_special_tokens=req.skip_special_tokens)
        if stop_reason is not None and not req.include_stop_str_in_output:
            text = text[: text.find(stop_reason)]
        choice = {"index": 0, "text": text, "finish_reason": c.finish_reason,
                  "stop_reason": stop_reason, "logprobs": None}  # fmt: skip
        if req.logprobs is not None:
            as_ids = req.return_tokens_as_token_ids
            tokens = [token_str(t, as_ids) for t in c.token_ids]
            offsets, pos = [], 0
            for t in tokens:
                offsets.append(pos)
                pos += len(t)
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": c.logprobs,
                "top_logprobs": [
                    {token_str(t, as_ids): lp for t, lp in top.items()} for top in c.top_logprobs
                ] if req.logprobs else [None] * len(tokens),
                "text_offset": offsets,
            }  # fmt: skip
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
            choice["prompt_token_ids"] = ids
        if req.echo:
            choice["text"] = tokenizer.decode(ids, skip_special_tokens=False) + choice["text"]
        return {
            "id": f"cmpl-{secrets.token_hex(8)}", "object": "text_completion",
            "created": int(time.time()), "model": model_name, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(c.token_ids),
                      "total_tokens": len(ids) + len(c.token_ids)},
        }  # fmt: skip

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatCompletionRequest):
        if req.n != 1:
            raise HTTPException(400, "only n=1 is supported")
        try:
            ids = tokenizer.apply_chat_template(
                req.messages, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # noqa: BLE001 - a malformed message list is the caller's error
            raise HTTPException(400, f"cannot render messages: {exc}") from exc
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"]
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        top_k = (req.top_logprobs or 0) if req.logprobs else 0
        c = generate(ids, max_tokens, req.temperature, req.top_p, req.seed, top_k)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        c, stop_reason = _apply_stop(tokenizer, c, stops, True)
        body_ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] == eos else c.token_ids
        text = tokenizer.decode(body_ids, skip_special_tokens=False)
        if stop_reason is not None:
            text = text[: text.find(stop_reason)]
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": c.finish_reason, "logprobs": None}  # fmt: skip
        if req.logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": token_str(t, False), "logprob": lp,
                     "top_logprobs": [{"token": token_str(a, False), "logprob": b}
                                      for a, b in (top.items() if top else [])]}
                    for t, lp, top in zip(c.token_ids, c.logprobs,
                                          c.top_logprobs or [None] * len(c.token_ids),
                                          strict=True)
                ]
            }  # fmt: skip
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
            choice["prompt_token_ids"] = ids
        return {
            "id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion",
            "created": int(time.time()), "model": model_name, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(c.token_ids),
                      "total_tokens": len(ids) + len(c.token_ids)},
        }  # fmt: skip

    return app


def serve(model, tokenizer, host: str = "127.0.0.1", port: int = 8000, model_name: str = "policy"):
    """Run the server in this thread until interrupted."""
    import uvicorn

    uvicorn.run(create_app(model, tokenizer, model_name), host=host, port=port, log_level="warning")
