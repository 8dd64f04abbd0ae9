"""SFT until a held-out split's loss stops falling (SFTConfig.eval_fraction): the split is
whole tasks, deterministic and disjoint; patience stops a run whose held-out loss rises and
the saved policy is the best evaluation's; bad settings are one-line config errors. That
eval_fraction 0 trains exactly as before is test_golden_losses.py's test_sft_golden."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from components.cli import run as agentrl
from components.preset import PresetError, load_preset, validate_preset
from components.train.config import SFTConfig
from components.train.data import held_out_split
from components.train.sft import held_out_loss, train_sft


def _config(tmp_path, **overrides) -> SFTConfig:
    """Held-out split of 2 of the 6 tasks, an evaluation every step, patience 1."""
    values = dict(max_steps=10, batch_size=2, learning_rate=1e-3, max_seq_len=768,
                  lr_scheduler="constant", seed=0, use_cpu=True, eval_fraction=0.34,
                  eval_every=1, early_stopping_patience=1, output_dir=str(tmp_path / "sft"))  # fmt: skip
    return SFTConfig(**{**values, **overrides})


def test_the_split_is_whole_tasks_deterministic_and_disjoint(expert_records, failed_records):
    records = expert_records + failed_records  # two episodes of each of 6 tasks
    train, held = held_out_split(records, 0.34, seed=0)
    assert held_out_split(records, 0.34, seed=0) == (train, held)
    shuffled = random.Random(1).sample(records, len(records))
    assert {r["id"] for r in held_out_split(shuffled, 0.34, seed=0)[1]} == {r["id"] for r in held}
    train_tasks, held_tasks = {r["task_id"] for r in train}, {r["task_id"] for r in held}
    assert len(held_tasks) == 2 and len(held) == 4 and not train_tasks & held_tasks
    assert sorted(r["id"] for r in train + held) == sorted(r["id"] for r in records)
    splits = {
        frozenset(r["task_id"] for r in held_out_split(records, 0.34, s)[1]) for s in range(8)
    }
    assert len(splits) > 1  # the seed picks the tasks
    # A record without a task_id is its own episode; at least one task, never all.
    episodes = [{k: v for k, v in r.items() if k != "task_id"} for r in records]
    assert len(held_out_split(episodes, 0.01, seed=0)[1]) == 1
    assert len(held_out_split(episodes, 0.99, seed=0)[0]) == 1
    with pytest.raises(ValueError, match="need >= 2"):
        held_out_split(expert_records[:1], 0.5, seed=0)


def test_a_rising_held_out_loss_stops_and_the_best_steps_weights_are_saved(
    tiny_policy, tiny_config, expert_records, tmp_path
):
    """A learning rate of 0.05 overshoots: the held-out loss rises after the first step, so
    patience 1 stops at step 2 and the result is step 1's weights, which a one-step run of
    the same settings reproduces."""
    from components.policy.model import build_policy, load_policy

    model, tokenizer = tiny_policy
    result = train_sft(model, tokenizer, expert_records, _config(tmp_path, learning_rate=0.05))
    assert result.eval_steps == [1, 2] and result.eval_losses[1] > result.eval_losses[0]
    assert (result.best_step, result.stopped_early, result.steps) == (1, True, 2)
    assert result.best_eval_loss == result.eval_losses[0] and len(result.losses) == 2
    assert (result.num_examples, result.num_eval_examples) == (4, 2)

    saved, _ = load_policy(result.checkpoint_dir)
    one_step, _ = build_policy(tiny_config)  # the same seeded initial weights
    reference = train_sft(one_step, tokenizer, expert_records,
                          _config(tmp_path / "one", learning_rate=0.05, max_steps=1))  # fmt: skip
    assert reference.eval_losses == [result.best_eval_loss]
    best = one_step.state_dict()
    for name, value in saved.state_dict().items():
        assert torch.equal(value, best[name]), name
        assert torch.equal(model.state_dict()[name], value), name  # the model left in place too
    batches = _held_out_batches(expert_records, tokenizer)
    assert held_out_loss(saved, batches, torch.device("cpu"), False) == pytest.approx(
        result.best_eval_loss, rel=1e-6
    )


def _held_out_batches(records, tokenizer) -> list[dict]:
    from components.train.data import collate, sft_examples

    _, held = held_out_split(records, 0.34, seed=0)
    examples = sft_examples(held, tokenizer, 768)
    return [
        collate(examples[i : i + 2], tokenizer.pad_token_id, 32) for i in range(0, len(examples), 2)
    ]


def test_a_falling_held_out_loss_trains_the_whole_budget(tiny_policy, expert_records, tmp_path):
    model, tokenizer = tiny_policy
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = _config(tmp_path, max_steps=4, eval_every=3, mlflow_tracking_uri=tracking)
    result = train_sft(model, tokenizer, expert_records, config)
    assert result.eval_steps == [3, 4] and result.steps == 4 and not result.stopped_early
    assert result.best_step == 4 and result.eval_losses[1] < result.eval_losses[0]

    import mlflow

    client = mlflow.MlflowClient(tracking)
    (run,) = mlflow.search_runs(experiment_names=["agentrl-sft"], output_format="list")
    history = client.get_metric_history(run.info.run_id, "eval_loss")
    assert [(m.step, m.value) for m in history] == list(
        zip([3, 4], result.eval_losses, strict=True)
    )
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == pytest.approx(
        result.losses
    )
    assert run.data.metrics["best_step"] == 4 and run.data.metrics["stopped_early"] == 0


def test_lora_keeps_the_best_adapters_only(tiny_policy, expert_records, tmp_path, monkeypatch):
    """With LoRA the in-memory copy of the best weights is the adapters, and the saved
    adapter folder scores the best held-out loss."""
    import components.train.sft as sft
    from components.policy.config import LoRAConfig
    from components.policy.model import load_policy

    kept: list[str] = []
    restore = sft.HeldOut.restore_best

    def recording_restore(self, model):
        kept.extend(self.best_weights)
        restore(self, model)

    monkeypatch.setattr(sft.HeldOut, "restore_best", recording_restore)
    model, tokenizer = tiny_policy
    config = _config(tmp_path, learning_rate=0.05, lora=LoRAConfig(r=4))
    result = train_sft(model, tokenizer, expert_records, config)
    assert kept and all("lora_" in name for name in kept), kept
    assert (tmp_path / "sft" / "policy" / "adapter_config.json").is_file()
    saved, _ = load_policy(result.checkpoint_dir)
    batches = _held_out_batches(expert_records, tokenizer)
    assert held_out_loss(saved, batches, torch.device("cpu"), False) == pytest.approx(
        result.best_eval_loss, rel=1e-5
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"eval_fraction": 1.0}, "eval_fraction must be in [0, 1)"),
        ({"eval_fraction": -0.1}, "eval_fraction must be in [0, 1)"),
        ({"eval_every": 0}, "eval_every must be >= 1"),
        ({"early_stopping_patience": 0}, "early_stopping_patience must be >= 1"),
        ({"early_stopping_min_delta": -1.0}, "early_stopping_min_delta must be >= 0"),
        ({"eval_fraction": 0.2, "deepspeed": {"zero_stage": 2}}, "not supported with deepspeed"),
    ],
)
def test_a_bad_setting_is_a_one_line_config_error(values, message, tmp_path):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        SFTConfig(**values)
    preset = tmp_path / "bad.yaml"
    preset.write_text(yaml.safe_dump({"sft": values}))
    with pytest.raises(PresetError) as error:
        validate_preset(load_preset(preset))
    assert "bad.yaml:sft" in str(error.value) and "\n" not in str(error.value)


def test_the_command_writes_the_curves_and_refuses_a_bad_preset(
    tiny_policy, expert_records, tmp_path, capsys
):
    from components.policy.model import save_policy

    policy = save_policy(*tiny_policy, tmp_path / "policy")
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in expert_records))
    preset = tmp_path / "preset.yaml"
    settings = {"max_steps": 3, "batch_size": 2, "max_seq_len": 768, "use_cpu": True,
                "learning_rate": 0.05, "eval_fraction": 0.34, "eval_every": 1,
                "early_stopping_patience": 1}  # fmt: skip
    preset.write_text(yaml.safe_dump({"sft": settings}))
    argv = ["train", "sft", "--preset", str(preset), "--policy", str(policy),
            "--records", str(records)]  # fmt: skip
    assert agentrl([*argv, "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["best_step"] == 1 and result["stopped_early"] is True
    assert len(result["eval_losses"]) == 2 and len(result["losses"]) == 2
    assert result["policy_dir"].endswith("policy")

    preset.write_text(yaml.safe_dump({"sft": {**settings, "eval_fraction": 1.5}}))
    capsys.readouterr()
    assert agentrl([*argv, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "eval_fraction" in err, err
