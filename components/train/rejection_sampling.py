"""Rejection sampling (RFT / STaR): keep the verified successes among K samples per task,
drop duplicate transcripts, and fine-tune on them through the SFT code path (`train_sft`).

Verified means judged by this pipeline's verifier: a record whose verdict is not signed by
it under the current verifier version (components/verifier/provenance.py: a foreign claim,
no MAC, a tampered field, a stale version) is never kept, whatever it claims; it is
counted (`unverified`, and per reason in `unverified_reasons`: a metric each in MLflow),
logged, and listed with its reason in the result's `quarantine`.

Sampled records keep their sampled `token_ids` (or episode `input_ids`/`assistant_mask`),
so the policy is trained on exactly the tokens it produced (see data.py).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from components.train.config import RejectionSamplingConfig
from components.train.data import is_scored, is_success, transcript_key
from components.train.sft import train_sft
from components.train.sft_result import SFTResult
from components.verifier.provenance import claims, log_quarantine, unverified_reason
from components.verifier.version import verifier_version


@dataclass
class RejectionSamplingResult:
    kept: int
    sampled: int
    infra_failures: int  # no reward: neither kept nor counted as failures
    unverified: int  # a verdict this pipeline's verifier did not sign: never kept
    failures: int
    duplicates: int
    tasks_with_success: int
    tasks_sampled: int
    sft: SFTResult | None  # None when nothing was kept
    quarantine: list[dict] = field(default_factory=list)  # {"id", "task_id", "reason"}
    unverified_reasons: dict[str, int] = field(default_factory=dict)  # {"foreign": 1, ...}


def select_successes(
    records: list[dict],
    successes_only: bool = True,
    dedupe: bool = True,
    max_per_task: int = 0,
    seed: int = 0,
    prefer_fewest_steps: bool = False,
    quarantine: list[dict] | None = None,
) -> tuple[list[dict], dict[str, int]]:
    """(kept records, counts), in input order. max_per_task trims each task's successes by a
    seeded random choice or, with prefer_fewest_steps, to those with the fewest actions
    (ties: first in input order). Unverified records (see the module doc) are appended to
    `quarantine` when it is given, and logged."""
    quarantine = [] if quarantine is None else quarantine
    counts = {"sampled": len(records), "infra_failures": 0, "unverified": 0, "failures": 0,
              "duplicates": 0}  # fmt: skip
    seen: set[str] = set()
    by_task: dict[str, list[dict]] = defaultdict(list)
    current = verifier_version()
    for record in records:
        if not is_scored(record) and not claims(record):
            counts["infra_failures"] += 1
            continue
        reason = unverified_reason(record, current)
        if reason is not None:
            counts["unverified"] += 1
            quarantine.append({"id": record.get("id"), "task_id": record.get("task_id"),
                               "reason": reason})  # fmt: skip
            continue
        if successes_only and not is_success(record):
            counts["failures"] += 1
            continue
        if dedupe:
            key = transcript_key(record)
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
        by_task[record["task_id"]].append(record)
    rng = random.Random(seed)
    keep_ids: set[int] = set()
    for task_id in sorted(by_task):
        group = by_task[task_id]
        if max_per_task and len(group) > max_per_task:
            if prefer_fewest_steps:
                group = sorted(group, key=_num_actions)[:max_per_task]
            else:
                group = rng.sample(group, max_per_task)
        keep_ids.update(id(r) for r in group)
    log_quarantine(quarantine, "rejection sampling")
    kept = [r for r in records if id(r) in keep_ids]
    counts["kept"] = len(kept)
    counts["tasks_with_success"] = len(by_task)
    counts["tasks_sampled"] = len({r.get("task_id") for r in records})
    return kept, counts


def _num_actions(record: dict) -> int:
    return sum(e.get("role") == "assistant" for e in record.get("trajectory", []))


def train_rejection_sampling(
    model, tokenizer, sampled_records: list[dict], config: RejectionSamplingConfig
) -> RejectionSamplingResult:
    """Select (select_successes) and fine-tune `model` in place on what was kept."""
    quarantine: list[dict] = []
    kept, counts = select_successes(
        sampled_records,
        config.successes_only,
        config.dedupe,
        config.max_per_task,
        config.seed,
        config.prefer_fewest_steps,
        quarantine,
    )
    result = train_sft(model, tokenizer, kept, config.sft) if kept else None
    return RejectionSamplingResult(
        kept=counts["kept"],
        sampled=counts["sampled"],
        infra_failures=counts["infra_failures"],
        unverified=counts["unverified"],
        failures=counts["failures"],
        duplicates=counts["duplicates"],
        tasks_with_success=counts["tasks_with_success"],
        tasks_sampled=counts["tasks_sampled"],
        sft=result,
        quarantine=quarantine,
        unverified_reasons=dict(
            sorted(Counter(q["reason"].split(":")[0] for q in quarantine).items())
        ),
    )
