"""Records -> training examples: exact assistant masks, sampled ids verbatim, padding, pairs,
rejection-sampling selection, and the training configs (every shipped DeepSpeed JSON loads)."""

from __future__ import annotations

import copy
import json

import pytest

from components.policy.chat import IM_END, assistant_body, render_messages, tokenize_trajectory
from components.train.config import (
    DEEPSPEED_CONFIG_DIR,
    DeepSpeedConfig,
    DPOConfig,
    RejectionSamplingConfig,
    SFTConfig,
)
from components.train.data import (
    IGNORE_INDEX,
    collate,
    preference_pairs,
    sft_examples,
    trajectory_tokens,
)
from components.train.rejection_sampling import select_successes
from tests.train.conftest import signed


def test_labels_exactly_on_assistant_tokens(tokenizer, expert_records):
    record = expert_records[0]
    (example,) = sft_examples([record], tokenizer, max_seq_len=4096)
    ids, labels, mask = example["input_ids"], example["labels"], example["assistant_mask"]
    assert labels == [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
    # The labelled tokens decode to exactly the assistant turns, each ending in <|im_end|>.
    messages = render_messages(record["trajectory"])
    expected = "".join(assistant_body(m) + IM_END for m in messages if m["role"] == "assistant")
    assert tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) == expected
    # ...and nothing of the observations, the task or the system prompt is trained on.
    context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "episode finished" in context and "1 failed" in context
    assert ids == tokenize_trajectory(tokenizer, record["trajectory"])["input_ids"]


def test_sampled_token_ids_are_used_verbatim(tokenizer, expert_records):
    record = expert_records[0]
    reference = trajectory_tokens(tokenizer, record)
    # Spell the first assistant turn one byte-token at a time: ids a re-tokenization would
    # never produce, but the text decodes the same.
    first = render_messages(record["trajectory"])[2]  # [system, user, assistant, ...]
    text = assistant_body(first)
    odd_ids = [tokenizer.encode(ch, add_special_tokens=False)[0] for ch in text]  # ASCII
    odd_ids.append(tokenizer.convert_tokens_to_ids(IM_END))
    assert tokenizer.decode(odd_ids) == text + IM_END
    record["trajectory"][1]["token_ids"] = odd_ids
    record["trajectory"][1]["logprobs"] = [-0.5] * len(odd_ids)
    tokens = trajectory_tokens(tokenizer, record)
    ids, mask = tokens["input_ids"], tokens["assistant_mask"]
    start = mask.index(1)
    assert ids[start : start + len(odd_ids)] == odd_ids
    assert mask[start : start + len(odd_ids)] == [1] * len(odd_ids)
    assert mask[start + len(odd_ids)] == 0  # the newline after <|im_end|> is context
    assert ids[:start] == reference["input_ids"][:start]
    assert tokenizer.decode(ids) == tokenizer.decode(reference["input_ids"])
    assert odd_ids != reference["input_ids"][start : start + len(odd_ids)]


def test_episode_level_ids_and_mask_win(tokenizer, expert_records):
    record = expert_records[0]
    record["input_ids"], record["assistant_mask"] = [5, 6, 7, 8], [0, 1, 1, 0]
    (example,) = sft_examples([record], tokenizer, max_seq_len=4096)
    assert example["input_ids"] == [5, 6, 7, 8]
    assert example["labels"] == [IGNORE_INDEX, 6, 7, IGNORE_INDEX]
    record["assistant_mask"] = [0, 1]
    with pytest.raises(ValueError, match="differ"):
        trajectory_tokens(tokenizer, record)


def test_truncation_keeps_the_start_and_drops_examples_without_assistant_tokens(
    tokenizer, expert_records
):
    full = trajectory_tokens(tokenizer, expert_records[0])
    first_assistant = full["assistant_mask"].index(1)
    examples = sft_examples(expert_records[:1], tokenizer, max_seq_len=first_assistant + 5)
    assert examples[0]["truncated"] and len(examples[0]["input_ids"]) == first_assistant + 5
    assert examples[0]["input_ids"] == full["input_ids"][: first_assistant + 5]
    assert sft_examples(expert_records[:1], tokenizer, max_seq_len=first_assistant) == []


@pytest.mark.parametrize("multiple", [0, 1, 32, 64])
def test_collate_pads_to_multiple_and_matches_trl(tokenizer, expert_records, multiple):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    examples = sft_examples(expert_records[:3], tokenizer, max_seq_len=4096)
    batch = collate(examples, tokenizer.pad_token_id, multiple)
    longest = max(len(e["input_ids"]) for e in examples)
    length = batch["input_ids"].shape[1]
    assert length >= longest and (multiple == 0 or length % multiple == 0)
    assert length - longest < max(multiple, 1)
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == ex["input_ids"]
        assert set(batch["input_ids"][row, n:].tolist()) <= {tokenizer.pad_token_id}
        assert set(batch["labels"][row, n:].tolist()) <= {IGNORE_INDEX}
        assert batch["attention_mask"][row].sum() == n
        assert batch["assistant_mask"][row].sum() == sum(ex["assistant_mask"])
    trl = DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=multiple or None
    )([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
    for key in ("input_ids", "labels", "attention_mask"):
        assert batch[key].tolist() == trl[key].tolist(), key


def test_preference_pairs(expert_records, failed_records):
    infra = copy.deepcopy(failed_records[0])
    infra["id"], infra["reward"], infra["metadata"]["status"] = "infra", None, "infra_failure"
    second_failure = copy.deepcopy(failed_records[0])
    second_failure["id"] = "noop-2"
    signed(second_failure)  # another episode: its own signed verdict
    records = expert_records + failed_records + [infra, second_failure]
    pairs = preference_pairs(records, max_pairs_per_task=4, seed=0)
    assert [p["task_id"] for p in pairs] == ["train-0001"] * 2 + [
        f"train-000{i}" for i in range(2, 7)
    ]
    for pair in pairs:
        assert pair["chosen"]["metadata"]["success"] and not pair["rejected"]["metadata"]["success"]
        assert pair["chosen"]["task_id"] == pair["rejected"]["task_id"] == pair["task_id"]
        assert pair["rejected"]["id"] != "infra"
    assert len(preference_pairs(records, max_pairs_per_task=1, seed=0)) == 6
    # Only successes, or only failures, for a task: no pair.
    assert preference_pairs(expert_records, 4) == [] == preference_pairs(failed_records, 4)
    assert preference_pairs(records, 1, seed=3) == preference_pairs(records, 1, seed=3)


def test_select_successes_dedupes_and_skips_failures(expert_records, failed_records):
    duplicate = copy.deepcopy(expert_records[0])
    duplicate["id"] = "another-sample"
    duplicate["trajectory"][1]["token_ids"] = [1, 2, 3]  # sampling fields don't make it new
    signed(duplicate)  # another episode: its own signed verdict
    infra = copy.deepcopy(expert_records[1])
    infra["reward"], infra["metadata"]["status"] = None, "infra_failure"
    records = expert_records + failed_records + [duplicate, infra]
    kept, counts = select_successes(records)
    assert [r["id"] for r in kept] == [r["id"] for r in expert_records]
    assert counts == {
        "sampled": 14, "infra_failures": 1, "unverified": 0, "failures": 6, "duplicates": 1, "kept": 6,
        "tasks_with_success": 6, "tasks_sampled": 6,
    }  # fmt: skip
    kept, _ = select_successes(records, dedupe=False)
    assert len(kept) == 7
    kept, _ = select_successes(records, successes_only=False)
    assert len(kept) == 12
    kept, _ = select_successes(records, dedupe=False, max_per_task=1)
    assert len(kept) == 6 and len({r["task_id"] for r in kept}) == 6


def test_select_successes_can_prefer_the_fewest_steps(expert_records):
    task_id = expert_records[0]["task_id"]
    longer = copy.deepcopy(expert_records[0])
    longer["id"] = "longer"
    # a wrong try and its observation before the same ending: more actions, same task
    wrong = [{"role": "assistant", "action": "try_fix", "arguments": {"id": "var-9"}},
             {"role": "environment", "observation": "var-9 applied (x); tests FAILED"}]  # fmt: skip
    longer["trajectory"] = longer["trajectory"][:1] + wrong + longer["trajectory"][1:]
    signed(longer)  # another episode: its own signed verdict
    records = [longer, *expert_records]  # the longer one comes first in input order
    kept, _ = select_successes(records, max_per_task=1, prefer_fewest_steps=True)
    assert [r["id"] for r in kept if r["task_id"] == task_id] == [expert_records[0]["id"]]
    kept, _ = select_successes(records, max_per_task=2, prefer_fewest_steps=True)
    assert [r["id"] for r in kept if r["task_id"] == task_id] == ["longer", expert_records[0]["id"]]


def test_configs_validate_where_defined():
    with pytest.raises(ValueError, match="multiple of pad_to_multiple_of"):
        SFTConfig(max_seq_len=100)
    with pytest.raises(ValueError, match="batch_size"):
        SFTConfig(batch_size=0)
    with pytest.raises(ValueError, match="epochs > 0 or max_steps"):
        SFTConfig(epochs=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOConfig(label_smoothing=0.5)
    with pytest.raises(ValueError, match="beta"):
        DPOConfig(beta=0)
    with pytest.raises(ValueError, match="zero_stage"):
        DeepSpeedConfig(zero_stage=1)
    # Nested configs come from YAML/JSON mappings.
    rs = RejectionSamplingConfig(sft={"max_steps": 3, "deepspeed": {"zero_stage": 3}})
    assert rs.sft.max_steps == 3 and rs.sft.deepspeed == DeepSpeedConfig(zero_stage=3)
    for config in (SFTConfig, DPOConfig, RejectionSamplingConfig, DeepSpeedConfig):
        for f in config.__dataclass_fields__.values():
            assert f.metadata.get("help"), f"{config.__name__}.{f.name} has no help"


@pytest.mark.parametrize("path", sorted(DEEPSPEED_CONFIG_DIR.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_deepspeed_config_loads(path):
    stage = json.loads(path.read_text())["zero_optimization"]["stage"]
    config = DeepSpeedConfig(zero_stage=stage, config_path=str(path))
    values = config.load(micro_batch_size=2, grad_accum=4, lr=1e-4, weight_decay=0.0,
                         max_grad_norm=1.0, bf16=False)  # fmt: skip
    assert "auto" not in json.dumps(values)
    assert values["train_micro_batch_size_per_gpu"] == 2
    assert values["gradient_accumulation_steps"] == 4
    assert values["optimizer"]["params"]["lr"] == 1e-4
    assert values["optimizer"]["torch_adam"] is True  # no C++ optimizer op to compile
    assert values["bf16"]["enabled"] is False
    with pytest.raises(ValueError, match="stage"):
        DeepSpeedConfig(zero_stage=0 if stage else 2, config_path=str(path)).load(
            2, 4, 1e-4, 0.0, 1.0, False
        )
