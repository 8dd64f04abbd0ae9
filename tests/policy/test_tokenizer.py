"""The locally trained tokenizer: determinism, single-id special tokens, exact round trips."""

from __future__ import annotations

import pytest

from components.policy.chat import CHAT_TEMPLATE
from components.policy.tokenizer import (
    SPECIAL_TOKENS,
    TOOL_TAG_TOKENS,
    build_corpus,
    load_tokenizer,
    stdlib_sources,
    train_tokenizer,
)

ODD_TEXT = (
    "def f(x):\r\n\treturn x  # naïve ünïcode → 😀, e\u0301 (combining) \u00a0nbsp\n\n\n"
    "    'S Don't 0123456789 <|im_start|>inside<tool_call>{\"a\": 1}</tool_call> end "
)


def test_stdlib_sample_is_seeded_and_bounded():
    a, b = stdlib_sources(30_000, seed=1), stdlib_sources(30_000, seed=1)
    assert a == b and sum(map(len, a)) == 30_000
    assert stdlib_sources(30_000, seed=2) != a
    assert stdlib_sources(0) == []


def test_training_is_deterministic():
    corpus = build_corpus(texts=["def add(a, b):\n    return a + b\n"], stdlib_bytes=40_000, seed=3)
    one = train_tokenizer(corpus, vocab_size=400).backend_tokenizer.to_str()
    two = train_tokenizer(list(corpus), vocab_size=400).backend_tokenizer.to_str()
    assert one == two


def test_vocab_size_counts_added_tokens(tokenizer):
    assert len(tokenizer) == 512
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=260)


@pytest.mark.parametrize("token", SPECIAL_TOKENS + TOOL_TAG_TOKENS)
def test_chat_tokens_are_single_ids(tokenizer, token):
    (token_id,) = tokenizer(token, add_special_tokens=False)["input_ids"]
    ids = tokenizer(f"a{token}b\n{token}", add_special_tokens=False)["input_ids"]
    assert ids.count(token_id) == 2
    assert tokenizer.convert_ids_to_tokens(token_id) == token


def test_tool_tags_survive_skipping_special_tokens(tokenizer):
    """vLLM decodes with skip_special_tokens=True: chat control tokens go, tool tags stay."""
    text = '<tool_call>\n{"name": "finish"}\n</tool_call><|im_end|><|endoftext|>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.split("<|im_end|>")[0]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_decode_gives_back_the_exact_text(tokenizer):
    ids = tokenizer(ODD_TEXT, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == ODD_TEXT


def test_identifiers_split_into_known_pieces(tokenizer):
    """A modest vocabulary: unseen identifiers become several ordinary pieces, never unknowns."""
    ids = tokenizer("compute_median_absolute_deviation", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1 and tokenizer.unk_token_id not in ids
    assert tokenizer("    return", add_special_tokens=False)["input_ids"] != []


def test_save_and_load_keep_encoding_and_template(tokenizer, tokenizer_dir):
    loaded = load_tokenizer(tokenizer_dir)
    assert loaded(ODD_TEXT)["input_ids"] == tokenizer(ODD_TEXT)["input_ids"]
    assert loaded.decode(loaded(ODD_TEXT)["input_ids"]) == ODD_TEXT
    assert loaded.chat_template == CHAT_TEMPLATE
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|endoftext|>")
