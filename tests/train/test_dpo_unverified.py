"""DPO reports the records it dropped as unverified (issue 44, item 5): in its result (so in
result.json, written from it) a count, a count per reason (both MLflow metrics of the stage
run) and each record with its reason; the dropped ones are on neither side of a pair."""

from __future__ import annotations

import copy
import dataclasses

from components.tracking import metric_values
from components.train.config import DPOConfig
from components.train.dpo import train_dpo, unverified_fields, verified_pairs
from components.verifier.provenance import MAC_FIELD, as_claimed


def _unverified(expert_records: list[dict]) -> list[dict]:
    """A foreign claim, an unsigned success and a tampered one, each of a trained task."""
    foreign = as_claimed(dict(copy.deepcopy(expert_records[0]), id="foreign-1"))
    unsigned = copy.deepcopy(expert_records[1])
    unsigned["id"] = "unsigned-1"
    del unsigned["metadata"][MAC_FIELD]
    tampered = copy.deepcopy(expert_records[2])
    tampered["reward"] = 0.99  # a signed field changed after signing
    return [foreign, unsigned, tampered]


def test_dpo_counts_what_it_dropped(tiny_policy, expert_records, failed_records, tmp_path):
    model, tokenizer = tiny_policy
    dropped_in = _unverified(expert_records)
    pairs, quarantine = verified_pairs([*dropped_in, *expert_records, *failed_records], 1)
    assert len(pairs) == 6
    on_a_side = {p[side]["id"] for p in pairs for side in ("chosen", "rejected")}
    assert not on_a_side & {"foreign-1", "unsigned-1"}
    assert all(p["chosen"]["reward"] == 1.0 for p in pairs)  # the tampered 0.99 on no side
    assert [q["id"] for q in quarantine] == [r["id"] for r in dropped_in]

    config = DPOConfig(
        max_steps=1, batch_size=2, max_seq_len=640, use_cpu=True, output_dir=str(tmp_path / "dpo")
    )
    result = dataclasses.asdict(train_dpo(model, None, tokenizer, pairs, config, quarantine))
    assert result["unverified"] == 3
    assert result["unverified_reasons"] == {"bad verdict MAC": 1, "foreign": 1, "unsigned": 1}
    assert [q["id"] for q in result["quarantine"]] == [
        "foreign-1",
        "unsigned-1",
        expert_records[2]["id"],
    ]
    scalars = metric_values(result).scalars
    assert scalars["unverified"] == 3.0 and scalars["unverified_reasons.foreign"] == 1.0


def test_a_dpo_run_with_no_pair_still_says_what_it_dropped(expert_records):
    pairs, quarantine = verified_pairs(_unverified(expert_records), 4)
    assert pairs == []
    fields = unverified_fields(quarantine)
    assert fields["unverified"] == 3 and sum(fields["unverified_reasons"].values()) == 3
    assert metric_values(fields).scalars["unverified"] == 3.0
