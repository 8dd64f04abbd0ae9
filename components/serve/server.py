"""`agentrl serve`: an OpenAI-compatible HTTP server for a local checkpoint (FastAPI + uvicorn).

The laptop stand-in for `vllm serve`: the rollout engine's OpenAI backend talks to either
unchanged. Endpoints: GET /v1/models, POST /v1/completions (prompt as a string or a list
of token ids), POST /v1/chat/completions (messages through the tokenizer's chat template).
Responses carry vLLM's extension fields: `token_ids` / `prompt_token_ids` with
`return_token_ids`, "token_id:{id}" strings in `logprobs.tokens` with
`return_tokens_as_token_ids` (on the chat endpoint `prompt_token_ids` is at the top level,
as vLLM puts it). Log-probs are log softmax(logits / T) of the sampled tokens (T = 1 when
greedy), the same numbers the in-process backend stores and vLLM returns with
`--logprobs-mode processed_logprobs`; `top_logprobs` holds the top k and the sampled token
when it is not among them (vLLM's rule). A response's `model` is the name of the policy
version that answered. Errors are vLLM's body, `{"error": {message, type, param, code}}`.

Policy versions (`versions.py`), with `--allow-runtime-updates` (off by default, like vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING): `POST /v1/load_lora_adapter`, `POST
/v1/unload_lora_adapter` (vLLM's) and `POST /update_weights_from_disk` (SGLang's; vLLM has
no stable equivalent). The chat endpoint ends a turn at the checkpoint's own end-of-turn
token (its chat template's, `chat.end_of_turn_id`), not ours.

Batching: requests that arrive together (within `batch_window_s`) or while a batch runs are
generated together in the next batch, one `generate` call per policy version and sampling
setting: static batching of concurrent requests (a batch runs until its longest row ends),
not vLLM's continuous batching, which also admits requests into a running batch. Each
request draws from its own stream seeded by its `seed` (as vLLM seeds each request), so
what it samples does not depend on which requests share its batch (up to the float noise
of padding in the logits). Prompts
sent as messages are rendered with the checkpoint's own chat template (nothing added);
generation ends at the checkpoint's end-of-turn token. Binds 127.0.0.1 unless told
otherwise.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from pydantic import BaseModel, Field

from components.policy.chat import end_of_turn_id
from components.rollout.completion import Completion
from components.rollout.engine import generate_transformers
from components.serve.versions import ServedPolicies, VersionError


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


class LoadLoRARequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRARequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


class UpdateWeightsRequest(BaseModel):
    model_path: str
    weight_version: str | None = None  # the served name of the new weights
    load_format: str | None = None  # accepted for SGLang compatibility; safetensors only


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
                policy_version=completion.policy_version,
            )  # fmt: skip
            return cut, hit[1]
    return completion, None


def create_app(
    model, tokenizer, model_name: str = "policy", runtime_updates: bool = False,
    batch_window_s: float = 0.01, max_batch: int = 32,
):  # fmt: skip
    """The FastAPI app serving `model` (already loaded) as `model_name`; with
    `runtime_updates`, the adapter and weight-reload endpoints too. Requests arriving within
    `batch_window_s` of each other (or while a batch runs) share a batch of <= `max_batch`."""
    from fastapi import FastAPI, HTTPException, Request

    app = FastAPI(title="agentrl serve")
    context = getattr(model.config, "max_position_embeddings", None)
    model.eval()
    policies = ServedPolicies(model, model_name)
    generate = _generator(policies, tokenizer, context, batch_window_s, max_batch)

    @app.exception_handler(VersionError)
    def version_error(_request: Request, exc: VersionError):
        return _error(str(exc), exc.status)

    @app.exception_handler(HTTPException)
    def http_error(_request: Request, exc: HTTPException):
        return _error(str(exc.detail), exc.status_code)

    @app.get("/v1/models")
    def models():
        def card(name: str, parent: str | None, root: str) -> dict:
            return {"id": name, "object": "model", "created": 0, "owned_by": "agentrl",
                    "root": root, "parent": parent, "max_model_len": context}  # fmt: skip

        base = policies.base_name
        cards = [card(base, None, base)]
        cards += [card(n, base, path) for n, (_, path) in policies.adapters.items()]
        return {"object": "list", "data": cards}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        return _completion(req, tokenizer, generate)

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatCompletionRequest):
        return _chat_completion(req, tokenizer, generate)

    if runtime_updates:
        _add_update_routes(app, policies)
    return app


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError",
                500: "InternalServerError"}  # fmt: skip


def _error(message: str, status: int):
    """vLLM's error body."""
    from fastapi.responses import JSONResponse

    kind = _ERROR_TYPES.get(status, "Error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status
    )


def _add_update_routes(app, policies: ServedPolicies) -> None:
    """vLLM's runtime LoRA endpoints and SGLang's weight reload (versions.py)."""
    from fastapi.responses import PlainTextResponse

    @app.post("/v1/load_lora_adapter")
    def load_lora_adapter(req: LoadLoRARequest):
        policies.load_adapter(req.lora_name, req.lora_path, req.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    def unload_lora_adapter(req: UnloadLoRARequest):
        policies.unload_adapter(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    @app.post("/update_weights_from_disk")
    def update_weights_from_disk(req: UpdateWeightsRequest):
        from fastapi.responses import JSONResponse

        try:
            name = policies.reload_weights(req.model_path, req.weight_version)
        except VersionError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, exc.status)
        return {"success": True, "message": f"serving {req.model_path} as {name}",
                "weight_version": name}  # fmt: skip


@dataclass
class _Request:
    name: str | None
    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    top_k: int
    done: Future


class _Batcher:
    """One thread that generates the queued requests in batches (see the module docstring)."""

    def __init__(self, policies: ServedPolicies, tokenizer, window_s: float, max_batch: int):
        self.policies, self.tokenizer = policies, tokenizer
        self.window_s, self.max_batch = window_s, max_batch
        self.queue: queue.Queue[_Request] = queue.Queue()
        threading.Thread(target=self._loop, name="agentrl-serve-batcher", daemon=True).start()

    def submit(self, request: _Request) -> Completion:
        self.queue.put(request)
        return request.done.result()

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.queue.get(timeout=max(deadline - time.monotonic(), 0)))
                except queue.Empty:
                    break
            groups: dict[tuple, list[_Request]] = {}
            for r in batch:
                groups.setdefault((r.name, r.temperature, r.top_p), []).append(r)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[_Request]) -> None:
        first = group[0]
        try:
            with self.policies.selected(first.name) as (model, answered):
                completions = generate_transformers(
                    model, self.tokenizer, [r.ids for r in group], [r.max_tokens for r in group],
                    temperature=first.temperature, top_p=first.top_p, seed=[r.seed for r in group],
                    top_logprobs=max(r.top_k for r in group),
                )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - each waiting request gets the error
            for r in group:
                r.done.set_exception(exc)
            return
        for r, c in zip(group, completions, strict=True):
            c.policy_version = answered
            c.top_logprobs = [dict(list(top.items())[: r.top_k]) for top in c.top_logprobs]
            r.done.set_result(c)


def _generator(policies: ServedPolicies, tokenizer, context: int | None, batch_window_s: float,
               max_batch: int):  # fmt: skip
    """generate(model name, ids, max_tokens, temperature, top_p, seed, top_k) -> Completion
    (its policy_version the name that answered), batched with concurrent requests; the
    completion is cut to fit the context, a prompt that does not is a 400, an unknown model
    a 404."""
    from fastapi import HTTPException

    batcher = _Batcher(policies, tokenizer, batch_window_s, max_batch)

    def generate(name, ids: list[int], max_tokens: int, temperature, top_p, seed, top_k: int):
        if not ids:
            raise HTTPException(400, "empty prompt")
        if context is not None and len(ids) + max_tokens > context:
            if len(ids) >= context:
                raise HTTPException(400, f"prompt of {len(ids)} tokens exceeds context {context}")
            max_tokens = context - len(ids)
        if any(not 0 <= t < len(tokenizer) for t in ids):
            raise HTTPException(400, "prompt token id out of range")
        if name not in (None, "") and name not in policies.names():
            raise VersionError(404, f"The model `{name}` does not exist.")
        seed = secrets.randbits(31) if seed is None else seed
        return batcher.submit(_Request(name, ids, max_tokens, temperature, top_p, seed, top_k,
                                       Future()))  # fmt: skip

    return generate


def _with_sampled(top: dict, token: int, logprob: float) -> dict:
    """vLLM's top_logprobs: the top k, and the sampled token when it is not among them."""
    return top if token in top else {**top, token: logprob}


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


def _completion(req: CompletionRequest, tokenizer, generate) -> dict:
    """POST /v1/completions."""
    from fastapi import HTTPException

    if req.n != 1:
        raise HTTPException(400, "only n=1 is supported")
    ids = _prompt_ids(req, tokenizer)
    c = generate(
        req.model, ids, req.max_tokens, req.temperature, req.top_p, req.seed, req.logprobs or 0
    )
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
    return _response("text_completion", c.policy_version, choice, ids, c)


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
            {_token_str(tokenizer, t, as_ids): lp
             for t, lp in _with_sampled(top, token, sampled).items()}
            for top, token, sampled in zip(c.top_logprobs, c.token_ids, c.logprobs, strict=True)
        ] if top_k else [None] * len(tokens),
        "text_offset": offsets,
    }  # fmt: skip


def _chat_completion(req: ChatCompletionRequest, tokenizer, generate) -> dict:
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
    c = generate(req.model, ids, max_tokens, req.temperature, req.top_p, req.seed, top_k)
    c, stop_reason = _apply_stop(tokenizer, c, _stops(req.stop), True)
    eos = end_of_turn_id(tokenizer)  # the checkpoint's own (its template's), not ours
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
                                  for a, b in (top or {}).items()]}
                for t, lp, top in zip(c.token_ids, c.logprobs,
                                      c.top_logprobs or [None] * len(c.token_ids), strict=True)
            ]
        }  # fmt: skip
    body = _response("chat.completion", c.policy_version, choice, ids, c)
    if req.return_token_ids:  # vLLM: generated ids in the choice, the prompt's at the top
        choice["token_ids"] = c.token_ids
        body["prompt_token_ids"] = ids
    return body


def serve(
    model, tokenizer, host: str = "127.0.0.1", port: int = 8000, model_name: str = "policy",
    runtime_updates: bool = False,
):  # fmt: skip
    """Run the server in this thread until interrupted. Under a command's signal handler
    (components/shutdown.py: `agentrl serve`) Ctrl-C or SIGTERM ends the process at once,
    each client in flight seeing its connection close: uvicorn's own handlers would first
    wait for every request in flight, a whole generation (minutes on a real model; 28 s
    for 8 requests of 1000 tokens on a tiny one, niced on a busy machine)."""
    import sys

    import uvicorn

    from components import shutdown

    app = create_app(model, tokenizer, model_name, runtime_updates)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    if shutdown.handles_signals():
        server = _server_leaving_signals_alone(config)
    else:
        server = uvicorn.Server(config)
    server.run()
    if not server.started:  # uvicorn.run's own rule (its port taken: the error is logged)
        sys.exit(3)


def _server_leaving_signals_alone(config):
    """A uvicorn Server that keeps the signal handlers in place (it would take them)."""
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)
