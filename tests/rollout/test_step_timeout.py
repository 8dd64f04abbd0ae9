"""Issue 44 item 7: each episode step is bounded in time in the rollout engine. A tool call
still running past `RolloutConfig.step_timeout_s` ends that episode as the agent's
failure (recorded, verified, rewarded: never an infra failure); the batch goes on without
waiting for it."""

from __future__ import annotations

import json
import os
import time

import pytest

from components.env.config import EnvConfig
from components.policy.chat import IM_END
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig

SLEEP_S = 8.0


def _call(name: str, arguments: dict) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>{IM_END}"


def _first_row_sleeps(tokenizer):
    """Row 0's first turn runs a command that sleeps past the step limit (waiting on the
    sandboxed process, so the GIL is free); every other turn finishes."""
    sleep = _call("run_command", {"cmd": f'python -c "import time; time.sleep({SLEEP_S})"'})
    finish = _call("finish", {})
    turn = {"n": 0}

    def generate(prompts, caps, seed):
        texts = [sleep if turn["n"] == 0 and i == 0 else finish for i in range(len(prompts))]
        turn["n"] += 1
        out = []
        for text, cap in zip(texts, caps, strict=True):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:cap]
            out.append(Completion(ids, [-0.5] * len(ids), "stop"))
        return out

    return generate


def test_step_timeout_is_validated():
    assert RolloutConfig().step_timeout_s >= 120  # above a command's own 60 s wall limit
    with pytest.raises(ValueError, match="step_timeout_s"):
        RolloutConfig(step_timeout_s=0)


def test_a_stuck_step_ends_its_episode_as_the_agents_failure(model, tokenizer, tasks):
    config = RolloutConfig(max_new_tokens=200, max_episode_tokens=1900, batch_size=2,
                           samples_per_task=1, workers=2, step_timeout_s=1.0)  # fmt: skip
    start = time.monotonic()
    stuck, other = sample_episodes(tasks[:2], model, tokenizer, config, EnvConfig(max_steps=3),
                                   SandboxConfig(), generate_fn=_first_row_sleeps(tokenizer))  # fmt: skip
    assert time.monotonic() - start < SLEEP_S  # the batch did not wait on the sleeper
    r = stuck.result
    assert not stuck.infra_failure and r.status == "ok" and r.reward is not None
    assert r.end_reason == "time_limit" and not r.success
    flags = [f for f in r.safety_flags if f["category"] == "resource_limit"]
    assert flags and "step limit of 1 s" in flags[0]["reason"]
    assert r.reward_terms["resource_limit"] < 0
    assert other.result.status == "ok" and other.result.end_reason == "finished"
    _wait_for_the_abandoned_step()


def _wait_for_the_abandoned_step() -> None:
    """The stuck command runs on in its abandoned thread until it ends (its sandbox's own
    limits bound it); wait for its sandbox to go, so no later test of this process sees
    its cgroup (tests/sandbox/test_sandbox.py checks the host is left clean)."""
    from pathlib import Path

    prefix = f"agentrl-sbx-{os.getpid()}-"
    roots = [Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")]
    deadline = time.monotonic() + SLEEP_S + 60
    while time.monotonic() < deadline and any(any(r.glob(prefix + "*")) for r in roots):
        time.sleep(0.2)
