"""The GPU check's legs; scripts/gpu_check.sh runs this with the machine's own python.

    python scripts/gpu_check.py --missing            modules the check needs that are absent
    python scripts/gpu_check.py --carry WHEELHOUSE   unpack pure-Python wheels of absent ones
    python scripts/gpu_check.py --out DIR [--cpu]    run the legs (--cpu: tiny, on the CPU)

Legs, each timed, its numbers printed and written to DIR/report.json:
1. environment: torch, CUDA device, bf16, which engines are installed;
2. data: a generated task suite and oracle transcripts (episodes run in the sandbox);
3. SFT, all weights, with configs/gpu-single.yaml's sft settings (bf16) on a small model
   (no download is possible: the policy is built here, tokenizer trained on the transcripts);
4. LoRA SFT, the same with the preset's adapters (skipped without peft);
5. sampling vs training log-probs: episodes sampled with the SFT policy, their sampled
   tokens scored again by the training forward; max / mean |difference| and the mean ratio;
6. one GRPO iteration (sample -> verify -> update) from the SFT policy, the preset's grpo
   settings (LoRA, KL to the base);
7. ZeRO-2 SFT through DeepSpeed (skipped without DeepSpeed), vLLM (skipped: not exercised).
Tokens/s and peak GPU memory (torch.cuda.max_memory_allocated, reset per leg) per leg.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import resource
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Modules the check cannot run without; pytest and pytest_timeout run the tasks' tests.
REQUIRED = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "yaml",
    "jinja2",
    "pytest",
    "pytest_timeout",
)
ENGINES = {"peft": "LoRA SFT", "deepspeed": "ZeRO-2 SFT", "vllm": "vLLM sampling"}
# Sizes: (policy, data, SFT steps, GRPO) per device kind.
# fmt: off
SIZES = {
    "cuda": {"policy": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                            intermediate_size=1408, vocab_size=4096,
                            tokenizer_stdlib_bytes=300_000),
             "tasks": 24, "transcripts": 16, "sft_steps": 40, "batch": 8, "groups": 4,
             "group_size": 4, "new_tokens": 96, "env_steps": 6},
    "cpu": {"policy": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                           intermediate_size=128, vocab_size=600, tokenizer_stdlib_bytes=20_000),
            "tasks": 6, "transcripts": 2, "sft_steps": 2, "batch": 2, "groups": 1,
            "group_size": 2, "new_tokens": 16, "env_steps": 2},
}
# fmt: on


def present(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing() -> list[str]:
    return [m for m in (*REQUIRED, *ENGINES) if not present(m)]


def carry(wheelhouse: Path, site: Path) -> list[str]:
    """Unpack into `site` each pure-Python wheel of `wheelhouse` whose top-level module is
    absent here; returns the wheels unpacked. Wheels with compiled code are refused."""
    done = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        if not wheel.name.endswith("-none-any.whl"):
            print(f"gpu_check: not carried (not pure Python): {wheel.name}")
            continue
        with zipfile.ZipFile(wheel) as archive:
            tops = {n.split("/")[0] for n in archive.namelist() if ".dist-info" not in n}
            modules = {t.removesuffix(".py") for t in tops}
            if all(present(m) for m in modules):
                continue
            archive.extractall(site)
        done.append(wheel.name)
    return done


def peak_memory_gib(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # peak RSS (Linux: KiB)


class Legs:
    """Runs the legs in order, timing each, printing a line per leg and collecting them."""

    def __init__(self, device: str, budget_s: float):
        self.device, self.budget_s, self.t0, self.report = device, budget_s, time.time(), {}

    def run(self, name: str, fn, *args):
        import torch

        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.time()
        out = fn(*args)
        numbers = out[1] if isinstance(out, tuple) else {}
        numbers = {
            **numbers,
            "seconds": round(time.time() - start, 1),
            "peak_memory_gib": round(peak_memory_gib(self.device), 3),
        }
        self.report[name] = numbers
        print(f"[{time.time() - self.t0:5.0f} s] {name}: {json.dumps(numbers)}", flush=True)
        if time.time() - self.t0 > self.budget_s:
            raise SystemExit(f"gpu_check: over the {self.budget_s:.0f} s budget after {name}")
        return out[0] if isinstance(out, tuple) else out

    def skip(self, name: str, reason: str) -> None:
        self.report[name] = {"skipped": reason}
        print(f"SKIP {name}: {reason}", flush=True)


def environment(device: str) -> tuple[None, dict]:
    import torch
    import transformers

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "bf16": bool(device == "cuda" and torch.cuda.is_bf16_supported()),
        "engines": {m: present(m) for m in ENGINES},
    }
    return None, info


def build_data(out: Path, size: dict) -> tuple[tuple, dict]:
    from components.env.batch_eval import EvalConfig, evaluate_policy
    from components.env.config import EnvConfig
    from components.sandbox.config import SandboxConfig
    from components.scripted.registry import make_policy
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    generate_suite(out / "tasks", size["tasks"], 0)
    train = load_tasks(out / "tasks", split="train")[0]
    results = evaluate_policy(
        train[: size["transcripts"]],
        lambda: make_policy("oracle-fixes"),
        EnvConfig(),
        SandboxConfig(),
        EvalConfig(workers=8),
    )
    records = [r.record for r in results]
    solved = sum(bool((r.get("metadata") or {}).get("success")) for r in records)
    return (train, records), {"tasks": len(train), "transcripts": len(records), "solved": solved}


def run_sft(preset, model_tokenizer, records, size: dict, out: Path, lora: bool):
    from components.train.sft import train_sft

    model, tokenizer = model_tokenizer
    config = dataclasses.replace(
        preset.section("sft"),
        max_steps=size["sft_steps"],
        batch_size=size["batch"],
        grad_accum=1,
        warmup_steps=0,
        max_seq_len=4096,
        bf16=size is SIZES["cuda"],
        output_dir=str(out),
        **({} if lora else {"lora": None}),
    )
    result = train_sft(model, tokenizer, records, config)
    return result, {
        "steps": result.steps,
        "tokens_per_s": round(result.tokens_per_second),
        "loss_first": round(result.losses[0], 4),
        "loss_last": round(result.losses[-1], 4),
        **result.metrics,
    }


def logprob_agreement(policy_dir: str, tasks, rollout, env) -> tuple[None, dict]:
    """Episodes sampled by the rollout engine, their stored sampling log-probs against the
    training forward's (grpo._policy_logps) on the same tokens."""
    import torch

    from components.policy.model import load_policy
    from components.rollout.engine import sample_episodes
    from components.sandbox.config import SandboxConfig
    from components.train.grpo.update import collate_rollouts
    from components.train.grpo.update import policy_logps as _policy_logps

    model, tokenizer = load_policy(policy_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    rollouts = sample_episodes(tasks, model, tokenizer, rollout, env, SandboxConfig())
    diffs = []
    with torch.no_grad():
        for r in rollouts:
            batch = collate_rollouts([r], tokenizer.pad_token_id)
            trained = _policy_logps(model, batch, device, rollout.temperature or 1.0)[0].cpu()
            mask = batch["assistant_mask"][0, 1:].bool()
            diffs.append((trained - batch["sampling_logprobs"][0, 1:])[mask])
    d = torch.cat(diffs)
    return None, {
        "tokens": d.numel(),
        "max_abs_diff": round(d.abs().max().item(), 5),
        "mean_abs_diff": round(d.abs().mean().item(), 6),
        "mean_ratio": round(d.exp().mean().item(), 6),
        "dtype": str(next(model.parameters()).dtype),
    }


def run_grpo(preset, policy_dir: str, tasks, rollout, env, size: dict, out: Path):
    from components.policy.model import load_policy
    from components.sandbox.config import SandboxConfig
    from components.train.grpo import train_grpo

    model, tokenizer = load_policy(policy_dir)
    config = dataclasses.replace(
        preset.section("grpo"),
        iterations=1,
        tasks_per_iteration=size["groups"],
        group_size=size["group_size"],
        output_dir=str(out),
    )
    result = train_grpo(
        model, tokenizer, tasks, config, rollout, env, SandboxConfig(), resume=False
    )
    row = result.metrics[0]
    keys = (
        "episodes",
        "infra_failures",
        "success_rate",
        "generated_tokens",
        "sample_tokens_per_s",
        "update_tokens",
        "tokens_per_s",
        "ratio",
        "kl",
        "loss",
    )
    return None, {
        k: round(row[k], 4) if isinstance(row.get(k), float) else row.get(k) for k in keys
    }


def zero2_sft(preset, policy_dir: str, records, size: dict, out: Path):
    """SFT through DeepSpeed ZeRO-2 in this process (world of one)."""
    from components.policy.model import load_policy
    from components.train.config import DeepSpeedConfig
    from components.train.sft import train_sft

    for key, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29555"),
    ):
        os.environ.setdefault(key, value)
    model, tokenizer = load_policy(policy_dir)
    config = dataclasses.replace(
        preset.section("sft"),
        max_steps=size["sft_steps"],
        batch_size=size["batch"],
        grad_accum=1,
        warmup_steps=0,
        max_seq_len=4096,
        lora=None,
        output_dir=str(out),
        deepspeed=DeepSpeedConfig(zero_stage=2),
    )
    result = train_sft(model, tokenizer, records, config)
    return None, {"steps": result.steps, "tokens_per_s": round(result.tokens_per_second)}


def _initial_policy(preset, records, size: dict, device: str, out: Path) -> str:
    """The check's starting policy (built here, saved): the preset's policy section with a
    small model instead of its pretrained_path."""
    from components.policy.model import build_policy, save_policy

    policy = dataclasses.replace(
        preset.section("policy"),
        pretrained_path="",
        max_position_embeddings=8192,
        dtype="bfloat16" if device == "cuda" else "float32",
        **size["policy"],
    )
    model, tokenizer = build_policy(policy, records)
    save_policy(model, tokenizer, out)
    params = sum(p.numel() for p in model.parameters())
    return str(out), {"parameters": params, "vocab": len(tokenizer), "dtype": policy.dtype}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--missing", action="store_true", help="print absent modules and exit")
    p.add_argument("--carry", type=Path, help="unpack absent pure-Python wheels from here")
    p.add_argument("--site", type=Path, help="where --carry unpacks (default: purelib)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    p.add_argument("--cpu", action="store_true", help="tiny legs on the CPU (no CUDA here)")
    p.add_argument("--budget-s", type=float, default=450.0, help="fail past this many seconds")
    p.add_argument("--preset", default=str(REPO / "configs" / "gpu-single.yaml"))
    args = p.parse_args(argv)
    if args.missing:
        print(" ".join(missing()))
        return 0
    if args.carry:
        import sysconfig

        site = args.site or Path(sysconfig.get_paths()["purelib"])
        print("\n".join(f"carried: {w}" for w in carry(args.carry, site)) or "carried: nothing")
        return 0
    absent = [m for m in REQUIRED if not present(m)]
    if absent:
        raise SystemExit(
            f"gpu_check: missing {absent}: put their pure-Python wheels in the "
            "wheelhouse (scripts/gpu_check.sh --wheelhouse DIR)"
        )
    return run_legs(args)


def run_legs(args) -> int:
    import torch

    from components.env.config import EnvConfig
    from components.preset import load_preset

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.cpu:
        raise SystemExit("gpu_check: torch sees no CUDA device (--cpu for a tiny CPU run)")
    size, out, preset = SIZES[device], args.out, load_preset(args.preset)
    legs = Legs(device, args.budget_s)
    legs.run("environment", environment, device)
    train, records = legs.run("data", build_data, out, size)
    start = legs.run("policy", _initial_policy, preset, records, size, device, out / "init")
    from components.policy.model import load_policy

    full = legs.run("sft", run_sft, preset, load_policy(start), records, size, out / "sft", False)
    if present("peft"):
        legs.run(
            "sft_lora", run_sft, preset, load_policy(start), records, size, out / "sft_lora", True
        )
    else:
        legs.skip("sft_lora", "peft is not installed (LoRA needs it)")
    env = EnvConfig(max_steps=size["env_steps"])
    rollout = dataclasses.replace(
        preset.section("rollout"),
        max_new_tokens=size["new_tokens"],
        samples_per_task=size["group_size"],
        batch_size=16,
    )
    picked = train[: size["groups"]]
    legs.run("logprob_agreement", logprob_agreement, full.checkpoint_dir, picked, rollout, env)
    legs.run(
        "grpo", run_grpo, preset, full.checkpoint_dir, picked, rollout, env, size, out / "grpo"
    )
    if present("deepspeed"):
        legs.run("zero2_sft", zero2_sft, preset, start, records, size, out / "zero2")
    else:
        legs.skip(
            "zero2_sft",
            "DeepSpeed is not installed (the ZeRO legs need it; "
            "tests/train/test_parallel.py runs them on CPU)",
        )
    legs.skip(
        "vllm",
        "not exercised by this check (vLLM installed: "
        f"{present('vllm')}; docs/scale-out.md says how to check serving)",
    )
    (out / "report.json").write_text(json.dumps(legs.report, indent=1) + "\n")
    print(f"gpu_check passed in {time.time() - legs.t0:.0f} s; report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
