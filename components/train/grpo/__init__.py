"""GRPO on multi-turn sandboxed episodes, as a recipe and its parts:

- recipe.py: `train_grpo` and `GRPORecipe` (state built from the configs; the iterations,
  checkpoints, metrics), with the algorithm's own part (update, checkpoint state) passed in
  as an `Algorithm`: `GRPO` there, `PPO` in ../ppo.py;
- sources.py: which tasks an iteration trains on and where its episodes come from
  (in-process, on a server, or ahead in a rollout process: ../async_rollouts.py; the task
  stream and dynamic sampling: ../task_stream.py);
- curriculum.py: pass rates of a screen, and the task order they give;
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
from components.train.grpo.curriculum import curriculum_order, pass_rates, write_pass_rates
from components.train.grpo.recipe import (
    GRPO,
    Algorithm,
    GRPORecipe,
    GRPOResult,
    Steps,
    config_hash,
    train_grpo,
)
from components.train.grpo.sources import drop_stale
from components.train.grpo.update import collate_rollouts
from components.train.task_stream import informative_groups, pick_tasks

__all__ = [
    "GRPO",
    "Algorithm",
    "GRPORecipe",
    "GRPOResult",
    "Steps",
    "collate_rollouts",
    "config_hash",
    "curriculum_order",
    "drop_stale",
    "informative_groups",
    "main_grpo",
    "pass_rates",
    "per_token",
    "pick_tasks",
    "rollout_rewards",
    "rollout_turn_advantages",
    "token_turns",
    "train_grpo",
    "write_pass_rates",
]
