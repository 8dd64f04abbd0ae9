"""bench/grpo_vs_trl.py's task, the same for both trainers: the sums a + b, their prompts as
the chat template renders them, the last-integer reward; the starting policy, sampling,
the held-out evaluation and its screen; completions as the `Rollout`s our update trains on;
a trainer's `Run`."""

from __future__ import annotations

import argparse
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------------------
# The task


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str


def problems(max_operand: int, seed: int, held_out: int) -> tuple[list[Problem], list[Problem]]:
    """(training pool, held-out) of every sum a + b with a, b in 1..max_operand, shuffled
    by `seed`: the held-out sums are never trained on."""
    every = [(a, b) for a in range(1, max_operand + 1) for b in range(1, max_operand + 1)]
    random.Random(seed).shuffle(every)
    made = [
        Problem(f"What is {a} + {b}? Answer with the number only.", str(a + b)) for a, b in every
    ]
    return made[held_out:], made[:held_out]


def training_prompts(pool: list[Problem], steps: int, per_step: int, seed: int) -> list[Problem]:
    """steps x per_step prompts, in training order: passes over the pool, each shuffled."""
    rng, out = random.Random(seed + 1), []
    while len(out) < steps * per_step:
        order = list(pool)
        rng.shuffle(order)
        out += order
    return out[: steps * per_step]


def last_number_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's last integer is the answer ("5 + 7 = 12" counts, "12 13"
    does not), else 0.0."""
    numbers = re.findall(r"-?\d+", completion)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


def trl_reward(completions, answer, **_) -> list[float]:
    """last_number_reward in TRL's reward-function signature (conversational completions)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [last_number_reward(t, a) for t, a in zip(texts, answer, strict=True)]


def messages(problem: Problem) -> list[dict]:
    return [{"role": "user", "content": problem.question}]


def prompt_ids(tokenizer, problem: Problem) -> list[int]:
    """The prompt as TRL renders a conversational one: chat template + generation prompt."""
    out = tokenizer.apply_chat_template(
        messages(problem), add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])


# ---------------------------------------------------------------------------------------
# The starting policy


def starting_policy(args: argparse.Namespace, work: Path, texts: list[str]) -> Path:
    """The checkpoint both trainers load: --model, or a tiny from-scratch one saved in work."""
    if args.model != "tiny":
        return Path(args.model)
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy

    config = PolicyConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=512,
        tokenizer_stdlib_bytes=5_000,
        max_position_embeddings=512,
        seed=args.seed,
    )
    return save_policy(*build_policy(config, texts=texts), work / "tiny")


def load_start(start: Path, args: argparse.Namespace):
    """(model, tokenizer) as both trainers start: float32, LoRA adapters added when asked
    (same rank, targets and seeded initialisation for both)."""
    from components.policy.model import load_policy

    model, tokenizer = load_policy(start, dtype="float32")
    if args.lora_r:
        from components.policy.config import LoRAConfig
        from components.policy.lora import add_adapters

        lora = LoRAConfig(r=args.lora_r, alpha=2 * args.lora_r, init_seed=args.seed)
        model = add_adapters(model, lora)
    return model, tokenizer


def sample(model, tokenizer, batch: list[Problem], k: int, args, seed) -> list:
    """k completions of each problem (the rollout engine's sampler), in problem order."""
    from components.rollout.engine import generate_transformers

    prompts = [prompt_ids(tokenizer, p) for p in batch for _ in range(k)]
    return generate_transformers(
        model,
        tokenizer,
        prompts,
        [args.max_completion_length] * len(prompts),
        temperature=args.temperature,
        top_p=1.0,
        seed=seed,
    )


def rewards_of(tokenizer, batch: list[Problem], k: int, completions) -> list[float]:
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    answers = [p.answer for p in batch for _ in range(k)]
    return [last_number_reward(t, a) for t, a in zip(texts, answers, strict=True)]


def evaluate(model, tokenizer, held_out: list[Problem], args) -> list[float]:
    """Mean reward of each held-out problem over --eval-samples samples at the training
    temperature; row i draws from the stream derived from (seed, i) whichever policy it is,
    so two policies are compared on the same random numbers."""
    from components.seeding import derive_seed

    k = args.eval_samples
    seeds = [derive_seed(args.seed, "eval", i) for i in range(len(held_out) * k)]
    model.eval()
    completions = sample(model, tokenizer, held_out, k, args, seeds)
    flat = rewards_of(tokenizer, held_out, k, completions)
    return [statistics.mean(flat[i * k : (i + 1) * k]) for i in range(len(held_out))]


def episode_result(problem: Problem, reward: float, group: str, k: int):
    """The verified-episode record a Rollout carries, for a single-turn completion."""
    from components.env.episode import EpisodeResult

    return EpisodeResult(
        episode_id=f"{group}-{k}",
        task_id=group,
        split="train",
        policy="bench",
        status="ok",
        end_reason="finished",
        success=reward == 1.0,
        reward=reward,
        reward_terms={},
        steps=1,
        tool_calls=0,
        invalid_calls=0,
        safety_flags=[],
        ran_tests=False,
        tests_total=0,
        tests_failed=0,
        changed_files=[],
        tampered_files=[],
        wall_s=0.0,
    )


def as_rollouts(tokenizer, batch: list[Problem], k: int, completions, rewards, step: int):
    """Each completion as the Rollout our update trains on: prompt + sampled ids, the mask
    on the sampled ids only, their sampling log-probs; one group per prompt."""
    from components.rollout.engine import Rollout

    out = []
    for i, (completion, reward) in enumerate(zip(completions, rewards, strict=True)):
        problem, group = batch[i // k], f"{step}-{i // k}"
        prompt = prompt_ids(tokenizer, problem)
        ids = list(completion.token_ids)
        out.append(
            Rollout(
                result=episode_result(problem, reward, group, i % k),
                input_ids=prompt + ids,
                assistant_mask=[0] * len(prompt) + [1] * len(ids),
                sampling_logprobs=[0.0] * len(prompt) + list(completion.logprobs),
                group_id=group,
                sample_index=i % k,
            )
        )
    return out


def screen(per_prompt: list[float], k: int) -> dict:
    """pass@1 and pass@k (k = the samples per prompt) of one evaluation."""
    return {
        "pass@1": statistics.mean(per_prompt),
        f"pass@{k}": statistics.mean(1.0 if r > 0 else 0.0 for r in per_prompt),
    }


@dataclass
class Run:
    """One trainer's run: per step the rewards of its samples and its wall seconds, and the
    held-out evaluation of its final policy."""

    rewards: list[list[float]]
    step_wall: list[float]
    evaluation: list[float]
    train_wall: float
