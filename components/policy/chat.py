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

A checkpoint brought with its own tokenizer keeps its own format when its chat template
renders tools (`apply_chat_template(messages, tools=...)`): `chat_format(tokenizer)` then
describes that template's wire format (derived from it once, policy/template_format.py),
and the segments, the assistant mask, the environment turns of a rollout and the tool-call
parser all follow it. A checkpoint whose template renders no tools (SmolLM2-Instruct's)
keeps its template too, and the tools travel as plain text in the messages (`text_tools`):
the format above, written with the tokens the model already has (the tags are several
ordinary tokens, never new ones), with one demonstrated call as a turn before the task
(given the tool descriptions alone SmolLM2-135M wrote no valid call). Its parser also takes a bare
JSON call (in a code fence or not): a model that was never trained on the tags writes
those. Every function that takes a tokenizer dispatches on it; a tokenizer with our
CHAT_TEMPLATE (every tiny policy) gets the format above.

The system prompt lists the tools of the episode's tool set (components/env/tool_sets/)
and only those: the set is read from the transcript's first event (`"tool_set"`, written by
the environment; a transcript without it, e.g. an imported expert log, gets the default
free-form set), so a transcript renders with the prompt its policy saw, wherever it is
rendered again.

No torch here: the CLI and the environment import this module.
"""

from __future__ import annotations

import dataclasses
import json

from components.env.episode import Action
from components.env.tool_sets import DEFAULT_TOOL_SET, argument_errors, tool_set, tool_set_specs
from components.policy.template_format import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ChatFormat,
    derive_format,
    template_segments,
)

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
ASSISTANT_HEADER = f"{IM_START}assistant\n"

_TASK_LINE = "You are a coding agent. Fix the failing unit tests, then call finish."
# The system message when the checkpoint's own template lists the tools (its own way).
TEMPLATE_SYSTEM = f"{_TASK_LINE} Call exactly one tool per turn."
OURS = ChatFormat(
    end_of_turn=IM_END,
    assistant_header=ASSISTANT_HEADER,
    after_turn="\n",
    tool_turn=(f"{IM_START}user\n{TOOL_RESPONSE_OPEN}\n", f"\n{TOOL_RESPONSE_CLOSE}{IM_END}\n"),
    user_turn=(f"{IM_START}user\n", f"{IM_END}\n"),
    call_open=TOOL_CALL_OPEN,
    call_close=TOOL_CALL_CLOSE,
    name_key="name",
    arguments_key="arguments",
)


def chat_format(tokenizer) -> ChatFormat:
    """The format `tokenizer` reads and writes: ours, unless its chat template is a
    checkpoint's own (kept by `model.load_tokenizer` only when it renders tools)."""
    template = tokenizer.chat_template
    if not template or template == CHAT_TEMPLATE:
        return OURS
    return derive_format(tokenizer)


def end_of_turn_id(tokenizer) -> int:
    """The id that ends an assistant turn (generation stops on it)."""
    return tokenizer.convert_tokens_to_ids(chat_format(tokenizer).end_of_turn)


def _signature(name: str, spec: dict) -> str:
    params = spec["parameters"]
    args = [k if k in params["required"] else f"{k}?" for k in params["properties"]]
    return f"{name}({', '.join(args)})"


def events_tool_set(events: list[dict]) -> str:
    """The tool set a transcript was played with (its first event's `tool_set`; the default
    set for a transcript that does not say, e.g. an imported expert log)."""
    first = events[0] if events else {}
    return first.get("tool_set") or DEFAULT_TOOL_SET


def template_tools(tool_set: str = DEFAULT_TOOL_SET) -> list[dict]:
    """The set's tools as OpenAI-style function specs, for a template's `tools` argument."""
    specs = tool_set_specs(tool_set)
    return [{"type": "function", "function": {"name": n, **spec}} for n, spec in specs.items()]


def system_prompt(compact: bool = True, tool_set: str = DEFAULT_TOOL_SET) -> str:
    """The tools prompt of `tool_set`: its tools and no others. Compact: one short line per
    tool, for a tiny model's short context."""
    specs = tool_set_specs(tool_set)
    if compact:
        tools = " | ".join(_signature(name, spec) for name, spec in specs.items())
        return (
            f"{_TASK_LINE} One tool call per turn: "
            f'{TOOL_CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CALL_CLOSE}\n'
            f"Tools: {tools}"
        )
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in template_tools(tool_set))
    return (
        f"{_TASK_LINE}\n\n# Tools\n\nCall exactly one function per turn.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        f"within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n"
        f'{TOOL_CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{TOOL_CALL_CLOSE}"
    )


# One demonstrated exchange per tool set (its first tool that has one, `Tool.demo`), for a
# text_tools prompt: a request and the call that answers it, as a turn before the task.
# Measured on SmolLM2-135M-Instruct: with the example only inside the system prompt it
# echoed the task; after a demonstrated turn it wrote the call.


def demonstration(tool_set_name: str = DEFAULT_TOOL_SET) -> list[dict]:
    """The demonstrated exchange of a text_tools prompt: context, never trained on (the
    assistant message carries `"demo": True`, which templates ignore)."""
    tool = next(t for t in tool_set(tool_set_name).tools.values() if t.demo is not None)
    request, arguments = tool.demo
    call = format_tool_call(tool.name, arguments)
    return [{"role": "user", "content": request},
            {"role": "assistant", "content": call, "demo": True}]  # fmt: skip


def first_turn(messages: list[dict]) -> int:
    """Index of the first assistant message the model generated (not a demonstration)."""
    turns = (i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("demo"))
    return next(turns, len(messages))


def render_messages(events: list[dict], compact: bool = True, fmt: ChatFormat = OURS) -> list[dict]:
    """Canonical events -> chat messages (system prompt first; observations as `tool` turns).

    An assistant event with `action: null` (an unparseable output) keeps its raw text as the
    message content and has no tool call, so the model is trained on what it actually wrote.
    With a checkpoint's own template (`fmt.template`) the system message only states the
    task: the template lists the tools (`template_tools`) in its own way. With a template
    that renders no tools (`fmt.text_tools`), the tools, calls and observations are text in
    the messages' content, observations are user turns (every template renders those),
    and one demonstrated exchange (`demonstration`) comes before the task.
    """
    tool_set = events_tool_set(events)
    system = TEMPLATE_SYSTEM if fmt.template else system_prompt(compact, tool_set)
    messages: list[dict] = [{"role": "system", "content": system}]
    if fmt.text_tools:
        messages = [{"role": "system", "content": system_prompt(compact, tool_set)},
                    *demonstration(tool_set)]  # fmt: skip
    for i, event in enumerate(events):
        role = event.get("role")
        if role == "user":
            messages.append({"role": "user", "content": event["content"]})
        elif role == "assistant":
            message = {"role": "assistant", "content": event.get("content") or ""}
            if event.get("action") is not None:
                call = {"name": event["action"], "arguments": event.get("arguments") or {}}
                message["tool_calls"] = [{"type": "function", "function": call}]
            if fmt.text_tools:
                message = {"role": "assistant", "content": assistant_body(message)}
            messages.append(message)
        elif role == "environment" and fmt.text_tools:
            text = f"{TOOL_RESPONSE_OPEN}\n{event['observation']}\n{TOOL_RESPONSE_CLOSE}"
            messages.append({"role": "user", "content": text})
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

    With our CHAT_TEMPLATE this equals
    `render_text(render_messages(events), add_generation_prompt=True)`; a checkpoint's own
    template also gets the tools.
    """
    fmt = chat_format(tokenizer)
    own_tools = fmt.template and not fmt.text_tools
    tools = template_tools(events_tool_set(events)) if own_tools else None
    return tokenizer.apply_chat_template(
        render_messages(events, compact, fmt), tools=tools,
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip


def trajectory_segments(tokenizer, events: list[dict], compact: bool = True):
    """`chat_segments` of the events in the tokenizer's format: (text, generated) pieces."""
    fmt = chat_format(tokenizer)
    messages = render_messages(events, compact, fmt)
    if not fmt.template:
        return chat_segments(messages)
    segments = template_segments(tokenizer, fmt, messages)
    # template_segments renders the prompt (its first piece: every message before the first
    # assistant turn) with every known tool; the episode's prompt lists its set's only.
    first = first_turn(messages)
    tools = None if fmt.text_tools else template_tools(events_tool_set(events))
    prompt = tokenizer.apply_chat_template(
        messages[:first], tools=tools, tokenize=False, add_generation_prompt=False
    )
    return [(prompt, False), *segments[1:]]


def environment_turn_pieces(tokenizer, observation: str, closed: bool) -> list[str]:
    """The context after an assistant turn, piece by piece as `trajectory_segments` cuts it:
    [end of turn (if the turn was cut before it)], what follows a turn, the observation's
    turn, the next assistant header."""
    fmt = chat_format(tokenizer)
    before, after = fmt.tool_turn
    pieces = [fmt.after_turn, f"{before}{observation}{after}", fmt.assistant_header]
    return ([] if closed else [fmt.end_of_turn]) + pieces


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
    segments = trajectory_segments(tokenizer, events, compact)
    header = chat_format(tokenizer).assistant_header
    ids, _ = _encode_segments(tokenizer, [*segments, (header, False)])
    return ids


def tokenize_trajectory(
    tokenizer, events: list[dict], max_tokens: int | None = None, compact: bool = True
) -> dict:
    """Token ids of a whole transcript and a mask that is 1 exactly on assistant-generated tokens
    (except those of assistant events marked "train": false).

    Returns {"input_ids": list[int], "assistant_mask": list[int], "truncated": bool}; a
    transcript longer than `max_tokens` keeps its first `max_tokens` tokens.
    """
    segments = trajectory_segments(tokenizer, events, compact)
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


def _call_start(body: str, fmt: ChatFormat) -> int:
    """Where the call's opening marker starts in `body` (-1: none). A format whose calls
    have no marker (a bare JSON object) starts at the first `{` that opens an object with
    the format's name key."""
    opener = fmt.call_open.strip()
    if opener:
        return body.find(opener)
    decoder = json.JSONDecoder()
    for i, char in enumerate(body):
        if char == "{":
            try:
                value, _ = decoder.raw_decode(body, i)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict) and fmt.name_key in value:
                return i
    return -1


def parse_tool_call_with_notes(text: str, fmt: ChatFormat = OURS) -> tuple[Action, list[str]]:
    """`parse_tool_call`, plus notes on what a successful parse tolerated or ignored."""
    if not isinstance(text, str):
        return _failure(repr(text), f"model output must be text, got {type(text).__name__}")
    opener, closer = fmt.call_open.strip(), fmt.call_close.strip()
    expected = f"{opener}{{json}}{closer}"
    # Generation stops at the end-of-turn token; anything after it was never meant as output.
    body = text.split(fmt.end_of_turn, 1)[0]
    # Nor is an observation the model writes itself: from its opening on, it imagines the
    # environment's answer, so a call inside that echo is not the model's action (one after
    # a real call is trailing text; an argument may contain the tag, e.g. an edit of this file).
    notes = []
    start = _call_start(body, fmt)
    markers = {TOOL_RESPONSE_OPEN, fmt.tool_turn[0].strip()} - {""}
    echo = min((body.find(m) for m in markers if m in body), default=-1)
    if echo >= 0 and (start < 0 or echo < start):
        body = body[:echo]
        notes.append("text from an observation the model wrote on is ignored")
        start = _call_start(body, fmt)
    if start < 0 and fmt.text_tools and closer not in body:
        # A model never trained on the tags writes a bare JSON call (often in a code fence).
        opener = closer = ""
        fmt = dataclasses.replace(fmt, call_open="", call_close="")
        start = _call_start(body, fmt)
        if start >= 0:
            notes.append(f"a bare JSON call, without {expected}")
    if start < 0:
        if closer and closer in body:
            return _failure(body, f"found {closer} without {opener}")
        return _failure(body, f"no tool call: expected {expected}")
    content = body[:start].strip()
    if not opener:
        content = content.removesuffix("```json").removesuffix("```").strip()
    # Decode the JSON first and look for the closing tag after it: an argument may itself
    # contain "</tool_call>" (an agent editing chat code), which a plain find() would cut.
    payload = body[start + len(opener) :].lstrip()
    if not payload or (closer and payload.startswith(closer)):
        return _failure(body, f"empty {opener or 'tool call'} block")
    try:
        call, used = json.JSONDecoder().raw_decode(payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return _failure(body, f"tool call is not valid JSON: {str(exc)[:200]}")
    after = payload[used:].lstrip()
    if not opener and after.startswith("```"):
        after = after[3:]
    if closer and after.startswith(closer):
        after = after[len(closer) :]
    elif closer and not after:
        # Like vLLM's Hermes parser, accept a final call whose closing tag was cut off.
        notes.append(f"missing {closer}")
    elif closer:
        return _failure(body, "unexpected text after the JSON object inside the tool call")
    if not isinstance(call, dict):
        return _failure(body, f'tool call must be a JSON object {{"{fmt.name_key}": ..., '
                              f'"{fmt.arguments_key}": {{...}}}}')  # fmt: skip
    name = call.get(fmt.name_key)
    if not isinstance(name, str):
        return _failure(body, f"tool call has no string '{fmt.name_key}'")
    arguments = call.get(fmt.arguments_key, {})
    errors = argument_errors(name, arguments)
    if errors:
        return _failure(body, "; ".join(errors))
    extra_calls = after.count(opener) if opener else after.count(f'"{fmt.name_key}"')
    if extra_calls:
        notes.append(f"{extra_calls + 1} tool calls in one turn; only the first is used")
    elif after.strip():
        notes.append(f"text after {closer or 'the call'} ignored")
    return Action(tool=name, arguments=arguments, content=content or None), notes


def parse_tool_call(text: str, fmt: ChatFormat = OURS) -> Action:
    """The model's output -> Action. Never raises: a bad call is Action(tool=None, parse_error=...).

    Accepts free text before one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    (a missing closing tag is tolerated; with several calls the first is used). Rejects, with
    a reason: no call, malformed JSON, a non-object, a missing name, an unknown tool, invalid
    arguments (`argument_errors`). For a failure, `content` is the raw output. `fmt`: the
    policy's format (`chat_format(tokenizer)`): a checkpoint's own call syntax.
    """
    try:
        return parse_tool_call_with_notes(text, fmt)[0]
    except Exception as exc:  # noqa: BLE001 - model output is untrusted; the contract is no raise
        raw = text if isinstance(text, str) else repr(text)
        return Action(None, {}, content=raw, parse_error=f"unparseable output ({exc!r})"[:300])


def assistant_turn_tokens(tokenizer, events: list[dict], compact: bool = True) -> list[int]:
    """Tokens of each assistant turn of a transcript as the model generates it (its body and
    end-of-turn token): what a turn budget (`RolloutConfig.max_new_tokens`) must hold."""
    pieces = [text for text, generated in trajectory_segments(tokenizer, events, compact)
              if generated]  # fmt: skip
    if not pieces:
        return []
    return [len(ids) for ids in tokenizer(pieces, add_special_tokens=False)["input_ids"]]
