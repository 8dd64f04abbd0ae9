"""bench/learning.py's training: the run's preset (its budgets from the bench's flags),
the expert's transcripts, then each method's stages through the `agentrl` stage functions
called in-process (policy init, train sft, rollout sample, train rs / dpo / grpo, and GRPO
sampling on `agentrl serve`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from components.evaluate.episodes import run_policy
from components.preset import load_preset
from components.tasks.task import load_tasks

# GRPO sampling on `agentrl serve` (issue 20), synchronous and asynchronous at staleness 1,
# the same settings otherwise: the server does not apply the try_fix constraint, so these
# two are compared with each other (both unconstrained in training, constrained in eval).
SERVED_GRPO = {
    "sft+grpo-served": {"async_rollouts": False},
    "sft+grpo-async": {"async_rollouts": True, "max_staleness": 1},
}
SAMPLE_NOTES = ("episodes", "success_rate", "invalid_calls", "generated_tokens", "end_reasons")
GRPO_NOTES = (
    *("success_rate", "mean_reward", "reward/wasted_fix_try", "kl", "generated_tokens"),
    *("sample_seconds", "update_seconds"),
)
SERVED_NOTES = ("success_rate", "mean_reward", "policy_lag")
SERVED_NOTES += ("sample_seconds", "update_seconds", "iteration_seconds")


def write_preset(args: argparse.Namespace, path: Path) -> Path:
    """The base preset with this run's budgets: every stage, and this bench's evaluations,
    read their settings from it (the flags above only fill it in)."""
    data = yaml.safe_load(Path(args.preset).read_text())
    data["name"] = f"bench-learning-{path.parent.name}"
    data["sft"] = {
        **data.get("sft", {}),
        "max_steps": args.sft_steps,
        "seed": args.seed,
        "bf16": args.bf16,
    }
    data["policy"] = {
        **data.get("policy", {}),
        "hidden_size": args.hidden_size,
        "num_layers": args.layers,
        "intermediate_size": args.hidden_size * 11 // 4,
    }
    # Scripted searches and models get the same episode budget (list + max_steps - 1 tries).
    # The models and the fix searches act through the fix_search tool set (the CPU demo's).
    data["env"] = {**data.get("env", {}), "max_steps": args.max_steps, "tool_set": "fix_search"}
    data["rollout"] = {
        **data.get("rollout", {}),
        "max_new_tokens": args.max_new_tokens,
        "max_episode_tokens": args.max_episode_tokens,
        "temperature": args.grpo_temperature,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "seed": args.seed,
        "samples_per_task": args.sample_k,
        "constrain_fix_ids": args.constrain_fix_ids,
    }
    rs = data.get("rejection_sampling", {})
    data["rejection_sampling"] = {
        **rs,
        "max_per_task": args.rs_max_per_task,
        "prefer_fewest_steps": True,
        "sft": {**rs.get("sft", {}), "max_steps": args.rs_steps, "seed": args.seed},
    }
    data["dpo"] = {**data.get("dpo", {}), "max_steps": args.dpo_steps, "seed": args.seed}
    data["grpo"] = {
        **data.get("grpo", {}),
        "iterations": args.grpo_iterations,
        "tasks_per_iteration": args.grpo_tasks,
        "group_size": args.grpo_group,
        "learning_rate": args.grpo_lr,
        "beta": args.grpo_beta,
        "seed": args.seed,
        "ppo_epochs": args.grpo_ppo_epochs,
        "minibatch_size": args.grpo_minibatch,
        "turn_credit": args.grpo_turn_credit,
        "top_entropy_quantile": args.grpo_top_entropy,
    }
    data["evaluate"] = {
        **data.get("evaluate", {}),
        "workers": args.workers,
        "seed": args.seed,
        "rollout": {"temperature": 0.0},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sections(preset: Path):
    """(env, sandbox, rollout as trained, evaluation) of the run's preset."""
    p = load_preset(preset)
    return p.section("env"), p.section("sandbox"), p.section("rollout"), p.section("evaluate")


def _stage(fn, argv: list[str], out: Path) -> dict:
    """Run one `agentrl` stage function; return its result.json."""
    code = fn([str(a) for a in argv])
    if code not in (0, None):
        raise RuntimeError(f"stage {fn.__name__} {argv} exited {code}")
    return json.loads((out / "result.json").read_text())


def expert_transcripts(args, work: Path, preset: Path, clock) -> tuple[Path, dict]:
    """The expert policy's episodes on the train split (the first `--expert-limit`), the
    kept ones written as SFT records; (records file, notes)."""
    train, _ = load_tasks(work / "tasks", split="train")
    expert = train[: args.expert_limit] if args.expert_limit else train
    # Fix searches run under the model's episode budget (the preset's env.max_steps), so
    # SFT never sees a turn the model will not have.
    env, sandbox, rollout, _ = sections(preset)
    results = clock.run(
        "expert",
        run_policy,
        expert,
        args.expert_policy,
        rollout=rollout,
        env=env,
        sandbox=sandbox,
        workers=args.workers,
        seed=args.seed,
        statistics=args.statistics,
    )
    records = work / "expert.jsonl"
    keep = [r for r in results if r.status == "ok" and (args.expert_episodes == "all" or r.success)]
    records.write_text("".join(json.dumps(r.record) + "\n" for r in keep))
    notes = {
        "expert_episodes": len(results),
        "expert_kept": len(keep),
        "expert_successes": sum(r.success for r in results),
    }
    return records, notes


def train_all(args, work: Path, preset: Path, clock) -> tuple[dict[str, str], dict]:
    """Policy folder per method (None where the method could not train) + stage notes."""
    from components.policy.__main__ import main_init as main_policy_init
    from components.train.__main__ import main_sft

    records, notes = expert_transcripts(args, work, preset, clock)
    p = ["--preset", preset]
    argv = [*p, "--records", records, "--out", work / "init"]
    init = clock.run("init", _stage, main_policy_init, argv, work / "init")
    policies = {"untrained": init["policy_dir"]}
    notes["parameters"], notes["vocab_size"] = init["parameters"], init["vocab_size"]
    wanted = set(args.methods.split(","))
    if not wanted - {"untrained"}:
        return policies, notes
    argv = [*p, "--policy", init["policy_dir"], "--records", records, "--out", work / "sft"]
    sft = clock.run("sft", _stage, main_sft, argv, work / "sft")
    policies["sft"] = sft["policy_dir"]
    notes["sft"] = {k: sft[k] for k in ("steps", "tokens", "train_seconds", "num_examples")}
    notes["sft"]["final_loss"] = sft["losses"][-1] if sft["losses"] else None
    more_policies, more_notes = train_from_sft(args, work, p, sft["policy_dir"], wanted, clock)
    policies.update(more_policies)
    notes.update(more_notes)
    for method in SERVED_GRPO:
        if method in wanted:
            policies[method], notes[method] = clock.run(
                method.removeprefix("sft+"), served_grpo, work, preset, sft["policy_dir"], method
            )
    return policies, notes


def train_from_sft(args, work: Path, p: list, sft_policy: str, wanted: set, clock):
    """The in-process methods that continue from the SFT policy: RS and DPO on the shared
    samples, GRPO; (policy folder per method, notes per stage)."""
    from components.rollout.__main__ import main_sample
    from components.train.__main__ import main_dpo, main_grpo, main_rejection_sampling

    policies, notes = {}, {}
    from_sft = [*p, "--policy", sft_policy]
    on_train = ["--tasks", work / "tasks", "--split", "train"]
    samples = ["--samples", work / "samples"]
    if {"sft+rs", "sft+dpo"} & wanted:
        argv = [*from_sft, *on_train, "--limit", args.sample_tasks, "--out", work / "samples"]
        sample = clock.run("sample", _stage, main_sample, argv, work / "samples")
        notes["sample"] = {k: sample[k] for k in SAMPLE_NOTES}
    if "sft+rs" in wanted:
        argv = [*from_sft, *samples, "--out", work / "rs"]
        rs = clock.run("rs", _stage, main_rejection_sampling, argv, work / "rs")
        notes["rs"] = {k: rs[k] for k in ("kept", "sampled", "tasks_with_success")}
        # No verified success among the samples: nothing to fine-tune on, RS = SFT.
        policies["sft+rs"] = (rs["sft"] or {}).get("checkpoint_dir") or sft_policy
    if "sft+dpo" in wanted:
        argv = [*from_sft, *samples, "--out", work / "dpo"]
        dpo = clock.run("dpo", _stage, main_dpo, argv, work / "dpo")
        notes["dpo"] = {k: dpo.get(k) for k in ("num_pairs", "skipped", "steps")}
        policies["sft+dpo"] = dpo.get("checkpoint_dir") or dpo.get("policy_dir")
    if "sft+grpo" in wanted:
        argv = [*from_sft, *on_train, "--out", work / "grpo", "--no-resume"]
        grpo = clock.run("grpo", _stage, main_grpo, argv, work / "grpo")
        policies["sft+grpo"] = grpo["policy_dir"]
        curves = grpo.get("curves", {})
        notes["grpo"] = {k: curves.get(k) for k in GRPO_NOTES}
    return policies, notes


def served_grpo(work: Path, preset: Path, sft_policy: str, method: str) -> tuple[str, dict]:
    """GRPO from the SFT policy sampling on `agentrl serve` (loopback, its own process, as
    bench/async_rl.py starts it), synced after every update; (policy folder, curves)."""
    from bench.async_rl import start_server
    from components.train.__main__ import main_grpo

    out = work / method.replace("+", "-")
    data = yaml.safe_load(preset.read_text())
    proc, url = start_server(Path(sft_policy), threads=1)
    try:
        backend = {"backend": "openai", "base_url": url, "constrain_fix_ids": False}
        data["rollout"] = {**data["rollout"], **backend}
        data["grpo"] = {**data["grpo"], **SERVED_GRPO[method]}
        served = work / f"preset-{method.replace('+', '-')}.yaml"
        served.write_text(yaml.safe_dump(data, sort_keys=False))
        argv = ["--preset", served, "--policy", sft_policy, "--tasks", work / "tasks"]
        argv += ["--split", "train", "--out", out, "--no-resume"]
        result = _stage(main_grpo, argv, out)
    finally:
        proc.terminate()
        proc.wait(30)
    curves = result.get("curves", {})
    return result["policy_dir"], {k: curves.get(k) for k in SERVED_NOTES}
