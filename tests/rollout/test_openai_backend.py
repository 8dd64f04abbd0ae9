"""OpenAI backend against our real server (`python -m components.serve`, loopback, free port)."""

from __future__ import annotations

import dataclasses
import socket

import httpx
import pytest

from components.env.config import EnvConfig
from components.policy.chat import IM_END, prompt_ids
from components.rollout.config import RolloutConfig
from components.rollout.engine import generate_transformers, sample_episodes
from components.rollout.openai_backend import OpenAICompletionsClient, parse_completion_choice
from components.sandbox.config import SandboxConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GREEDY = RolloutConfig(
    temperature=0.0, max_new_tokens=24, max_episode_tokens=1500, batch_size=2,
    samples_per_task=1, workers=2,
)  # fmt: skip


def test_greedy_rollouts_match_the_in_process_backend(model, tokenizer, tasks, server_url):
    local = sample_episodes(
        tasks, model, tokenizer, GREEDY, EnvConfig(max_steps=2), SandboxConfig()
    )
    config = dataclasses.replace(GREEDY, backend="openai", base_url=server_url)
    remote = sample_episodes(
        tasks, None, tokenizer, config, EnvConfig(max_steps=2), SandboxConfig()
    )
    for a, b in zip(local, remote, strict=True):
        assert not b.infra_failure, b.result.infra_detail
        assert a.input_ids == b.input_ids and a.assistant_mask == b.assistant_mask
        assert a.result.end_reason == b.result.end_reason
        diff = max(
            abs(x - y) for x, y in zip(a.sampling_logprobs, b.sampling_logprobs, strict=True)
        )
        assert diff < 1e-4


def recomputed_logprobs(model, ids: list[int], generated: list[int], temperature: float):
    """log softmax(logits / T) of `generated` after `ids`, in this process: the trainer's
    side of the importance ratio."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids + generated])).logits[0, len(ids) - 1 : -1]
    picked = torch.log_softmax(logits.float() / temperature, -1)
    return picked.gather(1, torch.tensor(generated)[:, None])[:, 0].tolist()


def test_server_endpoints(tokenizer, server_url, model, engine):
    """The endpoint shapes the client and the tools rely on, as real vLLM returns them
    (`agentrl serve` answers the same)."""
    models = httpx.get(f"{server_url}/models", timeout=10).json()
    assert models["data"][0]["id"] == "policy"
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "Fix the failing test."}])
    # Token-id prompt, vLLM's extension fields.
    request = {
        "model": "policy", "prompt": ids, "max_tokens": 8, "temperature": 1.0, "seed": 3,
        "logprobs": 2, "return_token_ids": True, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    body = httpx.post(f"{server_url}/completions", timeout=30, json=request).json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == ids
    assert [f"token_id:{t}" for t in choice["token_ids"]] == choice["logprobs"]["tokens"]
    # top-k plus the sampled token when it is not among them (vLLM's rule).
    for token, top in zip(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"],
                          strict=True):  # fmt: skip
        assert token in top and len(top) in (2, 3)
    completion = parse_completion_choice(choice)
    assert completion.token_ids == choice["token_ids"]
    # Same seed => same sample; its log-probs are the model's, recomputed here.
    again = httpx.post(f"{server_url}/completions", timeout=30, json=request).json()
    assert again["choices"][0]["token_ids"] == completion.token_ids
    local = recomputed_logprobs(model, ids, completion.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(local, completion.logprobs, strict=True)) < 1e-4
    if engine == "agentrl":  # one request alone: the in-process sampler with that seed agrees
        (alone,) = generate_transformers(model, tokenizer, [ids], [8], temperature=1.0,
                                         top_p=1.0, seed=3)  # fmt: skip
        assert alone.token_ids == completion.token_ids
    # String prompt, stop string, plain tokens.
    text = tokenizer.decode(ids, skip_special_tokens=False)
    body = httpx.post(f"{server_url}/completions", timeout=30, json={
        "model": "policy", "prompt": text, "max_tokens": 6, "temperature": 0, "logprobs": 0,
        "stop": [IM_END],
    }).json()  # fmt: skip
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert len(body["choices"][0]["logprobs"]["token_logprobs"]) <= 6
    chat = httpx.post(f"{server_url}/chat/completions", timeout=30, json={
        "model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "logprobs": True, "return_token_ids": True,
    }).json()  # fmt: skip
    message = chat["choices"][0]
    assert message["message"]["role"] == "assistant"
    assert len(message["logprobs"]["content"]) == chat["usage"]["completion_tokens"]
    # vLLM: the chat prompt's ids at the top level, the generated ones in the choice; the
    # prompt is the checkpoint's own chat template, nothing added.
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                             tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert chat["prompt_token_ids"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert len(message["token_ids"]) == chat["usage"]["completion_tokens"]


def test_tempered_logprobs_are_the_trainers_distribution(tokenizer, server_url, model):
    """At T = 0.7 the returned log-probs are log softmax(logits / 0.7) (vLLM with
    --logprobs-mode processed_logprobs; `agentrl serve` the same), the distribution the
    trainer's ratio is computed under; the untempered ones differ."""
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "Fix the failing test."}])
    client = OpenAICompletionsClient(server_url, "policy", timeout_s=30, max_retries=0)
    served = client.complete(ids, 12, temperature=0.7, top_p=1.0, seed=5)
    assert not served.error, served.error
    tempered = recomputed_logprobs(model, ids, served.token_ids, 0.7)
    raw = recomputed_logprobs(model, ids, served.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(tempered, served.logprobs, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(raw, served.logprobs, strict=True)) > 1e-2


def test_server_errors_become_infra_failures(tokenizer, tasks, server_url):
    # A prompt past the model's context: HTTP 400, not retried, an error on the completion.
    client = OpenAICompletionsClient(server_url, "policy", timeout_s=10, max_retries=0)
    bad = client.complete([1] * 5000, 4, temperature=1.0, top_p=1.0, seed=0)
    assert bad.error and "400" in bad.error
    # Nobody listening: retried with backoff, then the episodes are flagged infra failures.
    dead = OpenAICompletionsClient(f"http://127.0.0.1:{free_port()}/v1", "policy",
                                   timeout_s=2, max_retries=1, backoff_s=0.01)  # fmt: skip
    config = dataclasses.replace(GREEDY, backend="openai", base_url=dead.base_url)
    rollouts = sample_episodes(
        tasks, dead, tokenizer, config, EnvConfig(max_steps=2), SandboxConfig()
    )
    assert len(rollouts) == len(tasks)
    for r in rollouts:
        assert r.infra_failure and r.result.reward is None
        assert "gave up after 2 attempts" in r.result.infra_detail


def test_parse_choice_without_token_ids_field():
    choice = {"logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-1.0, -2.0]},
              "finish_reason": "length"}  # fmt: skip
    c = parse_completion_choice(choice)
    assert c.token_ids == [5, 7] and c.logprobs == [-1.0, -2.0]
    with pytest.raises(ValueError):
        parse_completion_choice({"logprobs": {"tokens": ["ab"], "token_logprobs": [-1.0]}})


def test_serve_cli_rejects_a_non_checkpoint(tmp_path, capsys):
    from components.cli import run

    assert run(["serve", "--model", str(tmp_path), "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert "not a checkpoint" in err and err.strip().count("\n") == 0
