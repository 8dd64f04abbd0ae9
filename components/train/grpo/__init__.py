"""GRPO on multi-turn sandboxed episodes, as a recipe in four rooms:

- recipe.py: `train_grpo` and `GRPORecipe` (state built from the configs; the iterations,
  checkpoints, metrics);
- sources.py: which tasks an iteration trains on and where its episodes come from
  (in-process, on a server, or ahead in a rollout process: ../async_rollouts.py);
- advantages.py: group-relative (and per-turn) advantages of the episodes;
- update.py: the PPO-style minibatch update on the stored tokens;
- cli.py: `agentrl train grpo`.
"""

from components.train.grpo.advantages import (
    per_token,
    rollout_rewards,
    rollout_turn_advantages,
    token_turns,
)
from components.train.grpo.cli import main_grpo
from components.train.grpo.recipe import GRPORecipe, GRPOResult, config_hash, train_grpo
from components.train.grpo.sources import drop_stale, pick_tasks
from components.train.grpo.update import collate_rollouts

__all__ = [
    "GRPORecipe",
    "GRPOResult",
    "collate_rollouts",
    "config_hash",
    "drop_stale",
    "main_grpo",
    "per_token",
    "pick_tasks",
    "rollout_rewards",
    "rollout_turn_advantages",
    "token_turns",
    "train_grpo",
]
