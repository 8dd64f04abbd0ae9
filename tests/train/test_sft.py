"""SFT (the plain loop of train/sft.py, which matched TRL's SFTTrainer on these losses
before the system prompt came to list only the tool set's tools) on the tiny policy: golden losses, parameters change, the
checkpoint loads back, rejection sampling takes the same path, MLflow gets the metrics.

GOLDEN_LOSSES are the first 10 per-step losses of a fixed run (seeded init, seeded data
order, one CPU thread: deterministic). Update them only with a reason in the commit message
(a deliberate change of the tokenizer, the chat format, the masking, the model init or the
optimizer), never to make a failing test pass.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from components.train.config import RejectionSamplingConfig, SFTConfig
from components.train.rejection_sampling import train_rejection_sampling
from components.train.sft import train_sft
from tests.train.conftest import signed

# tiny_policy (seed 0) on the 6 expert records of conftest, _config(): batch 2, lr 1e-3, cosine.
GOLDEN_LOSSES = [6.24849, 6.09216, 5.99323, 5.88444, 5.79393,
                 5.75974, 5.69299, 5.65651, 5.64704, 5.62834]  # fmt: skip


def _config(tmp_path, **overrides) -> SFTConfig:
    values = dict(max_steps=10, batch_size=2, learning_rate=1e-3, max_seq_len=768,
                  lr_scheduler="cosine", seed=0, use_cpu=True, output_dir=str(tmp_path / "sft"))  # fmt: skip
    return SFTConfig(**{**values, **overrides})


def test_sft_golden_losses_and_parameters_change(tiny_policy, expert_records, tmp_path):
    from components.policy.model import load_policy

    model, tokenizer = tiny_policy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_sft(model, tokenizer, expert_records, _config(tmp_path))

    assert result.steps == 10 and len(result.losses) == 10
    assert result.num_examples == 6 and result.num_truncated == 0
    assert result.losses == pytest.approx(GOLDEN_LOSSES, rel=1e-4, abs=1e-4)
    assert result.losses[-1] < result.losses[0] - 0.3
    assert all(math.isfinite(x) for x in result.losses + result.grad_norms)
    assert result.tokens > 0 and result.tokens_per_second > 0
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)

    reloaded, _ = load_policy(result.checkpoint_dir)
    for name, value in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], value), name


def test_rejection_sampling_trains_on_successes_only(
    tiny_policy, expert_records, failed_records, tmp_path
):
    model, tokenizer = tiny_policy
    # the same transcript sampled again: another episode, with its own signed verdict
    duplicate = signed({**copy.deepcopy(expert_records[0]), "id": "dup"})
    sampled = expert_records[:3] + failed_records + [duplicate]
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = RejectionSamplingConfig(
        sft=_config(tmp_path, max_steps=2, mlflow_tracking_uri=tracking, log_every=1),
    )
    result = train_rejection_sampling(model, tokenizer, sampled, config)
    assert (result.kept, result.failures, result.duplicates) == (3, 6, 1)
    assert result.tasks_with_success == 3 and result.tasks_sampled == 6
    assert result.sft.num_examples == 3 and result.sft.steps == 2

    import mlflow

    client = mlflow.MlflowClient(tracking)
    (run,) = mlflow.search_runs(experiment_names=["agentrl-sft"], output_format="list")
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.value for m in history] == pytest.approx(result.sft.losses)
    assert client.get_metric_history(run.info.run_id, "tokens_per_s")
    assert client.get_metric_history(run.info.run_id, "learning_rate")


def test_loss_at_labelled_positions_equals_the_models_own_loss(
    tiny_policy, expert_records, monkeypatch
):
    """The head on the labelled rows only (Qwen/Llama), the model's forward with
    logits_to_keep (any other model) and HF's loss on full logits give the same sum."""
    import components.train.sft as sft
    from components.train.data import collate, sft_examples

    model, tokenizer = tiny_policy
    batch = collate(sft_examples(expert_records[:3], tokenizer, 768), tokenizer.pad_token_id, 32)
    device = torch.device("cpu")
    with torch.no_grad():
        plain, count = sft.sft_loss_sum(model, batch, device, bf16=False)
        monkeypatch.setattr(sft, "PLAIN_HEAD", ())
        kept, _ = sft.sft_loss_sum(model, batch, device, bf16=False)
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=batch["labels"]).loss  # fmt: skip
    assert count == (batch["labels"][:, 1:] != -100).sum()
    torch.testing.assert_close(plain, kept, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(plain / count, full, rtol=1e-5, atol=1e-5)
