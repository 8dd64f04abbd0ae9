"""Constrained try_fix ids (components/env/tool_sets/fix_search/constrain.py): the text
matching by hand, the processor inside a real `model.generate`, and the engine passing each
episode's untried listed ids."""

from __future__ import annotations

import dataclasses

import pytest

from components.env.config import EnvConfig
from components.env.tool_sets.fix_search.constrain import (
    FixIdLogitsProcessor,
    allowed_token_ids,
    open_fix_id,
    untried_fix_ids,
)
from components.policy.chat import IM_END, format_tool_call
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig

CALL_PREFIX = '<tool_call>\n{"name": "try_fix", "arguments": {"id": "'


def test_open_fix_id_only_inside_a_try_fix_id_string():
    assert open_fix_id(CALL_PREFIX) == ""
    assert open_fix_id(CALL_PREFIX + "cmp-") == "cmp-"
    assert open_fix_id(CALL_PREFIX + 'cmp-1"') is None  # the string is closed
    assert open_fix_id(CALL_PREFIX + 'cmp-1"}}\n</tool_call>') is None
    assert open_fix_id('<tool_call>\n{"name": "list_fixes", "arguments": {"id": "') is None
    assert open_fix_id("I will try a fix") is None


def test_allowed_token_ids_by_hand():
    vocab = ["", "cmp", "-", "1", "2", '"', '"}}', "var", "cmp-1", "c", "x", "12", '":', '",',
             '"}}\n', '" }', '"}}\n</']  # fmt: skip
    allowed = ["cmp-1", "var-12"]
    # Any token that starts one of the ids; "c" is a prefix of "cmp-1", "x" of nothing.
    assert allowed_token_ids("", allowed, vocab) == [1, 7, 8, 9]
    assert allowed_token_ids("cmp", allowed, vocab) == [2]
    assert allowed_token_ids("cmp-", allowed, vocab) == [3]
    # After the whole id only the closing quote, alone or running on into the call's
    # closing braces: never into another key or value ('":', '",').
    assert allowed_token_ids("cmp-1", allowed, vocab) == [5, 6, 14, 15, 16]
    assert allowed_token_ids("var-", allowed, vocab) == [3, 11]  # "1" then "2", or "12"
    assert allowed_token_ids("zzz", allowed, vocab) == []


def test_untried_fix_ids_from_events():
    listing = (
        "E assert 1 == 2\n\nCandidate fixes of m.py (3; try_fix an id, kind-number):\n"
        "cmp (2): 1) line 3: < -> <= | 2) line 3: < -> >\nret (1): 1) line 4: removed `return x`"
    )
    events = [{"role": "user", "content": "fix it"}]
    assert untried_fix_ids(events) is None
    events += [
        {"role": "assistant", "action": "list_fixes", "arguments": {}},
        {"role": "environment", "observation": listing},
    ]
    assert untried_fix_ids(events) == ["cmp-1", "cmp-2", "ret-1"]
    events += [
        {"role": "assistant", "action": "try_fix", "arguments": {"id": "cmp-2"}},
        {"role": "environment", "observation": "cmp-2 applied (line 3: < -> >); tests FAILED"},
        {"role": "assistant", "action": "try_fix", "arguments": {"id": "zzz-1"}},
        {"role": "environment", "observation": "error: no fix 'zzz-1' in the list"},
    ]
    assert untried_fix_ids(events) == ["cmp-1", "ret-1"]


def test_processor_in_generate_writes_only_allowed_ids(model, tokenizer):
    """An untrained model inside a try_fix id string, greedy and sampled: the completion is
    always an allowed id and its closing quote."""
    import torch

    allowed = [["cmp-2", "ret-1"], ["var-13"]]
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prefix = tokenizer(CALL_PREFIX, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([header + prefix] * 2)
    for sample in (False, True):
        # prompt_width = the header: the call prefix counts as this turn's generated text.
        processor = FixIdLogitsProcessor(tokenizer, len(header), allowed)
        torch.manual_seed(0)
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
            do_sample=sample, top_k=0, logits_processor=[processor],
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        for row, options in zip(out[:, ids.shape[1] :].tolist(), allowed, strict=True):
            text = tokenizer.decode(row, skip_special_tokens=False)
            assert any(text.startswith(f'{o}"') for o in options), (sample, text)


def test_processor_leaves_rows_without_a_listing_alone(model, tokenizer):
    import torch

    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prefix = tokenizer(CALL_PREFIX, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([header + prefix])
    scores = torch.randn(1, len(tokenizer))
    processor = FixIdLogitsProcessor(tokenizer, len(header), [None])
    assert torch.equal(processor(ids, scores.clone()), scores)
    processor = FixIdLogitsProcessor(tokenizer, len(header), [["cmp-1"]])
    masked = processor(ids, scores.clone())
    assert torch.isfinite(masked).sum() < len(tokenizer) / 10


def test_engine_passes_each_episodes_untried_listed_ids(model, tokenizer, tasks):
    """The engine hands the backend, per live episode, None before list_fixes and then the
    listed ids minus the ones already applied."""
    seen: list[list] = []
    script = {"n": 0}

    def generate(prompts, caps, seed, constraint=None):
        allowed_fix_ids = None if constraint is None else constraint.rows
        seen.append(allowed_fix_ids)
        turn = script["n"]
        script["n"] += 1
        if turn == 0:
            text = format_tool_call("list_fixes", {})
        elif turn < 3:
            text = format_tool_call("try_fix", {"id": allowed_fix_ids[0][-1]})
        else:
            text = format_tool_call("finish", {"summary": "done"})
        ids = tokenizer(text + IM_END, add_special_tokens=False)["input_ids"]
        return [Completion(ids, [-0.5] * len(ids), "stop") for _ in prompts]

    config = RolloutConfig(samples_per_task=1, max_new_tokens=64, workers=1,
                           batch_size=1, constrain_fix_ids=True)  # fmt: skip
    env = EnvConfig(tool_set="fix_search", max_steps=6)
    (r,) = sample_episodes(tasks[:1], model, tokenizer, config, env, SandboxConfig(),
                           generate_fn=generate)  # fmt: skip
    assert seen[0] == [None]
    listed = seen[1][0]
    assert listed and seen[2][0] == listed[:-1]  # the last id was applied
    assert seen[3][0] == listed[:-2]
    assert r.result.end_reason == "finished" and r.result.invalid_calls == 0
    assert r.result.record["reward_terms"]["wasted_fix_try"] == 0


def test_constraint_needs_the_in_process_backend():
    with pytest.raises(ValueError, match="constrain_fix_ids"):
        RolloutConfig(backend="openai", constrain_fix_ids=True)
    assert dataclasses.replace(RolloutConfig(), constrain_fix_ids=True).constrain_fix_ids


def test_a_constraint_on_a_tool_set_without_one_is_an_error(model, tokenizer, tasks):
    """free_form has no decoding constraint: asking for one is a configuration error, not a
    silently unconstrained run."""
    config = RolloutConfig(samples_per_task=1, constrain_fix_ids=True)
    with pytest.raises(ValueError, match="'free_form' has no decoding constraint"):
        sample_episodes(tasks[:1], model, tokenizer, config, EnvConfig(), SandboxConfig(),
                        generate_fn=lambda *a, **k: [])  # fmt: skip
