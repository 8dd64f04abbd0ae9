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
from components.rollout.completion import Completion
from components.rollout.engine import generate_transformers


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
    from fastapi import FastAPI

    app = FastAPI(title="agentrl serve")
    context = getattr(model.config, "max_position_embeddings", None)
    generate = _generator(model, tokenizer, context)
    model.eval()

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
        return _completion(req, tokenizer, generate, model_name)

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatCompletionRequest):
        return _chat_completion(req, tokenizer, generate, model_name)

    return app


def _generator(model, tokenizer, context: int | None):
    """generate(ids, max_tokens, temperature, top_p, seed, top_k) -> Completion, one request
    at a time; the completion is cut to fit the context, a prompt that does not is a 400."""
    from fastapi import HTTPException

    lock = threading.Lock()

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

    return generate


def _token_str(tokenizer, t: int, as_ids: bool) -> str:
    return f"token_id:{t}" if as_ids else tokenizer.decode([t], skip_special_tokens=False)


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _prompt_ids(req: CompletionRequest, tokenizer) -> list[int]:
    """The one prompt of a completion request as token ids (text goes through the tokenizer)."""
    from fastapi import HTTPException

    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
        if len(prompt) != 1:
            raise HTTPException(400, "one prompt per request")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(prompt)


def _response(kind: str, model_name: str, choice: dict, ids: list[int], c: Completion) -> dict:
    """The OpenAI envelope of one choice: id, object type, model and token usage."""
    prefix = {"text_completion": "cmpl", "chat.completion": "chatcmpl"}[kind]
    return {
        "id": f"{prefix}-{secrets.token_hex(8)}", "object": kind,
        "created": int(time.time()), "model": model_name, "choices": [choice],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(c.token_ids),
                  "total_tokens": len(ids) + len(c.token_ids)},
    }  # fmt: skip


def _completion(req: CompletionRequest, tokenizer, generate, model_name: str) -> dict:
    """POST /v1/completions."""
    from fastapi import HTTPException

    if req.n != 1:
        raise HTTPException(400, "only n=1 is supported")
    ids = _prompt_ids(req, tokenizer)
    c = generate(ids, req.max_tokens, req.temperature, req.top_p, req.seed, req.logprobs or 0)
    c, stop_reason = _apply_stop(tokenizer, c, _stops(req.stop), req.skip_special_tokens)
    text = tokenizer.decode(c.token_ids, skip_special_tokens=req.skip_special_tokens)
    if stop_reason is not None and not req.include_stop_str_in_output:
        text = text[: text.find(stop_reason)]
    choice = {"index": 0, "text": text, "finish_reason": c.finish_reason,
              "stop_reason": stop_reason, "logprobs": None}  # fmt: skip
    if req.logprobs is not None:
        choice["logprobs"] = _completion_logprobs(
            tokenizer, c, req.return_tokens_as_token_ids, req.logprobs
        )
    if req.return_token_ids:
        choice["token_ids"] = c.token_ids
        choice["prompt_token_ids"] = ids
    if req.echo:
        choice["text"] = tokenizer.decode(ids, skip_special_tokens=False) + choice["text"]
    return _response("text_completion", model_name, choice, ids, c)


def _completion_logprobs(tokenizer, c: Completion, as_ids: bool, top_k: int) -> dict:
    """The legacy completions `logprobs` object (tokens, their log-probs, top-k, offsets)."""
    tokens = [_token_str(tokenizer, t, as_ids) for t in c.token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": c.logprobs,
        "top_logprobs": [
            {_token_str(tokenizer, t, as_ids): lp for t, lp in top.items()}
            for top in c.top_logprobs
        ] if top_k else [None] * len(tokens),
        "text_offset": offsets,
    }  # fmt: skip


def _chat_completion(req: ChatCompletionRequest, tokenizer, generate, model_name: str) -> dict:
    """POST /v1/chat/completions."""
    from fastapi import HTTPException

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
    c, stop_reason = _apply_stop(tokenizer, c, _stops(req.stop), True)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    body_ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] == eos else c.token_ids
    text = tokenizer.decode(body_ids, skip_special_tokens=False)
    if stop_reason is not None:
        text = text[: text.find(stop_reason)]
    choice = {"index": 0, "message": {"role": "assistant", "content": text},
              "finish_reason": c.finish_reason, "logprobs": None}  # fmt: skip
    if req.logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": _token_str(tokenizer, t, False), "logprob": lp,
                 "top_logprobs": [{"token": _token_str(tokenizer, a, False), "logprob": b}
                                  for a, b in (top.items() if top else [])]}
                for t, lp, top in zip(c.token_ids, c.logprobs,
                                      c.top_logprobs or [None] * len(c.token_ids), strict=True)
            ]
        }  # fmt: skip
    if req.return_token_ids:
        choice["token_ids"] = c.token_ids
        choice["prompt_token_ids"] = ids
    return _response("chat.completion", model_name, choice, ids, c)


def serve(model, tokenizer, host: str = "127.0.0.1", port: int = 8000, model_name: str = "policy"):
    """Run the server in this thread until interrupted."""
    import uvicorn

    uvicorn.run(create_app(model, tokenizer, model_name), host=host, port=port, log_level="warning")
