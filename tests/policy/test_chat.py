"""Chat format: parser robustness, render/parse round trip, template equality, exact masks."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from components.env.tool_sets import TOOL_SETS, TOOL_SPECS
from components.policy.chat import (
    ASSISTANT_HEADER,
    IM_END,
    assistant_body,
    assistant_turn_tokens,
    chat_segments,
    format_tool_call,
    parse_tool_call,
    parse_tool_call_with_notes,
    prompt_ids,
    render_messages,
    render_prompt,
    render_text,
    system_prompt,
    tokenize_trajectory,
)


def call(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


VALID_CALLS = [
    ("run_command", {"cmd": "python -m pytest -q"}),
    ("search", {"pattern": r"def add\(", "path": "src"}),
    ("read_file", {"path": "mathx.py", "start_line": 3, "end_line": 9}),
    ("edit_file", {"path": "m.py", "old": 'x = "a"\n', "new": "x = 'ü'\n\t# </tool_response>"}),
    ("edit_file", {"path": "chat.py", "old": "<tool_call>", "new": "</tool_call>\n<|im_start|>"}),
    ("apply_patch", {"patch": "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"}),
    ("finish", {}),
    ("finish", {"summary": "done"}),
]


@pytest.mark.parametrize(("name", "arguments"), VALID_CALLS)
@pytest.mark.parametrize("content", [None, "Let me look.", "two\nlines"])
def test_render_then_parse_round_trip(name, arguments, content):
    message = render_messages([{"role": "assistant", "action": name, "arguments": arguments,
                                "content": content}])[-1]  # fmt: skip
    action = parse_tool_call(assistant_body(message) + IM_END)
    assert (action.tool, action.arguments, action.content, action.parse_error) == (
        name, arguments, content, None,
    )  # fmt: skip


MALFORMED = [
    ("", "no tool call"),
    ("I think the bug is in add().", "no tool call"),
    ('{"name": "finish", "arguments": {}}', "no tool call"),  # JSON without the tags
    ('</tool_call>{"name": "finish"}', "without <tool_call>"),
    ("<tool_call>\n\n</tool_call>", "empty <tool_call>"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": }}</tool_call>', "not valid JSON"),
    ("<tool_call>{'name': 'finish', 'arguments': {}}</tool_call>", "not valid JSON"),  # Python repr
    ('<tool_call>{"name": "finish", "arguments": {}} and more</tool_call>', "after the JSON"),
    ('<tool_call>["finish", {}]</tool_call>', "must be a JSON object"),
    ('<tool_call>{"arguments": {"cmd": "ls"}}</tool_call>', "no string 'name'"),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', "no string 'name'"),
    (call("rm_rf", {"path": "/"}), "unknown tool 'rm_rf'"),
    (call("run_command", '{"cmd": "ls"}'), "arguments must be a JSON object"),
    (call("read_file", {}), "missing argument 'path'"),
    (call("read_file", {"path": "a", "start_line": "3"}), "'start_line' must be integer"),
    (call("read_file", {"path": "a", "start_line": 0}), "must be >= 1"),
    (call("read_file", {"path": "a", "start_line": True}), "must be integer"),
    (call("run_command", {"cmd": "ls", "shell": True}), "unexpected argument 'shell'"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "a", "start_line": NaN}}', "integer"),
    ("<tool_call>" + "[" * 50_000 + "]" * 50_000 + "</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "finish", "arguments": {}', "not valid JSON"),  # cut mid-object
    (f"{IM_END}" + call("finish", {}), "no tool call"),  # the call came after end of turn
]


@pytest.mark.parametrize(("text", "reason"), MALFORMED)
def test_malformed_calls_give_a_reason_and_never_raise(text, reason):
    action = parse_tool_call(text)
    assert action.tool is None
    assert action.arguments == {}
    assert reason in action.parse_error
    assert action.content == text.split(IM_END, 1)[0]  # the raw output, for the transcript


def test_non_text_output_is_a_parse_error():
    action = parse_tool_call(None)  # type: ignore[arg-type]
    assert action.tool is None and "must be text" in action.parse_error


def test_tolerated_defects_are_noted():
    # Cut before the closing tag (a stop string, a token limit): accepted, like vLLM's Hermes parser.
    action, notes = parse_tool_call_with_notes('<tool_call>\n{"name": "finish", "arguments": {}}\n')
    assert action.tool == "finish" and notes == ["missing </tool_call>"]
    # Several calls: the first is executed.
    two = call("run_command", {"cmd": "ls"}) + "\n" + call("finish", {})
    action, notes = parse_tool_call_with_notes(two)
    assert (action.tool, action.arguments) == ("run_command", {"cmd": "ls"})
    assert notes == ["2 tool calls in one turn; only the first is used"]
    action, notes = parse_tool_call_with_notes(call("finish", {}) + " trailing words")
    assert action.tool == "finish" and notes == ["text after </tool_call> ignored"]
    # Omitted arguments mean {}; text after the end-of-turn token is not output.
    action, notes = parse_tool_call_with_notes(
        '<tool_call>{"name": "finish"}</tool_call><|im_end|>junk'
    )
    assert (action.tool, action.arguments, notes) == ("finish", {}, [])


def test_parser_fuzz_never_raises():
    """Truncations, splices and random bytes of valid calls: always an Action, never an exception."""
    rng = random.Random(0)
    pieces = [call(n, a) for n, a in VALID_CALLS] + ["<tool_call>", "</tool_call>", "{", "}", '"']
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))
        text = text[: rng.randint(0, len(text))]
        if rng.random() < 0.3:
            i = rng.randint(0, len(text))
            text = text[:i] + "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(3)) + text[i:]
        action = parse_tool_call(text)
        assert (action.tool is None) == (action.parse_error is not None)


def test_render_messages_maps_every_event_kind(events):
    messages = render_messages(events)
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * 5
    assert messages[0]["content"] == system_prompt(compact=True)
    first = messages[2]
    assert first["content"] == "Run the tests first."
    assert first["tool_calls"][0]["function"] == {"name": "run_command",
                                                  "arguments": {"cmd": "python -m pytest -q"}}  # fmt: skip
    failed = messages[6]  # action None: the raw text, no tool call
    assert "tool_calls" not in failed and failed["content"] == events[5]["content"]
    assert messages[3] == {"role": "tool", "content": events[2]["observation"]}
    with pytest.raises(ValueError, match="unknown role"):
        render_messages([{"role": "critic", "content": "x"}])


@pytest.mark.parametrize("tool_set", list(TOOL_SETS))
def test_system_prompts_list_exactly_the_tool_sets_tools(tool_set):
    compact = system_prompt(compact=True, tool_set=tool_set)
    full = system_prompt(compact=False, tool_set=tool_set)
    for name in TOOL_SPECS:
        listed = name in TOOL_SETS[tool_set].tools
        assert (f"{name}(" in compact) == listed and (f'"name": "{name}"' in full) == listed
    assert len(compact) < len(full) / 3
    assert "read_file(path, start_line?, end_line?)" in system_prompt()  # default: free_form


@pytest.mark.parametrize("compact", [True, False])
def test_jinja_template_equals_python_rendering(tokenizer, events, compact):
    messages = render_messages(events, compact)
    assert tokenizer.apply_chat_template(messages, tokenize=False) == render_text(messages)
    prompt = render_prompt(tokenizer, events, compact)
    assert prompt == render_text(messages, add_generation_prompt=True)
    assert prompt.endswith(f"{IM_END}\n{ASSISTANT_HEADER}")


def test_prompt_ids_match_tokenizing_the_prompt_text(tokenizer, events):
    ids = prompt_ids(tokenizer, events)
    assert ids == tokenizer(render_prompt(tokenizer, events), add_special_tokens=False)["input_ids"]
    header = tokenizer(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    assert ids[-len(header) :] == header


def test_assistant_mask_is_exact(tokenizer, events):
    """Masked spans decode to exactly the assistant bodies + <|im_end|>, in order; nothing else."""
    out = tokenize_trajectory(tokenizer, events)
    ids, mask = out["input_ids"], out["assistant_mask"]
    assert len(ids) == len(mask) and not out["truncated"]
    assert tokenizer.decode(ids) == render_text(render_messages(events))
    spans, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    assert not current  # a turn never ends the transcript: its "\n" follows
    expected = [
        assistant_body(m) + IM_END for m in render_messages(events) if m["role"] == "assistant"
    ]
    assert [tokenizer.decode(s) for s in spans] == expected
    # The unmasked tokens are the rest: system, user, tool turns, role headers, separators.
    rest = [t for t, m in zip(ids, mask, strict=True) if not m]
    assert tokenizer.decode(rest).count(ASSISTANT_HEADER) == len(expected)


def test_assistant_turn_tokens_are_the_masked_spans(tokenizer, events):
    """The turn budget's measure: one count per assistant turn, each the length of its
    masked span (the body and <|im_end|> as generated)."""
    out = tokenize_trajectory(tokenizer, events)
    spans, length = [], 0
    for m in [*out["assistant_mask"], 0]:
        if m:
            length += 1
        elif length:
            spans.append(length)
            length = 0
    turns = assistant_turn_tokens(tokenizer, events)
    assert turns == spans and len(turns) == sum(e["role"] == "assistant" for e in events)
    assert assistant_turn_tokens(tokenizer, events[:1]) == []


def test_turn_marked_not_for_training_is_context_only(tokenizer, events):
    """An assistant event with "train": false keeps its tokens but leaves the mask."""
    full = tokenize_trajectory(tokenizer, events)
    first = next(i for i, e in enumerate(events) if e["role"] == "assistant")
    marked = [dict(e) for e in events]
    marked[first]["train"] = False
    out = tokenize_trajectory(tokenizer, marked)
    assert out["input_ids"] == full["input_ids"]
    body = assistant_body(render_messages(events)[first + 1]) + IM_END  # +1: system prompt
    n = len(tokenizer(body, add_special_tokens=False)["input_ids"])
    assert sum(full["assistant_mask"]) - sum(out["assistant_mask"]) == n
    changed = [
        i
        for i, (a, b) in enumerate(zip(full["assistant_mask"], out["assistant_mask"], strict=True))
        if a != b
    ]
    assert tokenizer.decode([full["input_ids"][i] for i in changed]) == body


def test_segments_tokenize_like_generation(tokenizer, events):
    """The first assistant turn's tokens are the prompt ids followed by the body's own ids."""
    full = tokenize_trajectory(tokenizer, events)["input_ids"]
    prefix = prompt_ids(tokenizer, events[:1])
    body = render_messages(events[:2])[-1]
    generated = tokenizer(assistant_body(body) + IM_END, add_special_tokens=False)["input_ids"]
    assert full[: len(prefix) + len(generated)] == prefix + generated


def test_truncation(tokenizer, events):
    out = tokenize_trajectory(tokenizer, events, max_tokens=20)
    assert len(out["input_ids"]) == len(out["assistant_mask"]) == 20 and out["truncated"]
    assert sum(out["assistant_mask"]) == 0  # 20 tokens is still the system prompt


def test_segments_concatenate_to_the_transcript(events):
    messages = render_messages(events)
    segments = chat_segments(messages)
    assert "".join(t for t, _ in segments) == render_text(messages)
    assert [t for t, gen in segments if gen][0] == "Run the tests first.\n" + format_tool_call(
        "run_command", {"cmd": "python -m pytest -q"}
    ) + IM_END


def test_chat_module_does_not_import_torch():
    code = "import sys, components.policy.chat; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
