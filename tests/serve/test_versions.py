"""Policy versions on `agentrl serve` (the real command line, loopback, free port) and, in
the vllm tier, on real vLLM: vLLM's runtime LoRA endpoints, the full-weight reload (ours;
vLLM has none), atomic loads, and the trainer's policy sync.

"Equal to in-process" means: greedy token ids from the server equal `generate_transformers`
on the same weights in this process, and the log-probs agree to 1e-4.
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

from components.policy.chat import prompt_ids
from components.rollout.engine import generate_transformers
from components.rollout.openai_backend import OpenAICompletionsClient
from components.rollout.policy_sync import PolicySync, PolicySyncError, version_number
from tests.serve.conftest import perturbed
from tests.serve.served import ENGINES, running_server

PROMPT = [{"role": "user", "content": "Fix the failing test in mathx.py."}]


def greedy(url: str, name: str, ids: list[int]):
    client = OpenAICompletionsClient(url, name, timeout_s=30, max_retries=0)
    return client.complete(ids, 12, temperature=0.0, top_p=1.0, seed=0)


def local_greedy(model, tokenizer, ids: list[int]):
    (c,) = generate_transformers(model, tokenizer, [ids], [12], temperature=0.0, top_p=1.0, seed=0)
    return c


def assert_same(served, local):
    assert not served.error, served.error
    assert served.token_ids == local.token_ids
    assert max(abs(a - b) for a, b in zip(served.logprobs, local.logprobs, strict=True)) < 1e-4


@pytest.fixture(scope="module", params=ENGINES)
def lora_server(checkpoint, request):
    with running_server(checkpoint, engine=request.param) as url:
        yield url


def test_lora_versions_are_served_by_name(policy, adapters, lora_server):
    model, tokenizer = policy
    ids = prompt_ids(tokenizer, PROMPT)
    url = lora_server
    sync = PolicySync(url, "lora", retries=0)
    sync.sync("run-v1", adapters[1][1])
    sync.sync("run-v2", adapters[2][1])
    cards = {m["id"]: m for m in httpx.get(f"{url}/models", timeout=10).json()["data"]}
    assert set(cards) == {"policy", "run-v1", "run-v2"} and cards["run-v1"]["parent"] == "policy"
    outputs = {}
    for version in (1, 2):
        served = greedy(url, f"run-v{version}", ids)
        assert served.policy_version == f"run-v{version}"
        assert_same(served, local_greedy(adapters[version][0], tokenizer, ids))
        outputs[version] = served.token_ids
    assert outputs[1] != outputs[2]  # the versions really differ
    base = greedy(url, "policy", ids)  # the base still answers, adapters off
    assert_same(base, local_greedy(model, tokenizer, ids))
    # vLLM's semantics: a second load of a name is a 400 unless in place; unload; 404 after.
    r = httpx.post(f"{url}/load_lora_adapter", timeout=30,
                   json={"lora_name": "run-v1", "lora_path": str(adapters[2][1])})  # fmt: skip
    assert r.status_code == 400 and "already been loaded" in r.text
    sync.sync("run-v1", adapters[2][1])  # load_inplace: run-v1 now holds v2's weights
    assert greedy(url, "run-v1", ids).token_ids == outputs[2]
    for name in ("run-v1", "run-v2"):
        sync.unload(name)
    assert sync.served() == ["policy"]
    gone = greedy(url, "run-v2", ids)
    assert gone.error and "404" in gone.error
    assert version_number("run-v2") == 2 and version_number("policy") is None


def test_a_failed_adapter_load_keeps_the_old_version(policy, adapters, lora_server, tmp_path):
    """A folder missing one adapter tensor, or with a truncated weights file, is refused
    whole: the name keeps serving its previous weights, nothing half-loaded answers."""
    from safetensors.torch import load_file, save_file

    _, tokenizer = policy
    ids = prompt_ids(tokenizer, PROMPT)
    url = lora_server
    sync = PolicySync(url, "lora", retries=0)
    sync.sync("keep-v1", adapters[1][1])
    before = greedy(url, "keep-v1", ids).token_ids

    partial = tmp_path / "partial"
    shutil.copytree(adapters[2][1], partial)
    state = load_file(partial / "adapter_model.safetensors")
    state.pop(sorted(state)[0])
    save_file(state, partial / "adapter_model.safetensors")
    truncated = tmp_path / "truncated"
    shutil.copytree(adapters[2][1], truncated)
    data = (truncated / "adapter_model.safetensors").read_bytes()
    (truncated / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])

    for broken in (partial, truncated):  # vLLM: HTTP 500 "... add_lora method failed ..."
        with pytest.raises(PolicySyncError, match="failed") as info:
            sync.sync("keep-v1", broken)
        assert "\n" not in str(info.value) and "keep-v1" in str(info.value)
        with pytest.raises(PolicySyncError):
            sync.sync("never-v3", broken)
        assert greedy(url, "keep-v1", ids).token_ids == before
        assert sorted(sync.served()) == ["keep-v1", "policy"]
    sync.unload("keep-v1")


def test_sync_retries_until_the_version_appears(adapters, lora_server, tmp_path):
    """The first tries fail (the folder is not there yet); a retry succeeds."""
    late = tmp_path / "late"
    timer = threading.Timer(0.4, shutil.copytree, (adapters[1][1], late))
    timer.start()
    try:
        PolicySync(lora_server, "lora", retries=4, backoff_s=0.2).sync("late-v1", late)
    finally:
        timer.join()
    assert "late-v1" in PolicySync(lora_server, "lora").served()
    PolicySync(lora_server, "lora").unload("late-v1")


@pytest.mark.parametrize("engine", ENGINES)
def test_full_weight_reload_is_atomic_and_renames(policy, adapters, checkpoint, tmp_path, engine):
    """update_weights_from_disk: the new weights serve under their version name (the old
    name is a 404), equal to in-process; a broken snapshot leaves the old weights serving,
    and so does a broken adapter loaded first (the server is back to the plain model).
    vLLM has no such endpoint: the sync stops at once with one line saying so."""
    from safetensors.torch import load_file, save_file

    model, tokenizer = policy
    partial = tmp_path / "partial-adapter"
    shutil.copytree(adapters[1][1], partial)
    state = load_file(partial / "adapter_model.safetensors")
    state.pop(sorted(state)[-1])
    save_file(state, partial / "adapter_model.safetensors")
    ids = prompt_ids(tokenizer, PROMPT)
    new = perturbed(model, seed=7, scale=0.2)
    new.save_pretrained(tmp_path / "v1")
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "v1", broken)
    state = load_file(broken / "model.safetensors")
    state.pop(sorted(state)[-1])
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})

    with running_server(checkpoint, engine=engine) as url:
        sync = PolicySync(url, "full", retries=3, backoff_s=10)
        with pytest.raises(PolicySyncError, match="failed"):
            PolicySync(url, "lora", retries=0).sync("bad-v0", partial)
        old = greedy(url, "policy", ids)
        assert_same(old, local_greedy(model, tokenizer, ids))
        if engine == "vllm":
            started = time.monotonic()
            with pytest.raises(PolicySyncError, match="no full-weight reload") as info:
                sync.sync("run-v1", tmp_path / "v1")
            assert "\n" not in str(info.value) and time.monotonic() - started < 10  # no retry
            assert sync.served() == ["policy"]
            assert greedy(url, "policy", ids).token_ids == old.token_ids
            return
        sync = PolicySync(url, "full", retries=0)
        with pytest.raises(PolicySyncError, match="missing"):
            sync.sync("run-v1", broken)
        assert sync.served() == ["policy"] and greedy(url, "policy", ids).token_ids == old.token_ids
        sync.sync("run-v1", tmp_path / "v1")
        assert sync.served() == ["run-v1"]
        served = greedy(url, "run-v1", ids)
        assert served.policy_version == "run-v1"
        assert_same(served, local_greedy(new, tokenizer, ids))
        assert served.token_ids != old.token_ids
        stale = greedy(url, "policy", ids)
        assert stale.error and "404" in stale.error


def test_updates_are_off_unless_allowed(policy):
    from fastapi.testclient import TestClient

    from components.serve.server import create_app

    model, tokenizer = policy
    client = TestClient(create_app(model, tokenizer))
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
    assert r.status_code == 404


def test_chat_ends_at_the_checkpoints_own_end_of_turn(tmp_path):
    """A Llama-3-style checkpoint ends turns with <|eot_id|>: the chat endpoint stops there
    and leaves it out of the message (it used to look for our <|im_end|>)."""
    from fastapi.testclient import TestClient

    from components.policy.model import load_policy
    from components.serve.server import create_app
    from tests.policy.own_checkpoint import save_llama3_style_checkpoint

    corpus = ["def add(a, b):\n    return a + b\n", "Fix the failing test."] * 20
    model, tokenizer = load_policy(save_llama3_style_checkpoint(tmp_path / "llama", corpus))
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    # Push the end of turn up after the first token: the model answers one token, then stops.
    steps = []

    def after_first(_module, _inputs, logits):
        steps.append(1)
        if len(steps) > 1:
            logits[..., eot] += 1e4
        return logits

    model.lm_head.register_forward_hook(after_first)
    client = TestClient(create_app(model, tokenizer))
    body = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
        "return_token_ids": True,
    }).json()  # fmt: skip
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == eot
    assert len(choice["token_ids"]) == 2
    assert "<|eot_id|>" not in choice["message"]["content"]


@pytest.mark.slow  # two servers: ~30 s
def test_sync_reaches_every_replica(adapters, checkpoint, monkeypatch):
    """Two replicas (127.0.0.1 and 127.0.0.2, same port) behind a name that resolves to
    both, as a headless Service does: the sync loads the version on each, and a version
    counts as served only where every replica lists it."""
    import socket

    from components.rollout import policy_sync
    from tests.serve.served import free_port

    port = free_port()
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if host != "replicas":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                for ip in ("127.0.0.1", "127.0.0.2")]  # fmt: skip

    monkeypatch.setattr(policy_sync.socket, "getaddrinfo", resolve)
    with (
        running_server(checkpoint, host="127.0.0.1", port=port) as one,
        running_server(checkpoint, host="127.0.0.2", port=port) as two,
    ):
        sync = PolicySync(one, "lora", retries=0, sync_url=f"http://replicas:{port}/v1")
        assert sync.replicas() == [one, two]
        sync.sync("both-v1", adapters[1][1])
        for url in (one, two):
            assert "both-v1" in PolicySync(url, "lora").served()
        PolicySync(two, "lora").unload("both-v1")  # one replica lost it
        assert sync.served() == ["policy"]
        sync.unload("both-v1")
