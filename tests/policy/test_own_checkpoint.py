"""Bring your own checkpoint: a local causal LM keeps its own tokenizer and, when its template
renders tools, its own chat format: transcripts, the assistant mask, a rollout's environment
turns and the tool-call parser follow it. The checkpoint is a tiny random-init Llama with a
Llama-3-style template written here (tests/policy/own_checkpoint.py)."""

from __future__ import annotations

import json

import pytest

from components.policy.chat import (
    CHAT_TEMPLATE,
    OURS,
    chat_format,
    format_tool_call,
    parse_tool_call,
    prompt_ids,
    render_messages,
    template_tools,
    tokenize_trajectory,
    trajectory_segments,
)
from components.policy.config import PolicyConfig
from components.policy.model import build_policy
from components.policy.template_format import TOOLS
from tests.policy.conftest import SAMPLE_EVENTS
from tests.policy.own_checkpoint import (
    CHATML_NO_TOOLS_TEMPLATE,
    CHATML_SPECIALS,
    LLAMA3_STYLE_TEMPLATE,
    PLAIN_TEMPLATE,
    save_llama3_style_checkpoint,
)

CORPUS = [json.dumps(e) for e in SAMPLE_EVENTS] + [json.dumps(t) for t in TOOLS]


@pytest.fixture(scope="module")
def own_dir(tmp_path_factory):
    return save_llama3_style_checkpoint(tmp_path_factory.mktemp("llama3ish"), CORPUS)


@pytest.fixture(scope="module")
def own(own_dir):
    return build_policy(PolicyConfig(pretrained_path=str(own_dir)))


def _call(name: str, arguments: dict) -> str:
    """The template's call syntax, written out by hand (not by the code under test)."""
    payload = json.dumps(arguments, ensure_ascii=False)
    return f'<|python_tag|>{{"name": "{name}", "parameters": {payload}}}'


def test_the_checkpoint_keeps_its_tokenizer_and_template(own):
    model, tokenizer = own
    assert tokenizer.chat_template == LLAMA3_STYLE_TEMPLATE
    vocab = tokenizer.get_vocab()
    assert not {"<|im_start|>", "<|im_end|>", "<tool_call>"} & set(vocab)
    assert len(vocab) == model.get_input_embeddings().weight.shape[0]  # nothing added
    fmt = chat_format(tokenizer)
    assert (fmt.end_of_turn, fmt.call_open, fmt.call_close) == ("<|eot_id|>", "<|python_tag|>", "")
    assert (fmt.name_key, fmt.arguments_key) == ("name", "parameters")
    assert fmt.assistant_header == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert fmt.tool_turn == ("<|start_header_id|>ipython<|end_header_id|>\n\n", "<|eot_id|>")
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert model.generation_config.eos_token_id == eot and tokenizer.pad_token is not None


def test_segments_are_the_templates_own_rendering(own, events):
    _, tokenizer = own
    fmt = chat_format(tokenizer)
    for tool_set in ("free_form", "fix_search"):
        marked = [{**events[0], "tool_set": tool_set}, *events[1:]]
        tools = template_tools(tool_set)
        expected = tokenizer.apply_chat_template(render_messages(marked, fmt=fmt), tools=tools,
                                                 tokenize=False)  # fmt: skip
        segments = trajectory_segments(tokenizer, marked)
        text = "".join(piece for piece, _ in segments)
        assert text == expected
        assert "<|im_start|>" not in text and "<tool_response>" not in text
        # The template lists the episode's tools, and only those, in the prompt.
        prompt = segments[0][0]
        assert '"name": "run_command"' in prompt
        assert ('"name": "list_fixes"' in prompt) == (tool_set == "fix_search")
        assert ('"name": "edit_file"' in prompt) == (tool_set == "free_form")


def test_the_assistant_mask_is_exact(own, events):
    """Every maximal run of mask 1 decodes to one assistant turn as the template writes it,
    up to and including <|eot_id|>; every other token is context."""
    _, tokenizer = own
    out = tokenize_trajectory(tokenizer, events)
    ids, mask = out["input_ids"], out["assistant_mask"]
    runs, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    runs += [current] if current else []
    expected = []
    for e in (e for e in events if e["role"] == "assistant"):
        content = e.get("content") or ""
        call = _call(e["action"], e["arguments"]) if e["action"] else ""
        expected.append(content + call + "<|eot_id|>")
    assert [tokenizer.decode(r, skip_special_tokens=False) for r in runs] == expected
    assert tokenizer.decode(ids, skip_special_tokens=False) == "".join(
        piece for piece, _ in trajectory_segments(tokenizer, events)
    )
    # The generation prompt is the transcript's beginning, up to the first assistant turn.
    prompt = prompt_ids(tokenizer, events[:1])
    assert ids[: len(prompt)] == prompt and mask[len(prompt)] == 1 and not any(mask[: len(prompt)])


def test_the_parser_reads_the_templates_calls(own):
    _, tokenizer = own
    fmt = chat_format(tokenizer)
    text = (
        'Look first.<|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}<|eot_id|>'
    )
    action = parse_tool_call(text, fmt)
    assert (action.tool, action.arguments, action.content) == ("read_file", {"path": "a.py"},
                                                               "Look first.")  # fmt: skip
    bare = parse_tool_call('{"name": "finish", "parameters": {"summary": "done"}}', fmt)
    assert bare.tool is None  # the template's calls open with <|python_tag|>
    assert parse_tool_call(format_tool_call("finish", {"summary": "x"}), fmt).tool is None
    unknown = parse_tool_call('<|python_tag|>{"name": "rm", "parameters": {}}', fmt)
    assert unknown.tool is None and "rm" in unknown.parse_error
    # Ours is unchanged for our format.
    assert parse_tool_call(format_tool_call("finish", {"summary": "x"})).tool == "finish"


def test_a_rollout_follows_the_template(own, tmp_path):
    """Episodes sampled with the checkpoint: the engine's token sequence (prompt, sampled
    turns, environment turns) is exactly the transcript's tokenization in the template's
    format, and the sampled calls were parsed with its syntax."""
    from components.env.config import EnvConfig
    from components.rollout.completion import Completion
    from components.rollout.config import RolloutConfig
    from components.rollout.engine import sample_episodes
    from components.sandbox.config import SandboxConfig
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks
    from components.train.data import trajectory_tokens

    model, tokenizer = own
    generate_suite(tmp_path / "tasks", 3, 0)
    tasks = load_tasks(tmp_path / "tasks", split="train")[0][:1]
    turns = iter([_call("run_command", {"cmd": "python -m pytest -q"}) + "<|eot_id|>",
                  "Done." + _call("finish", {"summary": "gave up"}) + "<|eot_id|>"])  # fmt: skip

    def generate(prompts, caps, seed, **_):
        ids = tokenizer(next(turns), add_special_tokens=False)["input_ids"]
        return [Completion(ids, [-1.0] * len(ids), "stop") for _ in prompts]

    config = RolloutConfig(samples_per_task=1, batch_size=1, workers=1, max_new_tokens=256)
    (rollout,) = sample_episodes(tasks, model, tokenizer, config, EnvConfig(max_steps=4),
                                 SandboxConfig(), generate_fn=generate)  # fmt: skip
    record = rollout.result.record
    assert rollout.result.end_reason == "finished"
    assert [e.get("action") for e in record["trajectory"] if e["role"] == "assistant"] == [
        "run_command", "finish"]  # fmt: skip
    tokens = trajectory_tokens(tokenizer, {**record, "input_ids": None})
    n = len(rollout.input_ids)  # the record goes on with the final observation, as context
    assert tokens["input_ids"][:n] == rollout.input_ids
    assert tokens["assistant_mask"][:n] == rollout.assistant_mask
    assert not any(tokens["assistant_mask"][n:])


def test_a_template_without_usable_turns_is_refused_unless_the_preset_asks(tmp_path):
    """No end-of-turn token in the template: only our format fits, which needs new tokens;
    they are added (embeddings grow) only when `add_chat_tokens` says so."""
    from components.policy.model import load_policy

    directory = save_llama3_style_checkpoint(tmp_path / "plain", CORPUS, PLAIN_TEMPLATE)
    with pytest.raises(ValueError, match="add_chat_tokens"):
        load_policy(directory)
    config = PolicyConfig(pretrained_path=str(directory), add_chat_tokens=True)
    model, tokenizer = build_policy(config)
    assert tokenizer.chat_template == CHAT_TEMPLATE and chat_format(tokenizer) is OURS
    assert "<|im_start|>" in tokenizer.get_vocab()
    assert len(tokenizer) == model.get_input_embeddings().weight.shape[0] > 400


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory):
    """SmolLM2-Instruct's shape: its ChatML template (no tools), no tool tags in the vocab."""
    return save_llama3_style_checkpoint(tmp_path_factory.mktemp("chatml"), CORPUS,
                                        CHATML_NO_TOOLS_TEMPLATE, CHATML_SPECIALS)  # fmt: skip


def test_a_template_without_tools_keeps_its_vocabulary_and_writes_calls_as_text(chatml_dir):
    from safetensors import safe_open

    with safe_open(str(chatml_dir / "model.safetensors"), framework="pt") as f:
        saved_rows = f.get_tensor("model.embed_tokens.weight").shape[0]
    model, tokenizer = build_policy(PolicyConfig(pretrained_path=str(chatml_dir)))
    assert tokenizer.chat_template == CHATML_NO_TOOLS_TEMPLATE
    assert len(tokenizer) == saved_rows == model.get_input_embeddings().weight.shape[0]
    assert "<tool_call>" not in tokenizer.get_vocab()
    fmt = chat_format(tokenizer)
    assert fmt.text_tools and fmt.template == CHATML_NO_TOOLS_TEMPLATE
    assert (fmt.end_of_turn, fmt.assistant_header) == ("<|im_end|>", "<|im_start|>assistant\n")
    assert fmt.tool_turn == (
        "<|im_start|>user\n<tool_response>\n",
        "\n</tool_response><|im_end|>\n",
    )
    assert len(tokenizer("<tool_call>", add_special_tokens=False)["input_ids"]) > 1
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == eos


def test_text_tools_transcripts_are_the_templates_rendering(chatml_dir, events):
    """The segments add up to the template's own rendering of the plain-text messages; the
    system prompt lists the set's tools, one demonstrated call follows as context; the mask
    covers exactly the episode's assistant turns, calls written as text."""
    model, tokenizer = build_policy(PolicyConfig(pretrained_path=str(chatml_dir)))
    fmt = chat_format(tokenizer)
    for tool_set, demo in (("free_form", "run_command"), ("fix_search", "list_fixes")):
        marked = [{**events[0], "tool_set": tool_set}, *events[1:]]
        messages = render_messages(marked, fmt=fmt)
        assert all("tool_calls" not in m and m["role"] != "tool" for m in messages)
        expected = tokenizer.apply_chat_template(messages, tokenize=False)
        assert "".join(piece for piece, _ in trajectory_segments(tokenizer, marked)) == expected
        system, request, shown = messages[0]["content"], messages[1], messages[2]
        assert ("edit_file" in system) == (tool_set == "free_form")
        assert request["role"] == "user" and shown["demo"]
        assert shown["content"].startswith(f'<tool_call>\n{{"name": "{demo}", "arguments": ')
    out = tokenize_trajectory(tokenizer, events)
    text = tokenizer.decode([t for t, m in zip(out["input_ids"], out["assistant_mask"],
                                               strict=True) if m], skip_special_tokens=False)  # fmt: skip
    assert text.count("<|im_end|>") == sum(e["role"] == "assistant" for e in events)
    assert (
        '<tool_call>\n{"name": "run_command", "arguments": {"cmd": "python -m pytest -q"}}' in text
    )
    assert "<tool_response>" not in text  # observations are context
    prompt = prompt_ids(tokenizer, events[:1])
    assert out["input_ids"][: len(prompt)] == prompt
    assert not any(out["assistant_mask"][: len(prompt)])  # the demonstration is context
    demo = format_tool_call("run_command", {"cmd": "python -m pytest -q"})
    assert f"assistant\n{demo}<|im_end|>" in tokenizer.decode(prompt)


def test_sft_on_the_checkpoint_saves_its_own_format(own_dir, events, tmp_path):
    from components.policy.model import load_policy
    from components.train.config import SFTConfig
    from components.train.sft import train_sft

    model, tokenizer = load_policy(own_dir)
    config = SFTConfig(max_steps=2, batch_size=1, max_seq_len=2048, use_cpu=True,
                       output_dir=str(tmp_path / "sft"))  # fmt: skip
    result = train_sft(model, tokenizer, [{"id": "a", "trajectory": events}], config)
    assert result.steps == 2 and all(x == x for x in result.losses)
    _, reloaded = load_policy(result.checkpoint_dir)
    assert reloaded.chat_template == LLAMA3_STYLE_TEMPLATE


def test_the_text_tools_parser_is_lenient_on_form_and_strict_on_what_counts(chatml_dir):
    """A model that never saw the tags as tokens writes bare or fenced JSON: one call. What
    cannot count: a call inside an observation the model wrote itself (it imagines the
    environment), a second call after the first (one action per turn), junk inside the
    tags, a tool outside the set's registry or bad arguments."""
    from components.policy.chat import parse_tool_call_with_notes
    from components.policy.tokenizer import load_tokenizer

    fmt = chat_format(load_tokenizer(chatml_dir))
    run = {"cmd": "python -m pytest -q"}
    tagged = parse_tool_call(format_tool_call("run_command", run) + "<|im_end|>", fmt)
    assert (tagged.tool, tagged.arguments) == ("run_command", run)
    fenced, notes = parse_tool_call_with_notes(
        'I will run the tests.\n```json\n{"name": "run_command", "arguments": '
        '{"cmd": "python -m pytest -q"}}\n```', fmt)  # fmt: skip
    assert (fenced.tool, fenced.arguments, fenced.content) == ("run_command", run,
                                                               "I will run the tests.")  # fmt: skip
    assert any("bare JSON" in n for n in notes)
    bare = parse_tool_call('{"name": "finish", "arguments": {"summary": "done"}}', fmt)
    assert bare.tool == "finish"
    # Ours stays strict: the tiny policy learned the tags.
    assert parse_tool_call('{"name": "finish", "arguments": {}}').tool is None
    # A hallucinated observation that "contains" the model's call: not an action.
    echo = ('<tool_response>\nall tests passed\n</tool_response>\n'
            + format_tool_call("finish", {"summary": "done"}))  # fmt: skip
    assert parse_tool_call(echo, fmt).tool is None
    assert parse_tool_call(echo.replace("<tool_call>\n", "").replace("\n</tool_call>", ""),
                           fmt).tool is None  # fmt: skip
    # A real call, then an echo and more calls: the first call, once.
    twice, notes = parse_tool_call_with_notes(
        format_tool_call("run_command", run) + "\n<tool_response>\nok\n</tool_response>\n"
        + format_tool_call("finish", {}) + '\n{"name": "finish", "arguments": {}}', fmt)  # fmt: skip
    assert (twice.tool, twice.arguments) == ("run_command", run)
    assert any("tool calls in one turn" in n for n in notes)
    junk = parse_tool_call(
        '<tool_call>\n{"name": "finish", "arguments": {}} rm -rf /\n</tool_call>', fmt
    )
    assert junk.tool is None and "unexpected text" in junk.parse_error
    assert parse_tool_call('{"name": "rm", "arguments": {}}', fmt).tool is None
    bad = parse_tool_call('```json\n{"name": "run_command", "arguments": {"cmd": 3}}\n```', fmt)
    assert bad.tool is None and bad.parse_error
    assert parse_tool_call("The capital of France is Paris.", fmt).tool is None


def test_a_lora_run_on_a_template_without_tools_never_resizes_the_embeddings(
    chatml_dir, events, tmp_path
):  # fmt: skip
    """The pretrained product path (configs/cpu-pretrained.yaml): LoRA SFT on a checkpoint
    whose template renders no tools saves adapters on the checkpoint as it is (no copy of a
    grown base in `base/`, its sha256 in the metadata), and loading them back, as GRPO,
    evaluation and vLLM's base do, keeps its vocabulary: no embedding row is added."""
    from safetensors import safe_open

    from components.lineage import weights_sha256
    from components.policy.config import LoRAConfig
    from components.policy.lora import ADAPTER_META
    from components.policy.model import load_policy
    from components.train.config import SFTConfig
    from components.train.sft import train_sft

    with safe_open(str(chatml_dir / "model.safetensors"), framework="pt") as f:
        saved_rows = f.get_tensor("model.embed_tokens.weight").shape[0]
    model, tokenizer = build_policy(PolicyConfig(pretrained_path=str(chatml_dir)))
    config = SFTConfig(max_steps=1, batch_size=1, max_seq_len=2048, use_cpu=True,
                       lora=LoRAConfig(r=4, alpha=8), output_dir=str(tmp_path / "sft"))  # fmt: skip
    result = train_sft(model, tokenizer, [{"id": "a", "trajectory": events}], config)
    policy_dir = tmp_path.joinpath(result.checkpoint_dir)
    meta = json.loads((policy_dir / ADAPTER_META).read_text())
    assert meta["base_path"] != "base" and not (policy_dir / "base").exists()
    assert meta["base_sha256"] == weights_sha256(chatml_dir)
    reloaded, reloaded_tokenizer = load_policy(policy_dir)
    assert reloaded.get_input_embeddings().weight.shape[0] == saved_rows == len(reloaded_tokenizer)
