"""The rollout engine driven by a scripted `generate_fn` (no sampling): each turn's call is
fixed by the task and the turn number read back from the prompt, so an episode's tokens and
verdict depend only on the environment: in-process or through the server they must match."""

from __future__ import annotations

import shlex

from components.env.config import EnvConfig
from components.policy.chat import IM_END, format_tool_call
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig

ROLLOUT = RolloutConfig(
    max_new_tokens=600,
    max_episode_tokens=4096,
    batch_size=2,
    samples_per_task=2,
    workers=2,
    temperature=1.0,
    seed=5,
)


def _plan(task) -> list[str]:
    tests = shlex.join(task.test_command)
    return [
        format_tool_call("run_command", {"cmd": tests}),
        format_tool_call("apply_patch", {"patch": task.reference_patch()}),
        "not a tool call",
        format_tool_call("run_command", {"cmd": tests}),
        format_tool_call("finish", {"summary": "fixed"}),
    ]


def scripted_generate(tasks, tokenizer):
    def generate(prompts, caps, seeds, constraint=None):
        out = []
        for prompt in prompts:
            text = tokenizer.decode(prompt, skip_special_tokens=False)
            task = next(t for t in tasks if t.instruction in text)
            turn = text.count("<tool_response>")
            ids = tokenizer(_plan(task)[turn] + IM_END, add_special_tokens=False)["input_ids"]
            out.append(Completion(ids, [-0.25] * len(ids), "stop"))
        return out

    return generate


def sample_scripted(tasks, policy, env: EnvConfig, rollout: RolloutConfig = ROLLOUT):
    model, tokenizer = policy
    return sample_episodes(
        tasks,
        model,
        tokenizer,
        rollout,
        env,
        SandboxConfig(),
        policy_name="scripted",
        generate_fn=scripted_generate(tasks, tokenizer),
    )
