"""Issue 44 item 7: each episode step is bounded in time in the rollout engine. A tool call
still running past `RolloutConfig.step_timeout_s` ends that episode as the agent's
failure (recorded, verified, rewarded: never an infra failure); the batch goes on without
waiting for it."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.policy.chat import IM_END
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig

SLEEP_S = 30.0  # far above the verification time of both episodes on a loaded machine


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


LONG_SLEEP_S = 40.0  # below the sandbox's own 60 s wall limit: only the step limit ends it


def _marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line holds `marker` (any pid namespace)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if marker.encode() in cmdline and not zombie:
            pids.append(int(entry))
    return pids


def test_a_stuck_steps_sandbox_processes_end_with_its_episode(model, tokenizer, tasks,
                                                              monkeypatch, tmp_path):  # fmt: skip
    """The stuck call's command (and anything it started) is killed when the step limit
    passes, not left to run to the sandbox's own wall limit: once sample_episodes returns,
    no process of the episode is alive and its workspace (and its tmpfs) is gone."""
    from components.sandbox import workspace as workspace_module
    from components.tasks.task import load_task

    marker = f"agentrl-stuck-{os.getpid()}-{time.monotonic_ns()}"
    # The program lies in the task's repository (the monitor refuses `python -c` code that
    # starts programs): it sleeps, and so does a child in a session of its own (outside
    # the command's process group); both carry the marker in their command line.
    shutil.copytree(tasks[0].root, tmp_path / "task")
    (tmp_path / "task" / "repo" / "sleeper.py").write_text(
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({LONG_SLEEP_S:g})', "
        "sys.argv[1]], start_new_session=True)\n"
        f"time.sleep({LONG_SLEEP_S:g})\n"
    )  # fmt: skip
    task = load_task(tmp_path / "task")
    sleep = _call("run_command", {"cmd": f"python sleeper.py {marker}"})
    finish = _call("finish", {})
    turn = {"n": 0}

    def generate(prompts, caps, seed):
        texts = [sleep if turn["n"] == 0 and i == 0 else finish for i in range(len(prompts))]
        turn["n"] += 1
        return [Completion(ids := tokenizer(t, add_special_tokens=False)["input_ids"][:cap],
                           [-0.5] * len(ids), "stop") for t, cap in zip(texts, caps, strict=True)]  # fmt: skip

    roots = []
    real_create = workspace_module.Workspace.create

    def create(*args, **kwargs):
        ws = real_create(*args, **kwargs)
        roots.append(ws.root)
        return ws

    monkeypatch.setattr(workspace_module.Workspace, "create", create)
    config = RolloutConfig(max_new_tokens=200, max_episode_tokens=1900, batch_size=2,
                           samples_per_task=1, workers=2, step_timeout_s=3.0)  # fmt: skip
    seen, done = [], threading.Event()
    watcher = threading.Thread(target=_watch, args=(marker, seen, done))
    watcher.start()
    start = time.monotonic()
    try:
        stuck, _ = sample_episodes([task, tasks[1]], model, tokenizer, config,
                                   EnvConfig(max_steps=3), SandboxConfig(), generate_fn=generate)  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert time.monotonic() - start < LONG_SLEEP_S
    assert max(seen, default=0) >= 2, "the command and its child never ran: nothing was tested"
    assert stuck.result.end_reason == "time_limit" and not stuck.infra_failure
    assert _marked_processes(marker) == []  # nothing of the stuck step outlived the episode
    mounts = Path("/proc/self/mountinfo").read_text()
    assert roots and all(not r.exists() and f" {r} " not in mounts for r in roots)


def _watch(marker: str, seen: list[int], done: threading.Event) -> None:
    """How many marked processes were alive, every 0.1 s until `done` (the positive
    control: the command and its child did run while the step was stuck)."""
    while not done.wait(0.1):
        seen.append(len(_marked_processes(marker)))
