"""The `evaluate` preset section: checked where defined; a model is evaluated as trained."""

import pytest

from components.evaluate.config import EvaluationConfig
from components.rollout.config import RolloutConfig


def test_config_is_validated():
    assert EvaluationConfig().splits == ("test",)
    bad_values = (
        {"splits": ("prod",)},
        {"workers": 0},
        {"limit": -1},
        {"safety_n_tasks": 0},
        {"rollout": {"temprature": 0.0}},
    )
    for bad in bad_values:
        with pytest.raises(ValueError):
            EvaluationConfig(**bad)


def test_model_is_evaluated_with_its_training_rollout_settings():
    trained = RolloutConfig(max_new_tokens=192, temperature=1.0, samples_per_task=4,
                            constrain_fix_ids=True)  # fmt: skip
    greedy = EvaluationConfig().rollout_config(trained)
    assert (greedy.max_new_tokens, greedy.constrain_fix_ids) == (192, True)
    assert greedy.temperature == 0.0 and greedy.samples_per_task == 1
    longer = EvaluationConfig(rollout={"max_new_tokens": 256}).rollout_config(trained)
    assert longer.max_new_tokens == 256 and longer.temperature == 1.0
