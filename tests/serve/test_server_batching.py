"""`agentrl serve` batches concurrent requests (one generate call for the requests that
arrive together) and answers each as it would alone: greedy ids equal the in-process batch,
each request cut at its own max_tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from components.policy.chat import prompt_ids
from components.rollout.engine import generate_transformers
from components.serve import server


def test_concurrent_requests_share_one_generate_call(policy, monkeypatch):
    from fastapi.testclient import TestClient

    model, tokenizer = policy
    calls = []
    real = server.generate_transformers

    def spy(model, tokenizer, prompts, caps, **kwargs):
        calls.append(len(prompts))
        return real(model, tokenizer, prompts, caps, **kwargs)

    monkeypatch.setattr(server, "generate_transformers", spy)
    client = TestClient(server.create_app(model, tokenizer, batch_window_s=0.5))
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": f"Fix test {i}."}])
               for i in range(4)]  # fmt: skip
    caps = [3, 5, 7, 9]

    def ask(i: int) -> dict:
        return client.post("/v1/completions", json={
            "model": "policy", "prompt": prompts[i], "max_tokens": caps[i], "temperature": 0,
            "logprobs": 1, "return_token_ids": True,
        }).json()  # fmt: skip

    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(ask, range(4)))
    assert calls == [4]
    local = generate_transformers(model, tokenizer, prompts, caps, temperature=0.0, top_p=1.0,
                                  seed=0)  # fmt: skip
    for body, c, cap in zip(bodies, local, caps, strict=True):
        choice = body["choices"][0]
        assert choice["token_ids"] == c.token_ids and len(c.token_ids) <= cap
    # Different sampling settings are separate calls of one batch round.
    calls.clear()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda t: client.post("/v1/completions", json={
            "prompt": prompts[0], "max_tokens": 2, "temperature": t}).json(), [0.0, 1.0]))  # fmt: skip
    assert calls == [1, 1]


def test_an_unknown_model_is_vllms_404(policy):
    from fastapi.testclient import TestClient

    model, tokenizer = policy
    client = TestClient(server.create_app(model, tokenizer))
    r = client.post("/v1/completions", json={"model": "nope", "prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `nope` does not exist.",
                                 "type": "NotFoundError", "param": None, "code": 404}  # fmt: skip
