"""A foreign record's claimed verdict gives way to ours once our verifier re-confirms it
(issue 44 item 5: "RS, DPO and GRPO use only verdicts the verifier produced or re-confirmed
by rescoring"); a diverged replay stays unsigned and keeps no claim either."""

from components.evaluate.rescore import Rescored, rescored_record
from components.verifier import provenance


def _foreign() -> dict:
    record = {"id": "ep-1", "task_id": "t-1", "reward": 1.0, "reward_terms": {"tests": 1.0},
              "final_diff": "", "events": [], "metadata": {"success": True}}  # fmt: skip
    provenance.as_claimed(record)
    return record


def _rescored(diverged: bool) -> Rescored:
    old = {"success": None, "reward": None, "reward_terms": {}, "verifier_version": None}
    new = {"success": False, "reward": -0.5, "reward_terms": {"tests": -0.5},
           "verifier_version": "v-now"}  # fmt: skip
    return Rescored("ep-1", "t-1", "diff", old, new, diverged=diverged)


def test_a_reconfirmed_foreign_record_carries_our_signed_verdict_and_no_claim():
    record = _foreign()
    assert record["claimed_reward"] == 1.0 and record["reward"] is None
    new = rescored_record(record, _rescored(diverged=False))
    assert not any(k in new for k in provenance.CLAIMED_FIELDS)
    assert new["reward"] == -0.5 and new["metadata"]["success"] is False
    assert provenance.is_signed_by_us(new)
    assert new["metadata"]["rescored"]["claimed"]["claimed_reward"] == 1.0


def test_a_diverged_replay_is_not_signed():
    new = rescored_record(_foreign(), _rescored(diverged=True))
    assert not provenance.is_signed_by_us(new)
    assert not any(k in new for k in provenance.CLAIMED_FIELDS)
