"""Canonical trajectory records -> training examples: SFT sequences, batches, DPO pairs.

The loss only ever sees the assistant's own tokens: labels are -100 everywhere else
(system prompt, task, tool observations, role headers, padding). Token ids come, in order
of preference, from
1. the record's own `input_ids` + `assistant_mask` (the rollout engine stores exactly what
   the model was conditioned on and sampled), used verbatim;
2. per assistant event, its sampled `token_ids`, used verbatim for that turn: re-tokenizing
   the decoded text can give different ids than the model sampled (BPE is not injective on
   ids), and training on ids it never produced would bias the update;
3. otherwise `chat.tokenize_trajectory`'s segment-wise tokenization (expert transcripts).

No torch at import time (the CLI imports this module); `collate` imports it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence

from components.policy.chat import tokenize_trajectory, trajectory_segments
from components.verifier.provenance import claims, split_verified

IGNORE_INDEX = -100  # the label value torch's cross_entropy (and HF/TRL) skip
# Fields of an assistant event that record how it was sampled, not what it said.
SAMPLING_FIELDS = ("token_ids", "logprobs")


def trajectory_tokens(tokenizer, record: dict, compact: bool = True) -> dict:
    """{"input_ids", "assistant_mask"} of one record, untruncated (see the module docstring)."""
    if record.get("input_ids") is not None and record.get("assistant_mask") is not None:
        ids, mask = list(record["input_ids"]), list(record["assistant_mask"])
        if len(ids) != len(mask):
            raise ValueError(f"record {record.get('id')}: input_ids and assistant_mask differ")
        return {"input_ids": ids, "assistant_mask": mask}
    events = record["trajectory"]
    sampled = [e.get("token_ids") for e in events if e.get("role") == "assistant"]
    if not any(t is not None for t in sampled):
        out = tokenize_trajectory(tokenizer, events, compact=compact)
        return {"input_ids": out["input_ids"], "assistant_mask": out["assistant_mask"]}
    # Same segment-wise encoding as chat.tokenize_trajectory, with each assistant segment
    # replaced by the ids the model sampled for it (segments map to assistant events in order).
    segments = trajectory_segments(tokenizer, events, compact)
    encoded = tokenizer([text for text, _ in segments], add_special_tokens=False)["input_ids"]
    turns = iter(sampled)
    ids: list[int] = []
    mask: list[int] = []
    for (_, generated), piece in zip(segments, encoded, strict=True):
        if generated:
            token_ids = next(turns)
            piece = list(token_ids) if token_ids is not None else piece
        ids.extend(piece)
        mask.extend([int(generated)] * len(piece))
    return {"input_ids": ids, "assistant_mask": mask}


def sft_examples(
    records: Iterable[dict], tokenizer, max_seq_len: int, compact: bool = True
) -> list[dict]:
    """One example per record: {"id", "input_ids", "labels", "assistant_mask", "truncated"}.

    labels == input_ids on assistant tokens and -100 elsewhere. A transcript longer than
    `max_seq_len` keeps its beginning; one left with no assistant token is dropped (it
    would contribute nothing but padding).
    """
    examples = []
    for record in records:
        tokens = trajectory_tokens(tokenizer, record, compact)
        ids, mask = tokens["input_ids"], tokens["assistant_mask"]
        truncated = len(ids) > max_seq_len
        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
        if not any(mask):
            continue
        labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
        examples.append(
            {
                "id": record.get("id"),
                "input_ids": ids,
                "labels": labels,
                "assistant_mask": mask,
                "truncated": truncated,
            }
        )
    return examples


def held_out_split(
    records: Sequence[dict], fraction: float, seed: int
) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records), each in the input's order: `fraction` of the
    records' tasks (rounded, at least one, never all) held out whole, so no transcript of a
    held-out task is trained on, nor half of one. A record's task is its `task_id`, else its
    own `id` (one episode). Tasks are ranked by sha256 of (seed, task): the split depends on
    nothing else, not on the records' order or count per task.

    Ranking rather than a hash threshold: on a few dozen tasks a threshold can hold out none
    or twice the share; the price is that a new task can move one task across the boundary.
    """
    keys = [_task_key(record) for record in records]
    tasks = sorted(set(keys), key=lambda task: hashlib.sha256(f"{seed}\0{task}".encode()).digest())
    if len(tasks) < 2:
        raise ValueError(f"held-out split: the records name {len(tasks)} task(s); need >= 2")
    held = set(tasks[: min(max(round(fraction * len(tasks)), 1), len(tasks) - 1)])
    train = [r for r, key in zip(records, keys, strict=True) if key not in held]
    return train, [r for r, key in zip(records, keys, strict=True) if key in held]


def _task_key(record: dict) -> str:
    key = record.get("task_id") or record.get("id")
    if not key:
        raise ValueError("held-out split: a record has neither task_id nor id")
    return str(key)


def padded_length(length: int, pad_to_multiple_of: int) -> int:
    if not pad_to_multiple_of:
        return length
    return -(-length // pad_to_multiple_of) * pad_to_multiple_of


def collate(batch: Sequence[dict], pad_id: int, pad_to_multiple_of: int = 0) -> dict:
    """Right-pad a list of examples into tensors [B, T], T a multiple of `pad_to_multiple_of`.

    Returns input_ids (pad_id), attention_mask (0 on padding) and, when the examples have
    them, labels (-100 on padding) and assistant_mask (0 on padding). Same layout as TRL's
    DataCollatorForLanguageModeling (a test checks it).
    """
    import torch

    length = padded_length(max(len(ex["input_ids"]) for ex in batch), pad_to_multiple_of)
    fills = {"input_ids": pad_id, "labels": IGNORE_INDEX, "assistant_mask": 0}
    out = {}
    for key, fill in fills.items():
        if key not in batch[0]:
            continue
        rows = [list(ex[key]) + [fill] * (length - len(ex[key])) for ex in batch]
        out[key] = torch.tensor(rows, dtype=torch.long)
    out["attention_mask"] = torch.tensor(
        [[1] * len(ex["input_ids"]) + [0] * (length - len(ex["input_ids"])) for ex in batch],
        dtype=torch.long,
    )
    return out


def is_success(record: dict) -> bool:
    """Verified success: the episode's own verdict when it has one, else the tests passed."""
    metadata = record.get("metadata") or {}
    if "success" in metadata:
        return bool(metadata["success"])
    return (
        record.get("reward") is not None
        and (record.get("reward_terms") or {}).get("tests_pass", 0.0) > 0
    )


def is_scored(record: dict) -> bool:
    """An episode with a reward; infrastructure failures carry none and say nothing."""
    metadata = record.get("metadata") or {}
    return record.get("reward") is not None and metadata.get("status", "ok") == "ok"


def transcript_key(record: dict) -> str:
    """What makes two transcripts identical: task and events, not how they were sampled."""
    events = [
        {k: v for k, v in e.items() if k not in SAMPLING_FIELDS} for e in record["trajectory"]
    ]
    return json.dumps([record.get("task_id"), events], sort_keys=True, ensure_ascii=False)


def preference_pairs(records: Iterable[dict], max_pairs_per_task: int, seed: int = 0) -> list[dict]:
    """(success, failure) pairs of the same task: [{"task_id", "chosen", "rejected"}, ...].

    Only verdicts this pipeline's verifier signed pair (components/verifier/provenance.py):
    a foreign, unsigned, tampered or stale one is quarantined, counted and logged, on
    neither side. Infrastructure failures (reward None) are skipped. Each task gives at most
    `max_pairs_per_task` pairs drawn without replacement from all success x failure
    combinations (seeded), so one task with many samples does not dominate; tasks come
    out in sorted order.
    """
    by_task: dict[str, dict[str, list[dict]]] = defaultdict(lambda: {"ok": [], "bad": []})
    scored = [r for r in records if is_scored(r) or claims(r)]
    verified, _ = split_verified(scored, "dpo pairs")
    for record in verified:
        if not is_scored(record):
            continue
        by_task[record["task_id"]]["ok" if is_success(record) else "bad"].append(record)
    rng = random.Random(seed)
    pairs = []
    for task_id in sorted(by_task):
        good, bad = by_task[task_id]["ok"], by_task[task_id]["bad"]
        combos = [(i, j) for i in range(len(good)) for j in range(len(bad))]
        rng.shuffle(combos)
        for i, j in combos[:max_pairs_per_task]:
            pairs.append({"task_id": task_id, "chosen": good[i], "rejected": bad[j]})
    return pairs
