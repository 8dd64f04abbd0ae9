"""Rejection sampling reports the records it dropped as unverified (issue 44, item 5): in its
result (written whole to result.json by `agentrl train rs`) a count, a count per reason (both
MLflow metrics of the stage run) and each record with its reason; none of them is kept."""

from __future__ import annotations

import copy
import dataclasses

from components.tracking import metric_values
from components.train.config import RejectionSamplingConfig
from components.train.rejection_sampling import train_rejection_sampling
from components.verifier.provenance import MAC_FIELD, as_claimed


def test_rs_counts_what_it_dropped(expert_records, failed_records):
    foreign = as_claimed(dict(copy.deepcopy(expert_records[0]), id="foreign-1"))
    unsigned = copy.deepcopy(expert_records[1])
    unsigned["id"] = "unsigned-1"
    del unsigned["metadata"][MAC_FIELD]
    stale = copy.deepcopy(expert_records[2])
    stale["id"] = "stale-1"
    stale["metadata"]["verifier_version"] = "vv-0000000000000000"
    # Only unverified successes and honest failures: nothing is kept, so nothing trains
    # (no model needed), and the result still says what was dropped and why.
    records = [foreign, unsigned, stale, *failed_records]
    result = train_rejection_sampling(None, None, records, RejectionSamplingConfig())
    assert result.kept == 0 and result.sft is None and result.failures == len(failed_records)
    assert result.unverified == 3
    assert result.unverified_reasons == {"bad verdict MAC": 1, "foreign": 1, "unsigned": 1}
    assert [q["id"] for q in result.quarantine] == ["foreign-1", "unsigned-1", "stale-1"]
    scalars = metric_values(dataclasses.asdict(result)).scalars
    assert scalars["unverified"] == 3.0 and scalars["unverified_reasons.unsigned"] == 1.0
