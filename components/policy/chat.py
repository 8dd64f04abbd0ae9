"""The chat / tool-call format the policy reads and writes (Qwen2.5 / Hermes style).

    <|im_start|>system\n{tools prompt}<|im_end|>\n
    <|im_start|>user\n{task}<|im_end|>\n
    <|im_start|>assistant\n{optional text}\n<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n
    <|im_start|>user\n<tool_response>\n{observation}\n</tool_response><|im_end|>\n
    ...

This is the format real open models are trained on, so a `pretrained_path` checkpoint of
that family reads our transcripts without relearning the wrapper. Canonical trajectory
events (docs/CONTRACTS.md) become OpenAI-style messages (`render_messages`); the messages
become text one segment at a time (`chat_segments`), so the training mask is exact: the
assistant segment is precisely what the model generates after the `<|im_start|>assistant\n`
header, up to and including `<|im_end|>`. `CHAT_TEMPLATE` is the same rendering in Jinja,
saved with the tokenizer for serving stacks (vLLM, `apply_chat_template`); a test keeps
the two equal.

No torch here: the CLI and the environment import this module.
"""

from __future__ import annotations

import json

from components.env.episode import Action
from components.env.tool_specs import TOOL_SPECS, argument_errors

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ASSISTANT_HEADER = f"{IM_START}assistant\n"

_TASK_LINE = "You are a coding agent. Fix the failing unit tests, then call finish."


def _signature(name: str, spec: dict) -> str:
    params = spec["parameters"]
    args = [k if k in params["required"] else f"{k}?" for k in params["properties"]]
    return f"{name}({', '.join(args)})"


def system_prompt(compact: bool = True) -> str:
    """The tools prompt. Compact: one short line per tool, for a tiny model's short context."""
    if compact:
        tools = " | ".join(_signature(name, spec) for name, spec in TOOL_SPECS.items())
        return (
            f"{_TASK_LINE} One tool call per turn: "
            f'{TOOL_CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CALL_CLOSE}\n'
            f"Tools: {tools}"
        )
    schemas = "\n".join(
        json.dumps({"type": "function", "function": {"name": name, **spec}}, ensure_ascii=False)
        for name, spec in TOOL_SPECS.items()
    )
    return (
        f"{_TASK_LINE}\n\n# Tools\n\nCall exactly one function per turn.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        f"within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n"
        f'{TOOL_CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{TOOL_CALL_CLOSE}"
    )


def render_messages(events: list[dict], compact: bool = True) -> list[dict]:
    """Canonical events -> chat messages (system prompt first; observations as `tool` turns).

    An assistant event with `action: null` (an unparseable output) keeps its raw text as the
    message content and has no tool call, so the model is trained on what it actually wrote.
    """
    messages: list[dict] = [{"role": "system", "content": system_prompt(compact)}]
    for i, event in enumerate(events):
        role = event.get("role")
        if role == "user":
            messages.append({"role": "user", "content": event["content"]})
        elif role == "assistant":
            message = {"role": "assistant", "content": event.get("content") or ""}
            if event.get("action") is not None:
                call = {"name": event["action"], "arguments": event.get("arguments") or {}}
                message["tool_calls"] = [{"type": "function", "function": call}]
            messages.append(message)
        elif role == "environment":
            messages.append({"role": "tool", "content": event["observation"]})
        else:
            raise ValueError(f"event {i}: unknown role {role!r}")
    return messages


def format_tool_call(name: str, arguments: dict) -> str:
    """One call as the model writes it (key order and spacing as Qwen2.5's template)."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def assistant_body(message: dict) -> str:
    """What the model generates for an assistant message, without the end-of-turn token."""
    calls = [
        format_tool_call(c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or []
    ]
    content = message.get("content") or ""
    if content and calls:
        content += "\n"
    return content + "\n".join(calls)


def chat_segments(messages: list[dict]) -> list[tuple[str, bool]]:
    """(text, generated_by_assistant) pieces whose concatenation is the whole transcript.

    The assistant's own piece is its body plus `<|im_end|>` (generation stops on it, so the
    model must learn to emit it); the role header before and the newline after are context.
    """
    segments: list[tuple[str, bool]] = []
    for message in messages:
        role = message["role"]
        if role == "assistant":
            segments.append((ASSISTANT_HEADER, False))
            segments.append((assistant_body(message) + IM_END, True))
            segments.append(("\n", False))
        elif role == "tool":
            text = f"{TOOL_RESPONSE_OPEN}\n{message['content']}\n{TOOL_RESPONSE_CLOSE}"
            segments.append((f"{IM_START}user\n{text}{IM_END}\n", False))
        else:
            segments.append((f"{IM_START}{role}\n{message['content']}{IM_END}\n", False))
    return segments


def render_text(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The transcript as one string; equal to `apply_chat_template` with CHAT_TEMPLATE."""
    text = "".join(text for text, _ in chat_segments(messages))
    return text + ASSISTANT_HEADER if add_generation_prompt else text


# The Jinja twin of `chat_segments`, saved as the tokenizer's chat_template. transformers
# renders it with trim_blocks/lstrip_blocks and a `tojson` that is json.dumps(ensure_ascii=False).
CHAT_TEMPLATE = r"""{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message['content'] -%}
{{- message['content'] -}}
{%- if message['tool_calls'] -%}{{- '\n' -}}{%- endif -%}
{%- endif -%}
{%- for call in message['tool_calls'] or [] -%}
{%- if not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson + '\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message['role'] == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""


def render_prompt(tokenizer, events: list[dict], compact: bool = True) -> str:
    """Generation prompt as text (ends with the assistant header), via the tokenizer's template.

    `build_policy`/`load_policy` install CHAT_TEMPLATE on every tokenizer, so this equals
    `render_text(render_messages(events), add_generation_prompt=True)`.
    """
    return tokenizer.apply_chat_template(
        render_messages(events, compact), tokenize=False, add_generation_prompt=True
    )


def _encode_segments(tokenizer, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    # Each piece is tokenized on its own and the ids concatenated: this is exactly what the
    # model sees at generation time (a prompt ending in the header, then its own tokens), and
    # it makes the assistant mask exact by construction.
    encoded = tokenizer([text for text, _ in segments], add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    mask: list[int] = []
    for (_, generated), piece in zip(segments, encoded, strict=True):
        ids.extend(piece)
        mask.extend([int(generated)] * len(piece))
    return ids, mask


def prompt_ids(tokenizer, events: list[dict], compact: bool = True) -> list[int]:
    """Token ids of the generation prompt, tokenized the way `tokenize_trajectory` does."""
    segments = chat_segments(render_messages(events, compact))
    ids, _ = _encode_segments(tokenizer, [*segments, (ASSISTANT_HEADER, False)])
    return ids


def tokenize_trajectory(
    tokenizer, events: list[dict], max_tokens: int | None = None, compact: bool = True
) -> dict:
    """Token ids of a whole transcript and a mask that is 1 exactly on assistant-generated tokens
    (except those of assistant events marked "train": false).

    Returns {"input_ids": list[int], "assistant_mask": list[int], "truncated": bool}; a
    transcript longer than `max_tokens` keeps its first `max_tokens` tokens.
    """
    segments = chat_segments(render_messages(events, compact))
    # An assistant event with "train": false (an expert's deliberate mistake, kept to show
    # recovery) stays in the context but out of the mask. Assistant segments follow the
    # assistant events in order; `and` calls next() on assistant segments only.
    imitate = iter([e.get("train", True) for e in events if e.get("role") == "assistant"])
    segments = [(text, generated and bool(next(imitate))) for text, generated in segments]
    ids, mask = _encode_segments(tokenizer, segments)
    truncated = max_tokens is not None and len(ids) > max_tokens
    if truncated:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return {"input_ids": ids, "assistant_mask": mask, "truncated": truncated}


def _failure(raw: str, reason: str) -> tuple[Action, list[str]]:
    return Action(tool=None, arguments={}, content=raw, parse_error=reason), []


def parse_tool_call_with_notes(text: str) -> tuple[Action, list[str]]:
    """`parse_tool_call`, plus notes on what a successful parse tolerated or ignored."""
    if not isinstance(text, str):
        return _failure(repr(text), f"model output must be text, got {type(text).__name__}")
    # Generation stops at the end-of-turn token; anything after it was never meant as output.
    body = text.split(IM_END, 1)[0]
    start = body.find(TOOL_CALL_OPEN)
    if start < 0:
        if TOOL_CALL_CLOSE in body:
            return _failure(body, f"found {TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
        return _failure(body, f"no tool call: expected {TOOL_CALL_OPEN}{{json}}{TOOL_CALL_CLOSE}")
    content = body[:start].strip()
    # Decode the JSON first and look for the closing tag after it: an argument may itself
    # contain "</tool_call>" (an agent editing chat code), which a plain find() would cut.
    payload = body[start + len(TOOL_CALL_OPEN) :].lstrip()
    if not payload or payload.startswith(TOOL_CALL_CLOSE):
        return _failure(body, f"empty {TOOL_CALL_OPEN} block")
    try:
        call, used = json.JSONDecoder().raw_decode(payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return _failure(body, f"tool call is not valid JSON: {str(exc)[:200]}")
    after = payload[used:].lstrip()
    notes = []
    if after.startswith(TOOL_CALL_CLOSE):
        after = after[len(TOOL_CALL_CLOSE) :]
    elif not after:
        # Like vLLM's Hermes parser, accept a final call whose closing tag was cut off.
        notes.append(f"missing {TOOL_CALL_CLOSE}")
    else:
        return _failure(body, "unexpected text after the JSON object inside the tool call")
    if not isinstance(call, dict):
        return _failure(body, 'tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = call.get("name")
    if not isinstance(name, str):
        return _failure(body, "tool call has no string 'name'")
    arguments = call.get("arguments", {})
    errors = argument_errors(name, arguments)
    if errors:
        return _failure(body, "; ".join(errors))
    extra_calls = after.count(TOOL_CALL_OPEN)
    if extra_calls:
        notes.append(f"{extra_calls + 1} tool calls in one turn; only the first is used")
    elif after.strip():
        notes.append(f"text after {TOOL_CALL_CLOSE} ignored")
    return Action(tool=name, arguments=arguments, content=content or None), notes


def parse_tool_call(text: str) -> Action:
    """The model's output -> Action. Never raises: a bad call is Action(tool=None, parse_error=...).

    Accepts free text before one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    (a missing closing tag is tolerated; with several calls the first is used). Rejects, with
    a reason: no call, malformed JSON, a non-object, a missing name, an unknown tool, invalid
    arguments (`argument_errors`). For a failure, `content` is the raw output.
    """
    try:
        return parse_tool_call_with_notes(text)[0]
    except Exception as exc:  # noqa: BLE001 - model output is untrusted; the contract is no raise
        raw = text if isinstance(text, str) else repr(text)
        return Action(None, {}, content=raw, parse_error=f"unparseable output ({exc!r})"[:300])
