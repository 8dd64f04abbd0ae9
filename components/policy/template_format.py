"""A checkpoint's own chat format, read off its Jinja chat template.

A template is a program, not a description, so the format is found by rendering probe
conversations and cutting the text where the probes differ:

- the assistant header: the generation prompt minus the conversation before it;
- the end of turn: the added token right after an assistant message's content (`<|eot_id|>`,
  `<|im_end|>`): the model generates it, what follows it is context (`after_turn`);
- the tool-call syntax: an assistant message with one probe call, its body cut around the
  JSON object that carries the probe name (`<|python_tag|>` + {"name", "parameters"} for a
  Llama-3-style template, `<tool_call>\\n` ... `\\n</tool_call>` for Qwen2.5's);
- the observation and user turns: a probe message's text with its content cut out.

Assistant bodies are rendered by the template itself (each message after the same short
probe context), so the text the model is trained on is exactly what the template writes.
The derived pieces must add up: `template_segments` of a transcript must equal the
template's own rendering of it (a test checks it on every event kind), which holds for
templates that render each message on its own (Llama 3.x, Qwen2.5, Hermes and most
others).

A template that renders no tools (SmolLM2-Instruct's) still gives the turns: header, end of
turn, user turn. Tools and calls then travel as plain text inside messages, with tokens the
model already has (`text_tools`: Hermes/Qwen's `<tool_call>{json}</tool_call>`, observations
as a user turn in `<tool_response>` tags, the tools and one demonstrated call in the system
prompt, chat.py); nothing is added to the vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.env.tool_sets import TOOL_SPECS

# Hermes/Qwen's tags around a call and an observation: ours (chat.OURS, as single tokens of
# the tiny tokenizer) and a text_tools format's (as plain text).
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

# The tools as OpenAI-style function specs, for a template's `tools` argument.
TOOLS = [{"type": "function", "function": {"name": n, **spec}} for n, spec in TOOL_SPECS.items()]


@dataclass(frozen=True)
class ChatFormat:
    """The wire format of a transcript, as pieces of text around what varies.

    An assistant turn is `assistant_header` (context), the generated body ending with
    `end_of_turn` (the model writes it: generation stops there), then `after_turn`
    (context). An observation is `tool_turn[0] + text + tool_turn[1]`, a later user
    message likewise with `user_turn`. A tool call is `call_open` + a JSON object
    {name_key: ..., arguments_key: {...}} + `call_close`. `template` is '' for ours
    (chat.OURS: the body is chat.assistant_body, the prompt chat.chat_segments);
    otherwise the checkpoint's own Jinja template, which renders the prompt and each
    assistant body. `text_tools`: the template renders no tools, so the call syntax and
    observation tags are plain text that chat.py writes into the messages' content.
    Here rather than in chat.py, which imports this module.
    """

    end_of_turn: str
    assistant_header: str
    after_turn: str
    tool_turn: tuple[str, str]
    user_turn: tuple[str, str]
    call_open: str
    call_close: str
    name_key: str
    arguments_key: str
    template: str = ""
    text_tools: bool = False


_S, _U, _C, _O = "SYSPROBE", "USERPROBE", "CONTENTPROBE", "OBSERVATIONPROBE"
_CALL = {"name": "NAMEPROBE", "arguments": {"ARGPROBE": "VALUEPROBE"}}
_BASE = [{"role": "system", "content": _S}, {"role": "user", "content": _U}]

_DERIVED: dict[tuple, ChatFormat] = {}
# Per template: (the generation prompt of _BASE, the text that closes an assistant turn).
_PROBE: dict[str, tuple[str, str]] = {}


class TemplateFormatError(ValueError):
    """The template's pieces cannot be found or do not add up to its own rendering."""


def _render(tokenizer, messages: list[dict], generation: bool = False, tools=TOOLS) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation
    )


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's template lists the tools it is given (and renders at all)."""
    if not tokenizer.chat_template:
        return False
    try:
        with_tools = _render(tokenizer, _BASE)
        without = tokenizer.apply_chat_template(_BASE, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on our messages is not usable
        return False
    return with_tools != without


def _after(text: str, prefix: str, what: str) -> str:
    if not text.startswith(prefix):
        raise TemplateFormatError(f"the template does not render {what} as an extension")
    return text[len(prefix) :]


def _cut(text: str, probe: str, what: str) -> tuple[str, str]:
    if text.count(probe) != 1:
        raise TemplateFormatError(f"the template does not render {what}'s content once")
    before, after = text.split(probe)
    return before, after


def _end_of_turn(tokenizer, tail: str) -> str:
    """The longest added token the text after an assistant's content starts with."""
    added = [t for t in tokenizer.get_added_vocab() if t and tail.startswith(t)]
    if not added:
        raise TemplateFormatError(f"no end-of-turn token after an assistant message: {tail!r}")
    return max(added, key=len)


def _call_syntax(body: str) -> dict:
    """call_open / call_close / name_key / arguments_key of the probe call's body."""
    decoder = json.JSONDecoder()
    for i, char in enumerate(body):
        if char != "{":
            continue
        try:
            value, end = decoder.raw_decode(body, i)
        except ValueError:
            continue
        if isinstance(value, dict) and _CALL["name"] in value.values():
            name_key = next(k for k, v in value.items() if v == _CALL["name"])
            args = [k for k, v in value.items() if v == _CALL["arguments"]]
            if not args:
                raise TemplateFormatError("the template writes call arguments as a string")
            return {"call_open": body[:i], "call_close": body[end:], "name_key": name_key,
                    "arguments_key": args[0]}  # fmt: skip
    raise TemplateFormatError(f"no JSON tool call in the template's rendering: {body!r}")


def derive_format(tokenizer) -> ChatFormat:
    """The tokenizer's template as a ChatFormat (cached per template)."""
    key = (tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    if key not in _DERIVED:
        own = _tool_format(tokenizer) if renders_tools(tokenizer) else _text_format(tokenizer)
        _DERIVED[key] = own
    return _DERIVED[key]


def _turns(tokenizer, tools) -> tuple[str, str, str, str]:
    """(plain conversation, its generation prompt, assistant header, text after an assistant
    message's content) of the probe conversation."""
    plain = _render(tokenizer, _BASE, tools=tools)
    prompt = _render(tokenizer, _BASE, generation=True, tools=tools)
    header = _after(prompt, plain, "the generation prompt")
    answered = [*_BASE, {"role": "assistant", "content": _C}]
    text = _after(_render(tokenizer, answered, tools=tools), prompt, "an assistant turn")
    _, tail = _cut(text, _C, "it")
    return plain, prompt, header, tail


def _text_format(tokenizer) -> ChatFormat:
    """A template that renders no tools: its own turns, Hermes-style calls as plain text."""
    _, prompt, header, tail = _turns(tokenizer, None)
    end_of_turn = _end_of_turn(tokenizer, tail)
    answered = [*_BASE, {"role": "assistant", "content": _C}]
    closed = _render(tokenizer, answered, tools=None)
    user = _after(_render(tokenizer, [*answered, {"role": "user", "content": _O}], tools=None),
                  closed, "a user turn")  # fmt: skip
    before, after = _cut(user, _O, "a user turn")
    _PROBE[tokenizer.chat_template] = (prompt, tail)
    return ChatFormat(
        end_of_turn=end_of_turn,
        assistant_header=header,
        after_turn=tail[len(end_of_turn) :],
        tool_turn=(f"{before}{TOOL_RESPONSE_OPEN}\n", f"\n{TOOL_RESPONSE_CLOSE}{after}"),
        user_turn=(before, after),
        call_open=TOOL_CALL_OPEN,
        call_close=TOOL_CALL_CLOSE,
        name_key="name",
        arguments_key="arguments",
        template=tokenizer.chat_template,
        text_tools=True,
    )


def _tool_format(tokenizer) -> ChatFormat:
    """A template that renders tools: its own turns and its own call syntax."""
    _, prompt, header, tail = _turns(tokenizer, TOOLS)
    answered = [*_BASE, {"role": "assistant", "content": _C}]
    end_of_turn = _end_of_turn(tokenizer, tail)
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": _CALL}]}  # fmt: skip
    called = _after(_render(tokenizer, [*_BASE, message]), prompt, "a tool call")
    if not called.endswith(tail):
        raise TemplateFormatError("a tool call's turn does not end like a text turn")
    syntax = _call_syntax(called[: -len(tail)])
    closed = _render(tokenizer, answered)
    tool = _after(
        _render(tokenizer, [*answered, {"role": "tool", "content": _O}]), closed, "a tool turn"
    )
    user = _after(
        _render(tokenizer, [*answered, {"role": "user", "content": _O}]), closed, "a user turn"
    )
    fmt = ChatFormat(
        end_of_turn=end_of_turn,
        assistant_header=header,
        after_turn=tail[len(end_of_turn) :],
        tool_turn=_cut(tool, _O, "a tool turn"),
        user_turn=_cut(user, _O, "a user turn"),
        template=tokenizer.chat_template,
        **syntax,
    )
    _PROBE[tokenizer.chat_template] = (prompt, tail)
    return fmt


def assistant_body(tokenizer, fmt: ChatFormat, message: dict) -> str:
    """What the model generates for an assistant message, without the end of turn, as the
    template renders it after the probe context."""
    prompt, tail = _PROBE[fmt.template]
    tools = None if fmt.text_tools else TOOLS
    text = _after(_render(tokenizer, [*_BASE, message], tools=tools), prompt, "an assistant turn")
    if not text.endswith(tail):
        raise TemplateFormatError("an assistant turn does not end like the probe's")
    return text[: -len(tail)]


def template_segments(tokenizer, fmt: ChatFormat, messages: list[dict]) -> list[tuple[str, bool]]:
    """(text, generated) pieces of `messages` in the template's format; their concatenation
    is `apply_chat_template(messages, tools=TOOLS)` (no tools for `text_tools`). The prompt
    (every message before the first assistant turn) is one piece rendered by the template."""
    # A demonstrated turn (chat.demonstration, `"demo": True`) is part of the prompt.
    turns = (i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("demo"))
    first = next(turns, len(messages))
    if any(m["role"] == "system" for m in messages[first:]):
        raise TemplateFormatError("a system message after the first assistant turn")
    tools = None if fmt.text_tools else TOOLS
    segments = [(_render(tokenizer, messages[:first], tools=tools), False)]
    for message in messages[first:]:
        if message["role"] == "assistant":
            body = assistant_body(tokenizer, fmt, message)
            segments.append((fmt.assistant_header, False))
            segments.append((body + fmt.end_of_turn, True))
            segments.append((fmt.after_turn, False))
        else:
            before, after = fmt.tool_turn if message["role"] == "tool" else fmt.user_turn
            segments.append((before + message["content"] + after, False))
    return [(text, generated) for text, generated in segments if text or generated]
