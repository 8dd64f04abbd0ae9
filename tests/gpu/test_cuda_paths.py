"""The training code paths on a device: rollout sampling, a GRPO update, DPO steps.

Each test runs on "cpu" (default tier, a few seconds) and on "cuda" (`-m gpu`, skipped
without a CUDA device); "cuda-bf16" adds the bfloat16 setting of each path where the code
has one (GRPO / rollout: bf16 parameters, PolicyConfig.dtype; DPO: bf16 autocast,
DPOConfig.bf16).

Self-contained on purpose: tests/gpu/run_on_device.sh runs this file on a machine that has
torch, transformers, tokenizers and numpy but none of the project's other dependencies, so
it imports no other test folder's conftest and nothing that pulls in trl, datasets,
deepspeed, prefect or mlflow (components.train.grpo / dpo / losses / data / config,
components.rollout.engine and components.policy import only torch, transformers,
tokenizers and numpy).

Ids are "cpu" / "cuda" / "cuda-bf16", never a bare "gpu" (see tests/infra/test_manifests.py).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from components.env.episode import EpisodeResult
from components.policy.chat import IM_END
from components.policy.config import PolicyConfig
from components.rollout.config import RolloutConfig
from components.rollout.engine import (
    Rollout,
    environment_turn_ids,
    generate_transformers,
    make_generate_fn,
)
from components.train.config import DPOConfig, GRPOConfig
from components.train.grpo import rollout_rewards, rollout_turn_advantages
from components.train.grpo.update import update_with as _update
from components.train.losses import group_advantages, token_logprobs
from components.train.parallel import Stepper

_GPU = [
    pytest.mark.gpu,
    # tests/conftest.py skips gpu tests without CUDA; this keeps the file safe on its own too.
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICES = [
    pytest.param("cpu", "float32", id="cpu"),
    pytest.param("cuda", "float32", marks=_GPU, id="cuda"),
    pytest.param("cuda", "bfloat16", marks=_GPU, id="cuda-bf16"),
]

# Largest |stored - recomputed| log-prob: the same float32 math in another order (KV cache
# and left padding vs one unpadded forward); bf16 parameters round every matmul.
LOGPROB_ATOL = {("cpu", "float32"): 1e-4, ("cuda", "float32"): 1e-3, ("cuda", "bfloat16"): 5e-2}
# Same for the first ratio pi/pi_old of an update (mean over tokens).
RATIO_ATOL = {"float32": 1e-3, "bfloat16": 5e-2}

TINY = dict(
    hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
    max_position_embeddings=1024, vocab_size=512, tokenizer_stdlib_bytes=20_000, seed=0,
)  # fmt: skip

_TASKS = [
    ("gpu-0001", "mathx", "add", "return a - b", "return a + b"),
    ("gpu-0002", "lists", "last", "return xs[0]", "return xs[-1]"),
]


def _user(module: str) -> dict:
    return {
        "role": "user",
        "content": f"The unit tests in tests/test_{module}.py fail. Fix the bug in {module}.py."
        f"\n\nRepository files: {module}.py, tests/test_{module}.py",
    }


def _env(text: str) -> dict:
    return {"role": "environment", "observation": text, "truncated": False}


def _record(task_id: str, success: bool, events: list[dict]) -> dict:
    return {
        "schema_version": 1, "id": f"{'ok' if success else 'bad'}-{task_id}",
        "task_id": task_id, "source": "oracle" if success else "rollout",
        "task": events[0]["content"], "trajectory": events, "reward": 1.0 if success else -0.3,
        "reward_terms": {"tests_pass": float(success)},
        "metadata": {"split": "train", "success": success, "status": "ok"},
    }  # fmt: skip


def _pair(task_id, module, function, bug, fix) -> dict:
    chosen = [
        _user(module),
        {"role": "assistant", "action": "read_file", "arguments": {"path": f"{module}.py"}},
        _env(f"   1| def {function}(*args):\n   2|     {bug}"),
        {"role": "assistant", "action": "edit_file",
         "arguments": {"path": f"{module}.py", "old": bug, "new": fix}, "content": "Fix it."},
        _env(f"edited {module}.py: replaced 1 occurrence"),
        {"role": "assistant", "action": "finish", "arguments": {"summary": f"Fixed {function}."}},
        _env("episode finished"),
    ]  # fmt: skip
    rejected = [
        _user(module),
        {"role": "assistant", "action": "finish", "arguments": {"summary": "No changes made."}},
        _env("episode finished"),
    ]  # fmt: skip
    return {
        "task_id": task_id,
        "chosen": _record(task_id, True, chosen),
        "rejected": _record(task_id, False, rejected),
    }


PAIRS = [_pair(*t) for t in _TASKS]


@pytest.fixture(autouse=True)
def _one_thread():
    # The CPU variants share a small machine with other work.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> PolicyConfig:
    """The tiny policy's config, its tokenizer trained once (on these transcripts) and saved."""
    from components.policy.model import build_policy

    records = [p[side] for p in PAIRS for side in ("chosen", "rejected")]
    _, tokenizer = build_policy(PolicyConfig(**TINY), records=records)
    path = tmp_path_factory.mktemp("gpu_tokenizer")
    tokenizer.save_pretrained(path)
    return PolicyConfig(**TINY, tokenizer_path=str(path))


def _policy(config: PolicyConfig, device: str, dtype: str):
    """A fresh tiny (model, tokenizer) from `config`, in `dtype`, on `device`."""
    from components.policy.model import build_policy

    model, tokenizer = build_policy(dataclasses.replace(config, dtype=dtype))
    return model.to(device), tokenizer


def _prompts(tokenizer) -> list[list[int]]:
    """Chat prompts of different lengths (the batch is left-padded)."""
    from components.policy.chat import prompt_ids

    long = _user("mathx")
    short = {"role": "user", "content": "Fix lists.py."}
    prompts = [prompt_ids(tokenizer, [e]) for e in (long, short, long)]
    assert len(prompts[0]) - len(prompts[1]) >= 5  # real left padding on row 1
    return prompts


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def _assert_updated(model, before: dict, device: str, dtype: str) -> None:
    params = list(model.parameters())
    assert all(p.device.type == device for p in params)
    assert all(p.dtype == getattr(torch, dtype) for p in params)
    after = _snapshot(model)
    assert all(torch.isfinite(v).all() for v in after.values())
    changed = [k for k, v in after.items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed"


@pytest.mark.parametrize(("device", "dtype"), DEVICES)
def test_rollout_logprobs_match_a_fresh_forward(tiny_config, device, dtype):
    """Sampled ids of a left-padded batch, per-row token caps: each stored log-prob is
    log_softmax(logits / T) at the sampled id of an unpadded forward on prompt + sample."""
    model, tokenizer = _policy(tiny_config, device, dtype)
    prompts = _prompts(tokenizer)
    caps = [12, 6, 12]
    temperature = 0.7  # not 1: the scaling must be the same on both sides
    generate = make_generate_fn(model, tokenizer, RolloutConfig(temperature=temperature))
    completions = generate(prompts, caps, 1234)
    assert model.device.type == device

    atol = LOGPROB_ATOL[(device, dtype)]
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    vocab = model.get_input_embeddings().weight.shape[0]
    for prompt, cap, c in zip(prompts, caps, completions, strict=True):
        assert not c.error and 1 <= len(c.token_ids) <= cap
        assert len(c.logprobs) == len(c.token_ids)
        assert all(0 <= t < vocab for t in c.token_ids)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length")
        ids = torch.tensor([prompt + c.token_ids], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits  # [1, T, V]
        fresh = token_logprobs(logits, ids, temperature=temperature)[0, len(prompt) - 1 :]
        stored = torch.tensor(c.logprobs)
        assert torch.isfinite(stored).all() and (stored <= 0).all()
        diff = (fresh.cpu() - stored).abs().max().item()
        assert diff <= atol, f"stored vs recomputed log-probs differ by {diff:.2e} > {atol:.0e}"

    # The seed alone decides the sample (the device RNG is forked and seeded too).
    again = generate_transformers(
        model, tokenizer, prompts, caps, temperature=temperature, top_p=1.0, seed=1234
    )
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]


def _result(task_id: str, k: int, reward: float) -> EpisodeResult:
    """A finished episode whose verdict is signed as an episode's finish signs it: only
    signed verdicts train (components/verifier/provenance.py)."""
    from components.verifier.provenance import sign_record
    from components.verifier.version import verifier_version

    episode_id = f"gpu-{task_id}-k{k}"
    record = {"id": episode_id, "task_id": task_id, "reward": reward, "reward_terms": {},
              "final_diff": None, "trajectory": [],
              "metadata": {"success": reward > 0, "verifier_version": verifier_version()}}  # fmt: skip
    sign_record(record)
    return EpisodeResult(
        episode_id=episode_id, task_id=task_id, split="train", policy="grpo",
        status="ok", end_reason="finished", success=reward > 0, reward=reward,
        reward_terms={}, steps=2, tool_calls=2, invalid_calls=0, safety_flags=[],
        ran_tests=False, tests_total=0, tests_failed=0, changed_files=[], tampered_files=[],
        wall_s=0.0, step_rewards=[0.0, -0.1 * (k % 2)], record=record,
    )  # fmt: skip


def _sample_rollouts(model, tokenizer, rollout_config: RolloutConfig) -> list[Rollout]:
    """2 groups x G=2 two-turn episodes sampled on the model's device, assembled as the
    engine does: prompt (mask 0), sampled ids (mask 1, their log-probs), an environment
    turn (mask 0), sampled ids again. The sandbox is left out: rewards are set by hand
    (different within each group, so every advantage is non-zero)."""
    prompts = _prompts(tokenizer) + [_prompts(tokenizer)[1]]  # groups: rows 0, 2 and 1, 3
    groups, rewards = ["a", "b", "a", "b"], [1.0, 0.5, 0.0, -0.3]
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    generate = make_generate_fn(model, tokenizer, rollout_config)
    ids = [list(p) for p in prompts]
    mask = [[0] * len(p) for p in prompts]
    logps = [[0.0] * len(p) for p in prompts]
    for turn in range(2):
        caps = [rollout_config.max_new_tokens] * len(ids)
        for i, c in enumerate(generate(ids, caps, 100 + turn)):
            ids[i] += c.token_ids
            mask[i] += [1] * len(c.token_ids)
            logps[i] += c.logprobs
            if turn == 0:
                closed = bool(c.token_ids) and c.token_ids[-1] == eos
                context = environment_turn_ids(tokenizer, "exit code 1", closed)
                ids[i] += context
                mask[i] += [0] * len(context)
                logps[i] += [0.0] * len(context)
    return [
        Rollout(_result(g, k, r), ids[k], mask[k], logps[k], g, k // 2)
        for k, (g, r) in enumerate(zip(groups, rewards, strict=True))
    ]


@pytest.mark.parametrize("turn_credit", [False, True], ids=["episode-adv", "token-adv"])
@pytest.mark.parametrize(("device", "dtype"), DEVICES)
def test_grpo_update_step(tiny_config, device, dtype, turn_credit, tmp_path):
    """Sample on the device, then one GRPO optimizer step (grpo._update: 2 micro-batches
    accumulated, k3 KL to a frozen reference): finite loss, first ratio 1 (the stored
    log-probs are the model's), the parameters move and stay on the device in their dtype.
    token-adv: [B, T] advantages of GRPOConfig.turn_credit (odd samples waste turn 2)."""
    model, tokenizer = _policy(tiny_config, device, dtype)
    rollout_config = RolloutConfig(temperature=1.0, max_new_tokens=8, max_episode_tokens=1024)
    rollouts = _sample_rollouts(model, tokenizer, rollout_config)
    rewards, group_ids, valid = rollout_rewards(rollouts)
    advantages = group_advantages(rewards, group_ids, valid_mask=valid)
    assert valid.all() and (advantages != 0).all()
    if turn_credit:
        advantages = rollout_turn_advantages(rollouts, advantages, valid, group_ids, True)
        assert advantages.dim() == 2

    config = GRPOConfig(
        group_size=2, tasks_per_iteration=2, learning_rate=1e-3, beta=0.05,
        micro_batch_size=2, use_cpu=device == "cpu", output_dir=str(tmp_path),
    )  # fmt: skip
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    before = _snapshot(model)
    model.train()
    metrics = _update(
        Stepper(model, model, optimizer, max_grad_norm=config.max_grad_norm), reference,
        rollouts, advantages, config, rollout_config, tokenizer.pad_token_id,
        torch.device(device), iteration=1,
    )  # fmt: skip

    assert metrics["optimizer_steps"] == 1
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["grad_norm"] > 0
    tol = RATIO_ATOL[dtype]
    assert abs(metrics["ratio"] - 1.0) < tol, metrics  # old_logps = the sampled log-probs
    assert metrics["kl"] < tol, metrics  # reference == policy before the step
    _assert_updated(model, before, device, dtype)


@pytest.mark.parametrize(("device", "dtype"), DEVICES)
def test_dpo_steps(tiny_config, device, dtype, tmp_path):
    """train_dpo on the device (bf16 autocast for "cuda-bf16", float32 parameters): the first
    loss is ln 2 (policy == reference), every loss is finite, the loss falls and the
    parameters move; the trained policy is saved."""
    from components.train.dpo import train_dpo

    model, tokenizer = _policy(tiny_config, device, "float32")
    config = DPOConfig(
        max_steps=4, batch_size=2, learning_rate=1e-3, beta=0.1, max_seq_len=512,
        bf16=dtype == "bfloat16", use_cpu=device == "cpu", output_dir=str(tmp_path / "dpo"),
    )  # fmt: skip
    before = _snapshot(model)
    result = train_dpo(model, None, tokenizer, copy.deepcopy(PAIRS), config)

    assert result.steps == 4 and result.num_pairs == len(PAIRS)
    assert all(math.isfinite(x) for x in result.losses), result.losses
    assert abs(result.losses[0] - math.log(2)) < 1e-3, result.losses
    assert result.losses[-1] < result.losses[0], result.losses
    assert result.margins[-1] > result.margins[0], result.margins
    _assert_updated(model, before, device, "float32")
    assert (tmp_path / "dpo" / "policy" / "config.json").is_file()
