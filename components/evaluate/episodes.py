"""One path from a policy to evaluated episodes, for every caller that evaluates one:
`agentrl env eval`, `agentrl evaluate run|safety`, the retrain flow's expert stage and
bench/learning.py.

A policy is named by a string: `model:DIR` (a saved checkpoint, decoded through the rollout
engine in batches, exactly as it samples in training: same chat template, token budget and
decoding constraint) or one of the scripted policies of components/scripted/registry.py (one
episode per task on a thread pool). Scripted fix searches get the tries a model episode
has turns for, so the two are compared at the same budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from components.env.batch_eval import EvalConfig, evaluate_policy
from components.env.config import EnvConfig
from components.env.episode import EpisodeResult
from components.rollout.config import RolloutConfig
from components.sandbox.config import SandboxConfig
from components.scripted.registry import FixStatistics, env_for_policy, make_policy
from components.tasks.task import Task

MODEL_PREFIX = "model:"


def is_model(policy: str) -> bool:
    return policy.startswith(MODEL_PREFIX)


def search_tries(env: EnvConfig) -> int:
    """Fix tries a scripted search gets: every turn of a model's episode after list_fixes."""
    return max(1, env.max_steps - 1)


def scripted_factory(
    policy: str, env: EnvConfig, seed: int, statistics: FixStatistics | None = None
) -> Callable:
    """A factory of fresh scripted policies (fails here, not mid-run, on a bad name)."""
    kwargs = dict(max_tries=search_tries(env), statistics=statistics, max_fixes=env.max_fixes,
                  max_steps=env.max_steps)  # fmt: skip
    make_policy(policy, seed=seed, **kwargs)
    return lambda: make_policy(policy, seed=seed, **kwargs)


def evaluate_model(
    tasks: list[Task],
    policy_dir: str | Path,
    rollout: RolloutConfig,
    env: EnvConfig,
    sandbox: SandboxConfig,
) -> list[EpisodeResult]:
    """`rollout.samples_per_task` episodes per task of a checkpoint, batched through the
    rollout engine (components/evaluate/config.py makes the greedy pass@1 config)."""
    from components.policy.model import load_policy
    from components.rollout.engine import sample_episodes

    model, tokenizer = load_policy(str(policy_dir))
    rollout = dataclasses.replace(rollout, batch_size=min(rollout.batch_size, max(1, len(tasks))))
    rollouts = sample_episodes(tasks, model, tokenizer, rollout, env, sandbox,
                               policy_name=f"model:{Path(policy_dir).name}")  # fmt: skip
    return [r.result for r in rollouts]


# long: one entry for scripted and model policies, which each read a different part of these
def run_policy(
    tasks: list[Task],
    policy: str,
    *,
    rollout: RolloutConfig,
    env: EnvConfig,
    sandbox: SandboxConfig,
    workers: int = 2,
    seed: int = 0,
    statistics: FixStatistics | None = None,
    on_result: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Episodes of `policy` on `tasks`, results in task order (a model's `rollout` settings
    are used as given: pass EvaluationConfig.rollout_config(...) for pass@1)."""
    if is_model(policy):
        results = evaluate_model(tasks, policy.removeprefix(MODEL_PREFIX), rollout, env, sandbox)
        for r in results if on_result else ():
            on_result(r)
        return results
    env = env_for_policy(policy, env)  # a scripted policy plays in its own tool set
    factory = scripted_factory(policy, env, seed, statistics)
    from components.env_service.client import evaluate_remote, require_remote_where_asked

    require_remote_where_asked(env)
    if env.remote:  # every tool and verdict on the environment server (components/env_service/)
        return evaluate_remote(
            tasks, factory, env, workers=workers, seed=seed, on_result=on_result, sandbox=sandbox
        )
    return evaluate_policy(tasks, factory, env, sandbox, EvalConfig(workers=workers, seed=seed),
                           on_result=on_result)  # fmt: skip


def statistics_for(policy: str, tasks_dir: str | Path, env: EnvConfig) -> FixStatistics | None:
    """The train split's fix statistics when `policy` needs them, else None."""
    from components.scripted.registry import NEEDS_STATISTICS, fix_statistics
    from components.tasks.task import load_tasks

    if policy not in NEEDS_STATISTICS:
        return None
    train, _ = load_tasks(tasks_dir, split="train")
    if not train:
        raise ValueError(f"policy {policy!r} needs train tasks in {tasks_dir} for its statistics")
    return fix_statistics(train, env.max_fixes)
