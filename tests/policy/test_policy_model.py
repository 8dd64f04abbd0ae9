"""Policy config, tiny model build, generation, save/load, foreign checkpoints.

(Named test_policy_model.py, not test_model.py: test folders have no __init__.py, so
basenames must be unique across tests/.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from components.policy.chat import IM_END, prompt_ids
from components.policy.config import PolicyConfig
from components.policy.model import build_policy, ensure_chat_tokens, load_policy, save_policy
from components.typed_config import config_from_dict

torch.set_num_threads(2)


def tiny(tokenizer_dir, **overrides) -> PolicyConfig:
    values = dict(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
        max_position_embeddings=512, vocab_size=512, tokenizer_path=str(tokenizer_dir),
    )  # fmt: skip
    return PolicyConfig(**{**values, **overrides})


@pytest.mark.parametrize(
    "bad",
    [
        {"hidden_size": 0}, {"num_heads": 3}, {"num_kv_heads": 3}, {"hidden_size": 24, "num_heads": 8},
        {"vocab_size": 100}, {"architecture": "gpt2"}, {"dtype": "int8"},
        {"tokenizer_stdlib_bytes": -1}, {"max_position_embeddings": 8},
    ],
)  # fmt: skip
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        PolicyConfig(**bad)


def test_config_fields_have_help_and_dict_loading():
    for f in dataclasses.fields(PolicyConfig):
        assert f.metadata.get("help"), f.name
    assert config_from_dict(PolicyConfig, {"num_layers": 2}).num_layers == 2
    with pytest.raises(ValueError, match="unknown key"):
        config_from_dict(PolicyConfig, {"num_layers": 2, "n_layers": 2})


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_build_forward_and_generate(tokenizer_dir, events, architecture):
    model, tokenizer = build_policy(tiny(tokenizer_dir, architecture=architecture))
    assert (
        type(model).__name__
        == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[architecture]
    )
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.config.vocab_size == len(tokenizer) == 512
    ids = torch.tensor([prompt_ids(tokenizer, events[:1])])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], 512) and torch.isfinite(logits).all()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                         do_sample=False)  # fmt: skip
    assert out.shape[1] > ids.shape[1] and torch.equal(out[:, : ids.shape[1]], ids)
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)


def test_init_is_seeded_and_leaves_global_rng_alone(tokenizer_dir):
    state = torch.random.get_rng_state()
    a, _ = build_policy(tiny(tokenizer_dir, seed=5))
    assert torch.equal(torch.random.get_rng_state(), state)
    b, _ = build_policy(tiny(tokenizer_dir, seed=5))
    c, _ = build_policy(tiny(tokenizer_dir, seed=6))
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_save_load_round_trip(tokenizer_dir, events, tmp_path):
    model, tokenizer = build_policy(tiny(tokenizer_dir))
    save_policy(model, tokenizer, tmp_path / "policy")
    ids = torch.tensor([prompt_ids(tokenizer, events)])
    for loaded, loaded_tok in (
        load_policy(tmp_path / "policy"),
        build_policy(PolicyConfig(pretrained_path=str(tmp_path / "policy"))),
    ):
        assert loaded_tok.get_vocab() == tokenizer.get_vocab()
        assert prompt_ids(loaded_tok, events) == ids[0].tolist()
        with torch.no_grad():
            assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing")


def test_foreign_checkpoint_gets_the_chat_tokens(tmp_path):
    """A checkpoint whose tokenizer lacks the chat tokens and has no chat template: they are
    added and the embeddings grow, when asked (policy.add_chat_tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    foreign_tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    foreign = LlamaForCausalLM(LlamaConfig(vocab_size=3, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2))  # fmt: skip
    save_policy(foreign, foreign_tok, tmp_path)
    with pytest.raises(ValueError, match="add_chat_tokens"):
        load_policy(tmp_path)  # new embedding rows only when the preset asks
    model, tokenizer = load_policy(tmp_path, add_chat_tokens=True)
    assert len(tokenizer) == 3 + 7
    assert model.get_input_embeddings().weight.shape[0] == 10
    (im_end,) = tokenizer(IM_END, add_special_tokens=False)["input_ids"]
    assert model.generation_config.eos_token_id == im_end and tokenizer.pad_token == "<|endoftext|>"
    ensure_chat_tokens(model, tokenizer)  # idempotent
    assert len(tokenizer) == 10
