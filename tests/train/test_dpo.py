"""DPO on whole trajectories: a few steps on success-vs-failure pairs raise the margin;
the reference stays frozen; log-probs only count the assistant's tokens."""

from __future__ import annotations

import torch

from components.train.config import DPOConfig
from components.train.data import preference_pairs
from components.train.dpo import _sequence_logps, train_dpo


def test_dpo_increases_the_margin(tiny_policy, expert_records, failed_records, tmp_path):
    model, tokenizer = tiny_policy
    pairs = preference_pairs(expert_records + failed_records, max_pairs_per_task=2, seed=0)
    assert len(pairs) == 6
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = DPOConfig(max_steps=6, batch_size=2, learning_rate=1e-3, beta=0.1, max_seq_len=640,
                       use_cpu=True, output_dir=str(tmp_path / "dpo"))  # fmt: skip
    result = train_dpo(model, None, tokenizer, pairs, config)

    assert result.steps == 6 and result.num_pairs == 6
    # Step 1 is scored before any update: policy == reference, every reward is 0.
    assert abs(result.margins[0]) < 1e-5 and abs(result.losses[0] - 0.693147) < 1e-4
    assert result.margins[-1] > result.margins[0] + 0.5
    assert result.losses[-1] < result.losses[0]
    assert result.accuracies[-1] == 1.0
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_reference_is_frozen_and_only_assistant_tokens_count(tiny_policy, expert_records, tmp_path):
    model, tokenizer = tiny_policy
    reference_weights = {k: v.clone() for k, v in model.state_dict().items()}
    reference = type(model)(model.config)
    reference.load_state_dict(reference_weights)
    failed = dict(expert_records[0], id="f", metadata={"success": False, "status": "ok"})
    failed["trajectory"] = expert_records[0]["trajectory"][:3]
    config = DPOConfig(max_steps=2, batch_size=1, max_seq_len=640, use_cpu=True,
                       output_dir=str(tmp_path / "dpo"))  # fmt: skip
    pairs = [{"task_id": "train-0001", "chosen": expert_records[0], "rejected": failed}]
    train_dpo(model, reference, tokenizer, pairs, config)
    for name, value in reference.state_dict().items():
        assert torch.equal(value, reference_weights[name]), name

    # Only masked (assistant) positions are scored: an empty mask scores 0.
    ids = list(range(20))
    mask = [0] * 10 + [1] * 5 + [0] * 5
    example = {"input_ids": ids, "assistant_mask": mask}
    none_scored = {"input_ids": ids, "assistant_mask": [0] * 20}
    with torch.no_grad():
        logps = _sequence_logps(reference, [example, none_scored], 0, config, torch.device("cpu"))
    assert logps[0] < 0 and logps[1] == 0
