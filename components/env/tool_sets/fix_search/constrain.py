"""Constrained decoding of `try_fix` ids: inside a try_fix call's id string, only tokens
that continue a listed, untried candidate id can be drawn. It is the fix_search tool set's
decoding constraint (fix_search/__init__.py declares it; the rollout engine applies a
tool set's constraint without knowing what it masks).

Why: the tiny SFT policy learns the *order* in which kinds of fix are worth trying but not
to check which kinds the listing actually shows, so unconstrained most of its tries name
ids the environment rejects (bench/results/fix-tools-design.md). Grammar-constrained
decoding (vLLM's structured outputs, outlines, llguidance) is the standard remedy for
output the environment can check mechanically: the agent is the model plus this decoder,
in sampling and evaluation alike. The choice among the listed ids stays the model's.

Log-probs: the engine stores the model's own log-probs of the drawn tokens (from the raw,
unmasked logits), which is what the trainer recomputes, so the policy-gradient ratio
compares like with like; the mask only decides which token is drawn. The update then
raises or lowers the model's own probability of the listed id it tried, which is also
what moves its unconstrained behaviour toward valid ids. No importance correction for the
mask is applied (as with guided decoding in RL rollouts elsewhere).

Matching is on text, not token ids: a token is allowed when the id typed so far plus the
token's text is a prefix of `<allowed id>"`, or runs past that closing quote only into the
call's closing braces (a token such as `"}}`), so any tokenization of the id works. The
second condition matters because a policy made to write an id it would not have chosen
tends to go on with `": "` or `", "` after the quote, an invalid call; only closing tokens
may follow it. torch / transformers load lazily.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from components.env.tool_sets.fix_search.fixes import listed_ids

# This turn's text so far ends inside the id string of a try_fix call (our chat format puts
# "name" before "arguments"; see components/policy/chat.py).
_OPEN_ID = re.compile(r'"name":\s*"try_fix".*?"id":\s*"([^"]*)$', re.DOTALL)


def open_fix_id(turn_text: str) -> str | None:
    """The id typed so far when `turn_text` ends inside a try_fix call's id string, else None."""
    m = _OPEN_ID.search(turn_text)
    return m.group(1) if m else None


# try_fix takes only "id", so after the id's closing quote the JSON can only close: a token
# that runs past the quote may carry braces and whitespace, or begin the call's canonical end.
_CLOSING = re.compile(r"[\s}]*")
_CANONICAL_END = "}}\n</tool_call>"


def allowed_token_ids(typed: str, fix_ids: Sequence[str], token_texts: Sequence[str]) -> list[int]:
    """Token ids whose text continues `typed` toward one of `fix_ids`, then its closing `"`
    (a token running past the quote only into the closing of the call)."""
    targets = [f'{f}"' for f in fix_ids if f.startswith(typed)]
    out = []
    for token_id, text in enumerate(token_texts):
        if not text:
            continue
        s = typed + text
        for t in targets:
            if t.startswith(s):
                out.append(token_id)
                break
            if s.startswith(t):
                rest = s[len(t) :]
                if _CLOSING.fullmatch(rest) or _CANONICAL_END.startswith(rest):
                    out.append(token_id)
                    break
    return out


def untried_fix_ids(events: Sequence[dict]) -> list[str] | None:
    """The listed candidate ids not yet applied, from an episode's events (None before any
    `list_fixes` listing): what EpisodeEnv.fix_listing holds, read back from the transcript
    for policies that see only events."""
    listed: list[str] | None = None
    tried: set[str] = set()
    for action, result in zip(events[1::2], events[2::2], strict=False):
        observation = result.get("observation") or ""
        if action.get("action") == "list_fixes" and "Candidate fixes of" in observation:
            listed, tried = listed_ids(observation), set()
        elif action.get("action") == "try_fix" and not observation.startswith("error"):
            tried.add(str(action.get("arguments", {}).get("id")))
    return None if listed is None else [i for i in listed if i not in tried]


@functools.lru_cache(maxsize=4)
def _token_texts(tokenizer) -> tuple[str, ...]:
    """Each vocabulary id decoded on its own: once per tokenizer, not once per turn."""
    return tuple(tokenizer.decode([i]) for i in range(len(tokenizer)))


class FixIdLogitsProcessor:
    """A transformers LogitsProcessor: per row, masks every token that cannot continue one
    of that row's allowed ids while the row is inside a try_fix id string. Rows with
    `allowed[i]` None or empty are never masked (an exhausted listing: the environment
    answers whatever comes)."""

    def __init__(self, tokenizer, prompt_width: int, allowed: Sequence[Sequence[str] | None]):
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.allowed = [tuple(a) if a else None for a in allowed]
        self.token_texts = _token_texts(tokenizer)
        self._cache: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def __call__(self, input_ids, scores):
        import torch

        for row, allowed in enumerate(self.allowed):
            if allowed is None:
                continue
            generated = input_ids[row, self.prompt_width :].tolist()
            typed = open_fix_id(self.tokenizer.decode(generated, skip_special_tokens=False))
            if typed is None:
                continue
            key = (typed, allowed)
            if key not in self._cache:
                self._cache[key] = allowed_token_ids(typed, allowed, self.token_texts)
            keep = self._cache[key]
            if not keep:
                continue  # typed past every allowed id: let the environment answer
            masked = torch.full_like(scores[row], float("-inf"))
            index = torch.tensor(keep, device=scores.device)
            masked[index] = scores[row, index]
            scores[row] = masked
        return scores
