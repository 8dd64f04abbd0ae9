"""A byte-level BPE tokenizer trained locally, wrapped as a transformers fast tokenizer.

No tokenizer can be downloaded, so the policy's tokenizer is trained here on the project's
own text: expert trajectories rendered through the chat format, plus a bounded, seeded
sample of the Python standard library's sources (code the agent reads and writes).

Choices, and why:
- Byte-level, Qwen2's pre-tokenizer split (digits one by one, words, punctuation runs,
  newlines): every string round-trips exactly and line numbers tokenize uniformly.
- A modest vocabulary (default 3k): held-out identifiers split into rare tokens are hard
  for a tiny model to copy; with few merges they split into common pieces instead.
- `<|im_start|>`, `<|im_end|>`, `<|endoftext|>` (pad) are special tokens; the four tool tags
  are added tokens that are *not* special: each is one id, but decoding with
  `skip_special_tokens=True` (vLLM's default) keeps them, so the tool-call parser sees them.
  This mirrors Qwen2.5's tokenizer.
- Deterministic: the same corpus and seed give the same vocabulary and merges.
"""

from __future__ import annotations

import os
import random
import re
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from components.policy.chat import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    PAD,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    render_messages,
    render_text,
    system_prompt,
)

SPECIAL_TOKENS = (PAD, IM_START, IM_END)
TOOL_TAG_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

# Qwen2's pre-tokenizer split: contractions, letter runs (with one leading non-letter),
# single digits, punctuation runs, newline runs, other whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_MARKER_SPLIT = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *TOOL_TAG_TOKENS)))
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}


def stdlib_sources(max_bytes: int, seed: int = 0, max_file_bytes: int = 20_000) -> list[str]:
    """A seeded sample of the interpreter's standard-library `.py` files, `max_bytes` in all.

    Each file contributes at most `max_file_bytes` (its beginning) so a few huge modules do
    not dominate the sample.
    """
    if max_bytes <= 0:
        return []
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        files.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    files.sort()  # os.walk order depends on the file system; the sample must not
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")[:max_file_bytes]
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text[: max_bytes - total])
        total += len(texts[-1])
        if total >= max_bytes:
            break
    return texts


def trajectory_texts(records: Iterable[dict], compact: bool = True) -> list[str]:
    """Canonical trajectory records rendered exactly as the policy will see them."""
    return [render_text(render_messages(r["trajectory"], compact)) for r in records]


def build_corpus(
    records: Iterable[dict] = (),
    texts: Iterable[str] = (),
    stdlib_bytes: int = 2_000_000,
    seed: int = 0,
    compact: bool = True,
) -> list[str]:
    """Tokenizer corpus: both system prompts, rendered trajectories, extra texts, stdlib sample."""
    corpus = [system_prompt(compact=True), system_prompt(compact=False)]
    corpus += trajectory_texts(records, compact)
    corpus += list(texts)
    corpus += stdlib_sources(stdlib_bytes, seed)
    return corpus


def train_tokenizer(corpus: list[str], vocab_size: int = 3072, min_frequency: int = 2):
    """Train byte-level BPE on `corpus`; returns a PreTrainedTokenizerFast with CHAT_TEMPLATE.

    `vocab_size` counts the special and tool-tag tokens; a small corpus can end below it.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    extra = len(SPECIAL_TOKENS) + len(TOOL_TAG_TOKENS)
    if vocab_size < 256 + extra + 1:
        raise ValueError(f"vocab_size must be > {256 + extra} (256 bytes + {extra} added tokens)")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - extra,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    # Train on the text between markers, as the tokenizer will see it once the markers are
    # added tokens: no merge is spent on their pieces.
    pieces = [p for text in corpus for p in _MARKER_SPLIT.split(text) if p]
    backend.train_from_iterator(pieces, trainer=trainer, length=len(pieces))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAG_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,  # decoding must give back the exact text
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(path: str | Path):
    """A tokenizer saved with `save_pretrained` (local files only). It keeps its own chat
    template if a chat format can be read off it (chat.chat_format: its own tool calls, or
    plain-text ones when it renders no tools); otherwise (no template, or one without an
    end-of-turn token) it gets ours.

    A `tokenizer.json` is loaded as is. AutoTokenizer is not used for it: in transformers 5
    it rebuilds the pipeline from the model family (a qwen2 config.json gets
    Qwen2Tokenizer, which adds an NFC normalizer), and our tokenizer must round-trip bytes.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    if (path / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    from components.policy.template_format import TemplateFormatError, derive_format

    if tokenizer.chat_template and tokenizer.chat_template != CHAT_TEMPLATE:
        try:
            derive_format(tokenizer)
        except TemplateFormatError:
            tokenizer.chat_template = CHAT_TEMPLATE
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
