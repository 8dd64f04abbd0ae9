"""Shared fixtures of the policy tests: one small tokenizer, trained once per session."""

from __future__ import annotations

import pytest

SAMPLE_EVENTS = [
    {"role": "user", "content": "Fix the failing test.\n\nRepository files: mathx.py, tests/test_mathx.py"},
    {"role": "assistant", "action": "run_command", "arguments": {"cmd": "python -m pytest -q"},
     "content": "Run the tests first."},
    {"role": "environment", "observation": "F.\n1 failed: test_add: assert 5 == 4", "truncated": False},
    {"role": "assistant", "action": "read_file", "arguments": {"path": "mathx.py", "start_line": 1}},
    {"role": "environment", "observation": "1: def add(a, b):\n2:     return a - b\n", "truncated": False},
    {"role": "assistant", "action": None, "arguments": {},
     "content": "I'll edit <tool_call>{\"name\": \"edit_file\", \"arguments\": {\"path\": "},
    {"role": "environment", "observation": "error: invalid tool call: not valid JSON", "error": True},
    {"role": "assistant", "action": "edit_file",
     "arguments": {"path": "mathx.py", "old": "a - b", "new": "a + b  # naïve → fixed"}},
    {"role": "environment", "observation": "edited mathx.py", "truncated": False},
    {"role": "assistant", "action": "finish", "arguments": {"summary": "add() subtracted."},
     "content": "All tests pass now."},
    {"role": "environment", "observation": "episode finished", "truncated": False},
]  # fmt: skip


@pytest.fixture
def events() -> list[dict]:
    """A transcript with every event kind: free text, a failed parse, unicode, a finish."""
    return [dict(e) for e in SAMPLE_EVENTS]


@pytest.fixture(scope="session")
def tokenizer():
    from components.policy.tokenizer import build_corpus, train_tokenizer

    corpus = build_corpus([{"trajectory": SAMPLE_EVENTS}], stdlib_bytes=100_000, seed=0)
    return train_tokenizer(corpus, vocab_size=512)


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path
