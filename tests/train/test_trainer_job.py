"""The k8s trainer Job (infra/base/trainer.yaml) runs the training stages: its torchrun
arguments, with the Job's env values put in as Kubernetes does ($(VAR)), are a command line
the stage accepts, for sft, dpo and grpo with their input flags. Each stage is stopped where
it hands its settings to the training function."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


class Seen(Exception):
    pass


def _job_argv(env: dict) -> list[str]:
    docs = list(yaml.safe_load_all((REPO / "infra" / "base" / "trainer.yaml").read_text()))
    (job,) = [d for d in docs if d["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    values = {e["name"]: e.get("value", "") for e in container["env"]}
    values.update(env, JOB_COMPLETION_INDEX="0")  # set by Kubernetes on an indexed Job
    args = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]
    assert container["command"] == ["python", "-m", "torch.distributed.run"]
    module = args.index("-m")
    assert args[module + 1] == "components.cli"
    return args[module + 2 :]


@pytest.mark.parametrize("stage, flag", [("sft", "--records"), ("dpo", "--samples"),
                                         ("grpo", "--tasks")])  # fmt: skip
def test_the_trainer_job_runs_each_training_stage(
    stage, flag, tiny_policy, expert_records, failed_records, tmp_path, monkeypatch
):
    import components.train.dpo as dpo
    import components.train.grpo.cli as grpo
    import components.train.sft as sft
    from components.cli import main as agentrl
    from components.policy.model import save_policy
    from components.tasks.generate import generate_suite

    policy = save_policy(*tiny_policy, tmp_path / "policy")
    records = tmp_path / "samples.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in expert_records + failed_records))
    inputs = {"--records": records, "--samples": records, "--tasks": tmp_path / "tasks"}
    if stage == "grpo":
        generate_suite(tmp_path / "tasks", 3, 0)
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"grpo": {"iterations": 1}, "dpo": {"max_steps": 1}}))
    for module, name in ((sft, "train_sft"), (dpo, "train_dpo"), (grpo, "train_grpo")):
        monkeypatch.setattr(module, name, lambda *a, **k: (_ for _ in ()).throw(Seen()))
    env = {"STAGE": stage, "PRESET": str(preset), "POLICY": str(policy), "INPUT_FLAG": flag,
           "INPUT": str(inputs[flag]), "OUT": str(tmp_path / "out")}  # fmt: skip
    argv = _job_argv(env)
    assert argv[:2] == ["train", stage]
    with pytest.raises(Seen):
        agentrl(argv)


def test_a_stage_on_a_multi_device_pod_runs_itself_as_ranks(monkeypatch):
    """AGENTRL_NPROC_PER_NODE (the preset's launcher.env, configs/gpu-cluster.yaml) makes
    a stage started as one process run itself under torchrun; a rank never relaunches."""
    import subprocess

    from components.train.parallel import relaunch_as_ranks

    seen = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: seen.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))  # fmt: skip
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("AGENTRL_NPROC_PER_NODE", raising=False)
    assert relaunch_as_ranks(["train", "grpo", "--out", "x"]) is None and not seen
    monkeypatch.setenv("AGENTRL_NPROC_PER_NODE", "8")
    assert relaunch_as_ranks(["train", "grpo", "--out", "x"]) == 0
    assert seen[0][1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8",
                           "-m", "components.cli", "train", "grpo", "--out", "x"]  # fmt: skip
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert relaunch_as_ranks(["train", "grpo"]) is None and len(seen) == 1
