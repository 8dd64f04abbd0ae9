"""Does training move task success? untrained vs SFT vs SFT+RS / DPO / GRPO, and scripted
no-learning policies, on the val split (unseen bugs of training families), the test
split (unseen families) and the quixbugs split (the converted QuixBugs programs the
repository holds, `--quixbugs`: real bugs, never trained on). The scripted ones: the issue's baseline (one random edit on the
blamed line), random-kinds (the listed kinds in a random order, each searched in listed
order: the default expert, all of whose episodes are the SFT data, so SFT learns the
procedure and the call format but not which kind to search first, which is left to RL;
kinds are drawn inversely to how often listings show them, so each is the first pick about
equally often), prior-fixes (candidate fixes in order of how often their kind was the fix
on the train split: what a learned ordering of kinds can reach), and on request
random-fixes and listing-order.

Everything runs through the pipeline's own code: the suite generator, the oracle for
expert trajectories, and the `agentrl` stage functions (policy init, train sft, rollout
sample, train rs / dpo / grpo) called in-process with a preset derived from
configs/cpu-demo.yaml whose budgets come from the flags below. One work folder per run.
Models decode try_fix ids under the listing's constraint (components/env/tool_sets/fix_search/constrain.py)
in sampling, GRPO and evaluation alike; `--no-constrain-fix-ids` measures them without.

Metrics per (method, split), over the first `--eval-limit` tasks of the split:
- pass@1: greedy episode succeeds (components/evaluate/episodes.run_policy, the one
  evaluation path: batched rollout engine, the preset's settings as trained);
- pass@k: any of k episodes sampled at temperature 1 succeeds;
- well-formed: share of assistant turns that parsed into a valid tool call
  (1 - invalid_calls / steps), greedy episodes and sampled ones separately;
- 95% Wilson intervals (the well-formed interval treats turns as independent: optimistic);
- the best learned method (by val pass@1) against prior-fixes, random-fixes (random
  candidates) and random-kinds at the same try budget, per split: the pass@1 difference
  paired by task with a 95% bootstrap interval;
- CPU minutes = time.process_time() of this process + CPU time of its waited-for children
  (pytest runs in the sandbox), per stage. Training cost is cumulative along the route
  (SFT includes expert data + init; RS/DPO include the shared sampling stage).

    .venv/bin/python bench/learning.py --quick          # smoke run, a few minutes
    .venv/bin/python bench/learning.py                  # the default CPU budget (~85 min)
    .venv/bin/python bench/learning.py [--sft-steps 300 --eval-limit 100 --k 4 ...]
    .venv/bin/python bench/learning.py --reuse-training WORK --splits quixbugs --quixbugs DIR
        # evaluate an earlier run's policies again; add sft+grpo-served,sft+grpo-async to
        # --methods to train GRPO on `agentrl serve` (sync vs async at staleness 1) first

Writes OUT/results.md (the table), OUT/results.json, OUT/diagnostics.json and
OUT/success.png; prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.env.batch_eval import wilson_interval  # noqa: E402
from components.env.episode import EpisodeResult  # noqa: E402
from components.evaluate.episodes import evaluate_model, run_policy  # noqa: E402
from components.preset import load_preset  # noqa: E402
from components.scripted.registry import fix_statistics  # noqa: E402
from components.tasks.task import Task, load_tasks  # noqa: E402

IN_PROCESS = ("untrained", "sft", "sft+rs", "sft+dpo", "sft+grpo")
# GRPO sampling on `agentrl serve` (issue 20), synchronous and asynchronous at staleness 1,
# the same settings otherwise: the server does not apply the try_fix constraint, so these
# two are compared with each other (both unconstrained in training, constrained in eval).
SERVED_GRPO = {
    "sft+grpo-served": {"async_rollouts": False},
    "sft+grpo-async": {"async_rollouts": True, "max_staleness": 1},
}
METHODS = (*IN_PROCESS, *SERVED_GRPO)
BASELINE = "scripted-baseline"
RANDOM_FIXES = "random-fixes"
PRIOR_FIXES = "prior-fixes"  # scripted search ordered by kind statistics of the train split
LISTING_ORDER = "listing-order"  # scripted search in the listing's order: no statistics
# kinds in random order (drawn inversely to how often listed), each in listed order: the
# default expert
RANDOM_KINDS = "random-kinds"
SCRIPTED = (BASELINE, RANDOM_FIXES, PRIOR_FIXES, LISTING_ORDER, RANDOM_KINDS)
SPLITS = ("val", "test", "quixbugs")
# Real bugs, never trained on: the converted QuixBugs task folders the repository holds.
QUIXBUGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "external_quixbugs"


# ------------------------------------------------------------------------------ accounting


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) + its reaped children (sandboxed pytest)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class Clock:
    """CPU and wall seconds per named stage."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        c0, w0 = cpu_seconds(), time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        try:
            return fn(*args, **kwargs)
        finally:
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu_seconds() - c0
            self.wall[name] = self.wall.get(name, 0.0) + time.monotonic() - w0
            print(f"    {name}: {self.wall[name]:.0f}s wall, {self.cpu[name]:.0f}s CPU",
                  flush=True)  # fmt: skip


# ------------------------------------------------------------------------------ settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="work folder (default runs/bench-learning/<time>)")
    p.add_argument("--preset", default="configs/cpu-demo.yaml", help="base preset")
    p.add_argument("--quick", action="store_true", help="smoke run: every budget tiny")
    p.add_argument(
        "--reuse-training",
        type=Path,
        help="the tasks, preset, trained policies and training times of an earlier run's work "
        "folder (its training.json), evaluated again; GRPO-on-a-server variants it lacks are "
        "trained from its SFT policy with this run's --grpo-* budget; other budgets ignored",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-tasks", type=int, default=600, help="suite size (60/20/20 split)")
    p.add_argument("--expert-limit", type=int, default=0, help="oracle episodes (0 = all train)")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--sample-tasks", type=int, default=32, help="train tasks sampled for RS/DPO")
    p.add_argument("--sample-k", type=int, default=4, help="samples per task for RS/DPO")
    p.add_argument("--rs-steps", type=int, default=30)
    p.add_argument(
        "--rs-max-per-task",
        type=int,
        default=1,
        help="RS keeps at most this many successes per task, the fewest-step ones (0 = all)",
    )
    p.add_argument("--dpo-steps", type=int, default=20)
    _grpo_arguments(p)
    _evaluation_arguments(p)
    args = p.parse_args(argv)
    if args.expert_episodes is None:
        no_knowledge = args.expert_policy in (LISTING_ORDER, RANDOM_KINDS)
        args.expert_episodes = "all" if no_knowledge else "successes"
    if args.quick:
        for name, value in dict(n_tasks=40, expert_limit=12, sft_steps=15, sample_tasks=3,
                                sample_k=2, rs_steps=4, dpo_steps=4, grpo_iterations=1,
                                grpo_tasks=2, grpo_group=2, eval_limit=3, k=2, passk_limit=3,
                                max_steps=4, max_new_tokens=64).items():  # fmt: skip
            setattr(args, name, value)
    if args.out is None:
        args.out = Path("runs/bench-learning") / time.strftime("%Y%m%d-%H%M%S")
    return args


def _grpo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpo-iterations", type=int, default=8)
    p.add_argument("--grpo-tasks", type=int, default=8, help="tasks per GRPO iteration")
    p.add_argument("--grpo-group", type=int, default=6, help="GRPO group size")
    p.add_argument("--grpo-lr", type=float, default=2e-4)
    p.add_argument("--grpo-beta", type=float, default=0.04, help="KL weight to the SFT policy")
    p.add_argument(
        "--grpo-temperature",
        type=float,
        default=1.0,
        help="training sampling T (rollout.temperature: GRPO and the RS/DPO samples)",
    )
    p.add_argument("--grpo-ppo-epochs", type=int, default=2, help="passes over each batch")
    p.add_argument("--grpo-minibatch", type=int, default=16, help="episodes per optimizer step")
    p.add_argument(
        "--grpo-turn-credit",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="each turn's tokens also get their turn's process reward (GRPOConfig.turn_credit)",
    )
    p.add_argument(
        "--grpo-top-entropy",
        type=float,
        default=1.0,
        help="GRPOConfig.top_entropy_quantile: policy term on this top fraction of tokens",
    )


def _evaluation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval-limit", type=int, default=50, help="tasks per split evaluated")
    p.add_argument("--k", type=int, default=2, help="samples per task for pass@k")
    p.add_argument(
        "--passk-limit",
        type=int,
        default=20,
        help="tasks per split for pass@k (0 = the --eval-limit tasks)",
    )
    p.add_argument(
        "--constrain-fix-ids",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="models draw try_fix ids only among listed untried candidates, in sampling, "
        "GRPO and evaluation (RolloutConfig.constrain_fix_ids)",
    )
    p.add_argument("--max-steps", type=int, default=5, help="assistant turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn")
    p.add_argument("--max-episode-tokens", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=16, help="episodes per generate call")
    p.add_argument("--workers", type=int, default=2, help="tool-execution threads")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument(
        "--methods",
        default=",".join((BASELINE, PRIOR_FIXES, RANDOM_FIXES, RANDOM_KINDS, *IN_PROCESS)),
        help=f"subset, comma separated (baselines included); on request: {', '.join(SERVED_GRPO)}",
    )
    p.add_argument("--splits", default=",".join(SPLITS), help="splits evaluated")
    p.add_argument(
        "--quixbugs",
        type=Path,
        default=QUIXBUGS,
        help="folder of converted QuixBugs task folders: the quixbugs split (evaluation only)",
    )
    p.add_argument(
        "--expert-policy",
        default=RANDOM_KINDS,
        help="oracle (explore + edit_file), oracle-fixes (list_fixes + try_fix, knows the "
        "answer), prior-fixes (list_fixes + try_fix in order of kind statistics), "
        "listing-order (list_fixes + try_fix in the listing's order) or random-kinds "
        "(list_fixes + try_fix, kinds in random order): the last two show the format and "
        "the procedure without the decision, which is left to RL",
    )
    p.add_argument(
        "--expert-episodes",
        choices=("all", "successes"),
        default=None,
        help="expert episodes SFT imitates: every scored one (a demonstration of the "
        "procedure, whatever its outcome) or the verified successes only; default: all for "
        "listing-order and random-kinds, successes for the experts that know something",
    )
    p.add_argument("--hidden-size", type=int, default=256, help="policy width")
    p.add_argument("--layers", type=int, default=4, help="policy decoder layers")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in SFT (CPU AMP)")


def write_preset(args: argparse.Namespace, path: Path) -> Path:
    """The base preset with this run's budgets: every stage, and this bench's evaluations,
    read their settings from it (the flags above only fill it in)."""
    data = yaml.safe_load(Path(args.preset).read_text())
    data["name"] = f"bench-learning-{path.parent.name}"
    data["sft"] = {**data.get("sft", {}), "max_steps": args.sft_steps, "seed": args.seed,
                   "bf16": args.bf16}  # fmt: skip
    data["policy"] = {**data.get("policy", {}), "hidden_size": args.hidden_size,
                      "num_layers": args.layers,
                      "intermediate_size": args.hidden_size * 11 // 4}  # fmt: skip
    # Scripted searches and models get the same episode budget (list + max_steps - 1 tries).
    # The models and the fix searches act through the fix_search tool set (the CPU demo's).
    data["env"] = {**data.get("env", {}), "max_steps": args.max_steps, "tool_set": "fix_search"}
    data["rollout"] = {**data.get("rollout", {}), "max_new_tokens": args.max_new_tokens,
                       "max_episode_tokens": args.max_episode_tokens,
                       "temperature": args.grpo_temperature,
                       "batch_size": args.batch_size, "workers": args.workers,
                       "seed": args.seed, "samples_per_task": args.sample_k,
                       "constrain_fix_ids": args.constrain_fix_ids}  # fmt: skip
    rs = data.get("rejection_sampling", {})
    data["rejection_sampling"] = {**rs,
                                  "max_per_task": args.rs_max_per_task,
                                  "prefer_fewest_steps": True,
                                  "sft": {**rs.get("sft", {}), "max_steps": args.rs_steps,
                                          "seed": args.seed}}  # fmt: skip
    data["dpo"] = {**data.get("dpo", {}), "max_steps": args.dpo_steps, "seed": args.seed}
    data["grpo"] = {**data.get("grpo", {}), "iterations": args.grpo_iterations,
                    "tasks_per_iteration": args.grpo_tasks, "group_size": args.grpo_group,
                    "learning_rate": args.grpo_lr, "beta": args.grpo_beta, "seed": args.seed,
                    "ppo_epochs": args.grpo_ppo_epochs, "minibatch_size": args.grpo_minibatch,
                    "turn_credit": args.grpo_turn_credit,
                    "top_entropy_quantile": args.grpo_top_entropy}  # fmt: skip
    data["evaluate"] = {**data.get("evaluate", {}), "workers": args.workers, "seed": args.seed,
                        "rollout": {"temperature": 0.0}}  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sections(preset: Path):
    """(env, sandbox, rollout as trained, evaluation) of the run's preset."""
    p = load_preset(preset)
    return p.section("env"), p.section("sandbox"), p.section("rollout"), p.section("evaluate")


# ------------------------------------------------------------------------------ training


def _stage(fn, argv: list[str], out: Path) -> dict:
    """Run one `agentrl` stage function; return its result.json."""
    code = fn([str(a) for a in argv])
    if code not in (0, None):
        raise RuntimeError(f"stage {fn.__name__} {argv} exited {code}")
    return json.loads((out / "result.json").read_text())


def train_all(args, work: Path, preset: Path, clock: Clock) -> tuple[dict[str, str], dict]:
    """Policy folder per method (None where the method could not train) + stage notes."""
    from components.policy.__main__ import main_init as main_policy_init
    from components.rollout.__main__ import main_sample
    from components.train.__main__ import main_dpo, main_grpo, main_rejection_sampling, main_sft

    tasks_dir = work / "tasks"
    train, _ = load_tasks(tasks_dir, split="train")
    expert = train[: args.expert_limit] if args.expert_limit else train
    # Fix searches run under the model's episode budget (the preset's env.max_steps), so
    # SFT never sees a turn the model will not have.
    env, sandbox, rollout, evaluation = sections(preset)
    results = clock.run("expert", run_policy, expert, args.expert_policy, rollout=rollout,
                        env=env, sandbox=sandbox, workers=args.workers, seed=args.seed,
                        statistics=args.statistics)  # fmt: skip
    records = work / "expert.jsonl"
    keep = [r for r in results if r.status == "ok" and (args.expert_episodes == "all" or r.success)]
    records.write_text("".join(json.dumps(r.record) + "\n" for r in keep))
    notes: dict = {"expert_episodes": len(results), "expert_kept": len(keep),
                   "expert_successes": sum(r.success for r in results)}  # fmt: skip
    p = ["--preset", preset]
    init = clock.run("init", _stage, main_policy_init,
                     [*p, "--records", records, "--out", work / "init"], work / "init")  # fmt: skip
    policies = {"untrained": init["policy_dir"]}
    notes["parameters"], notes["vocab_size"] = init["parameters"], init["vocab_size"]
    wanted = set(args.methods.split(","))
    if not wanted - {"untrained"}:
        return policies, notes
    sft = clock.run("sft", _stage, main_sft, [*p, "--policy", init["policy_dir"], "--records",
                    records, "--out", work / "sft"], work / "sft")  # fmt: skip
    policies["sft"] = sft["policy_dir"]
    notes["sft"] = {k: sft[k] for k in ("steps", "tokens", "train_seconds", "num_examples")}
    notes["sft"]["final_loss"] = sft["losses"][-1] if sft["losses"] else None
    if {"sft+rs", "sft+dpo"} & wanted:
        sample = clock.run("sample", _stage, main_sample, [*p, "--policy", sft["policy_dir"],
                           "--tasks", tasks_dir, "--split", "train", "--limit",
                           args.sample_tasks, "--out", work / "samples"],
                           work / "samples")  # fmt: skip
        notes["sample"] = {k: sample[k] for k in ("episodes", "success_rate", "invalid_calls",
                                                  "generated_tokens", "end_reasons")}  # fmt: skip
    if "sft+rs" in wanted:
        rs = clock.run("rs", _stage, main_rejection_sampling, [*p, "--policy",
                       sft["policy_dir"], "--samples", work / "samples", "--out", work / "rs"],
                       work / "rs")  # fmt: skip
        notes["rs"] = {k: rs[k] for k in ("kept", "sampled", "tasks_with_success")}
        # No verified success among the samples: nothing to fine-tune on, RS = SFT.
        policies["sft+rs"] = (rs["sft"] or {}).get("checkpoint_dir") or sft["policy_dir"]
    if "sft+dpo" in wanted:
        dpo = clock.run("dpo", _stage, main_dpo, [*p, "--policy", sft["policy_dir"],
                        "--samples", work / "samples", "--out", work / "dpo"], work / "dpo")  # fmt: skip
        notes["dpo"] = {k: dpo.get(k) for k in ("num_pairs", "skipped", "steps")}
        policies["sft+dpo"] = dpo.get("checkpoint_dir") or dpo.get("policy_dir")
    if "sft+grpo" in wanted:
        grpo = clock.run("grpo", _stage, main_grpo, [*p, "--policy", sft["policy_dir"],
                         "--tasks", tasks_dir, "--split", "train", "--out", work / "grpo",
                         "--no-resume"], work / "grpo")  # fmt: skip
        policies["sft+grpo"] = grpo["policy_dir"]
        curves = grpo.get("curves", {})
        notes["grpo"] = {k: curves.get(k) for k in ("success_rate", "mean_reward",
                                                    "reward/wasted_fix_try", "kl",
                                                    "generated_tokens", "sample_seconds",
                                                    "update_seconds")}  # fmt: skip
    for method in SERVED_GRPO:
        if method in wanted:
            policies[method], notes[method] = clock.run(
                method.removeprefix("sft+"), served_grpo, work, preset, sft["policy_dir"], method
            )
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
        data["rollout"] = {**data["rollout"], "backend": "openai", "base_url": url,
                           "constrain_fix_ids": False}  # fmt: skip
        data["grpo"] = {**data["grpo"], **SERVED_GRPO[method]}
        served = work / f"preset-{method.replace('+', '-')}.yaml"
        served.write_text(yaml.safe_dump(data, sort_keys=False))
        result = _stage(main_grpo, ["--preset", served, "--policy", sft_policy, "--tasks",
                                    work / "tasks", "--split", "train", "--out", out,
                                    "--no-resume"], out)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    curves = result.get("curves", {})
    keys = ("success_rate", "mean_reward", "policy_lag", "sample_seconds", "update_seconds",
            "iteration_seconds")  # fmt: skip
    return result["policy_dir"], {k: curves.get(k) for k in keys}


# ------------------------------------------------------------------------------ evaluation


def sample_checkpoint(tasks: list[Task], policy_dir: str, preset: Path, k: int, seed: int):
    """k episodes per task at temperature 1 through the rollout engine (pass@k)."""
    env, sandbox, rollout, _ = sections(preset)
    sampling = dataclasses.replace(rollout, temperature=1.0, samples_per_task=k, seed=seed + 1)
    return evaluate_model(tasks, policy_dir, sampling, env, sandbox)


def greedy_checkpoint(tasks: list[Task], policy_dir: str, preset: Path) -> list[EpisodeResult]:
    """pass@1: the one evaluation path (components/evaluate/episodes.py), as trained."""
    env, sandbox, rollout, evaluation = sections(preset)
    return run_policy(tasks, f"model:{policy_dir}", rollout=evaluation.rollout_config(rollout),
                      env=env, sandbox=sandbox)  # fmt: skip


def baseline_runs(tasks: list[Task], args, seeds: list[int], method: str = BASELINE):
    """A scripted policy through the same path, once per seed."""
    env, sandbox, rollout, _ = sections(args.preset_file)
    if method == BASELINE:  # one edit_file: the free-form tools
        env = env.with_tool_set("free_form")
    out: list[EpisodeResult] = []
    for seed in seeds:
        out += run_policy(tasks, method, rollout=rollout, env=env, sandbox=sandbox,
                          workers=args.workers, seed=seed, statistics=args.statistics)  # fmt: skip
    return out


def pass_at_k(results: list[EpisodeResult], task_ids: list[str]) -> tuple[int, int]:
    """(tasks with any verified success, tasks with at least one verified episode)."""
    by_task: dict[str, list[bool]] = {}
    for r in results:
        if r.status == "ok":
            by_task.setdefault(r.task_id, []).append(r.success)
    return sum(any(by_task[t]) for t in task_ids if t in by_task), len(by_task)


def well_formed(results: list[EpisodeResult]) -> tuple[int, int]:
    steps = sum(r.steps for r in results if r.status == "ok")
    invalid = sum(r.invalid_calls for r in results if r.status == "ok")
    return steps - invalid, steps


def diagnose(results: list[EpisodeResult], tasks: dict[str, Task]) -> dict:
    """Why episodes fail: end reasons, invalid-call reasons, what edits did."""
    reasons: Counter = Counter()
    invalid: Counter = Counter()
    edits = Counter()
    tokens = []
    for r in results:
        reasons[r.end_reason] += 1
        tokens.append(r.record.get("metadata", {}).get("num_tokens") or 0)
        module = tasks[r.task_id].metadata.extra.get("module", "")
        bug_line = tasks[r.task_id].metadata.extra.get("mutation_line")
        events = r.record.get("trajectory", [])
        for a, env in zip(events[1::2], events[2::2], strict=False):
            obs = env.get("observation", "")
            if a.get("action") is None:
                why = re.sub(r"\d+", "N", obs.removeprefix("error: invalid tool call: "))
                invalid[why[:60]] += 1
                continue
            if a["action"] in ("edit_file", "edit_lines", "apply_patch"):
                edits["attempted"] += 1
                args = a.get("arguments", {})
                if a["action"] != "apply_patch" and args.get("path") != module:
                    edits["wrong_path"] += 1
                if obs.startswith(("edited", "applied")):
                    edits["applied"] += 1
                    m = re.search(r"now lines (\d+)-(\d+)", obs)
                    if m and bug_line and int(m.group(1)) <= bug_line <= int(m.group(2)):
                        edits["applied_on_bug_line"] += 1
                elif "not found" in obs:
                    edits["old_text_not_found"] += 1
                elif "no longer parse" in obs:
                    edits["refused_unparseable"] += 1
    return {"end_reasons": dict(reasons), "invalid_call_reasons": dict(invalid.most_common(5)),
            "edits": dict(edits),
            "mean_tokens": round(sum(tokens) / len(tokens), 1) if tokens else 0}  # fmt: skip


def evaluate_all(args, work: Path, policies: dict[str, str], clock: Clock) -> tuple[list, dict]:
    rows, diagnostics = [], {}
    wanted = args.methods.split(",")
    for split in args.splits.split(","):
        if split == "quixbugs":
            if not args.quixbugs.is_dir():  # a folder converted during a long run, not there
                print(f"{args.quixbugs}: no such folder; the quixbugs split is the fixtures")
                args.quixbugs = QUIXBUGS
            tasks, errors = load_tasks(args.quixbugs)
        else:
            tasks, errors = load_tasks(work / "tasks", split=split)
        tasks = tasks[: args.eval_limit] if args.eval_limit else tasks
        k_tasks = tasks[: args.passk_limit] if args.passk_limit else tasks
        ids = [t.id for t in k_tasks]
        by_id = {t.id: t for t in tasks}
        for method in [*SCRIPTED, *[m for m in METHODS if m in policies]]:
            if method not in wanted:
                continue
            name = f"eval {method} {split}"
            c0, w0 = cpu_seconds(), time.monotonic()
            if method in SCRIPTED:
                greedy = clock.run(f"{name} pass@1", baseline_runs, tasks, args, [args.seed],
                                   method)  # fmt: skip
                seeds = [args.seed + 1 + i for i in range(args.k)]
                sampled = clock.run(f"{name} pass@k", baseline_runs, k_tasks, args, seeds,
                                    method)  # fmt: skip
            elif policies[method] is None:
                continue
            else:
                greedy = clock.run(f"{name} pass@1", greedy_checkpoint, tasks, policies[method],
                                   args.preset_file)  # fmt: skip
                sampled = clock.run(f"{name} pass@k", sample_checkpoint, k_tasks,
                                    policies[method], args.preset_file, args.k, args.seed)  # fmt: skip
            eval_cpu, eval_wall = cpu_seconds() - c0, time.monotonic() - w0
            ok = [r for r in greedy if r.status == "ok"]
            s1 = sum(r.success for r in ok)
            sk, nk = pass_at_k(sampled, ids)
            wg, ng = well_formed(greedy)
            ws, ns = well_formed(sampled)
            rows.append({
                "method": method, "split": split, "n": len(ok),
                "infra_failures": len(greedy) - len(ok),
                "pass1": s1 / max(len(ok), 1), "pass1_ci": wilson_interval(s1, len(ok)),
                "pass1_by_task": {r.task_id: r.success for r in ok},
                "passk": sk / max(nk, 1), "passk_ci": wilson_interval(sk, nk), "k": args.k,
                "wf_greedy": wg / max(ng, 1), "wf_greedy_ci": wilson_interval(wg, ng),
                "wf_sampled": ws / max(ns, 1), "wf_sampled_ci": wilson_interval(ws, ns),
                "eval_cpu_min": eval_cpu / 60, "eval_wall_min": eval_wall / 60,
            })  # fmt: skip
            diagnostics[f"{method}/{split}"] = {"greedy": diagnose(greedy, by_id),
                                                "sampled": diagnose(sampled, by_id)}  # fmt: skip
            (work / "episodes").mkdir(exist_ok=True)
            with (work / "episodes" / f"{method}-{split}.jsonl").open("w") as f:
                for r in greedy + sampled:
                    f.write(json.dumps(r.record) + "\n")
    return rows, diagnostics


# ------------------------------------------------------------------------------ report

TRAIN_ROUTE = {
    BASELINE: [],
    RANDOM_FIXES: [],
    PRIOR_FIXES: ["kind rates"],
    RANDOM_KINDS: ["kind rates"],
    LISTING_ORDER: [],
    "untrained": ["init"],
    "sft": ["expert", "init", "sft"],
    "sft+rs": ["expert", "init", "sft", "sample", "rs"],
    "sft+dpo": ["expert", "init", "sft", "sample", "dpo"],
    "sft+grpo": ["expert", "init", "sft", "grpo"],
    # the server's CPU is counted: it is reaped inside the stage
    "sft+grpo-served": ["expert", "init", "sft", "grpo-served"],
    "sft+grpo-async": ["expert", "init", "sft", "grpo-async"],
}


def paired_difference(
    a: dict[str, bool], b: dict[str, bool], n_boot: int = 10_000, seed: int = 0
) -> tuple[float, tuple[float, float]] | None:
    """pass@1 of a minus pass@1 of b on the tasks both verified, with a 95% paired
    bootstrap interval (tasks resampled; the same task's two outcomes stay together)."""
    import numpy as np

    common = sorted(set(a) & set(b))
    if not common:
        return None
    diff = np.array([float(a[t]) - float(b[t]) for t in common])
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    return float(diff.mean()), (float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))


def add_differences(rows: list[dict]) -> None:
    """Each learned method's pass@1 minus SFT's (same split, paired by task)."""
    for r in rows:
        sft = next((x for x in rows if x["method"] == "sft" and x["split"] == r["split"]), None)
        if r["method"].startswith("sft+") and sft is not None:
            r["delta_vs_sft"] = paired_difference(r["pass1_by_task"], sft["pass1_by_task"])


def best_learned(rows: list[dict]) -> str | None:
    """The learned method with the highest val pass@1 (chosen on val only, so the test and
    QuixBugs comparisons are not selected on)."""
    val = [r for r in rows if r["split"] == "val" and r["method"] in METHODS]
    return max(val, key=lambda r: r["pass1"])["method"] if val else None


def comparisons(rows: list[dict]) -> str:
    """The best learned method against the scripted searches at the same try budget,
    per split: pass@1 difference, paired by task, with its 95% bootstrap interval."""
    best = best_learned(rows)
    if best is None:
        return "(no learned method evaluated on val)"
    lines = [f"best learned method (by val pass@1): {best}", "",
             "| split | vs | best pass@1 | theirs | difference, paired [95% CI] | "
             "interval excludes 0 |", "|---|---|---|---|---|---|"]  # fmt: skip
    for split in dict.fromkeys(r["split"] for r in rows):
        mine = next((r for r in rows if r["method"] == best and r["split"] == split), None)
        for other in (PRIOR_FIXES, RANDOM_FIXES, RANDOM_KINDS):
            theirs = next((r for r in rows if r["method"] == other and r["split"] == split), None)
            if mine is None or theirs is None:
                continue
            d = paired_difference(mine["pass1_by_task"], theirs["pass1_by_task"])
            if d is None:
                continue
            excludes = "yes, above" if d[1][0] > 0 else "yes, below" if d[1][1] < 0 else "no"
            lines.append(f"| {split} | {other} | {mine['pass1']:.0%} | {theirs['pass1']:.0%} | "
                         f"{d[0] * 100:+.1f} pts [{d[1][0] * 100:+.1f}, {d[1][1] * 100:+.1f}] "
                         f"| {excludes} |")  # fmt: skip
    return "\n".join(lines)


def _pct(x: float, ci) -> str:
    return f"{x:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def table(rows: list[dict], clock: Clock) -> str:
    head = ("| method | split | n | pass@1 greedy [95% CI] | pass@k (T=1) [95% CI] | "
            "well-formed greedy [95% CI] | well-formed T=1 [95% CI] | train CPU min "
            "(cumulative) | eval CPU min | eval wall min | pass@1 - SFT's, paired [95% CI] |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        train = sum(clock.cpu.get(s, 0.0) for s in TRAIN_ROUTE[r["method"]]) / 60
        lines.append(
            f"| {r['method']} | {r['split']} | {r['n']} | {_pct(r['pass1'], r['pass1_ci'])} | "
            f"{_pct(r['passk'], r['passk_ci'])} (k={r['k']}) | "
            f"{_pct(r['wf_greedy'], r['wf_greedy_ci'])} | "
            f"{_pct(r['wf_sampled'], r['wf_sampled_ci'])} | {train:.1f} | "
            f"{r['eval_cpu_min']:.1f} | {r['eval_wall_min']:.1f} | {_delta(r)} |"
        )
    return "\n".join(lines)


def _delta(row: dict) -> str:
    d = row.get("delta_vs_sft")
    if d is None:
        return ""
    return f"{d[0] * 100:+.1f} pts [{d[1][0] * 100:+.1f}, {d[1][1] * 100:+.1f}]"


def stage_table(clock: Clock) -> str:
    lines = ["| stage | wall s | CPU s (process + children) |", "|---|---|---|"]
    for name in clock.wall:
        lines.append(f"| {name} | {clock.wall[name]:.0f} | {clock.cpu[name]:.0f} |")
    lines.append(f"| total | {sum(clock.wall.values()):.0f} | {sum(clock.cpu.values()):.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    labels = {"val": "val (unseen bugs)", "test": "test (unseen families)",
              "quixbugs": "QuixBugs (real bugs)"}  # fmt: skip
    for j, split in enumerate(SPLITS):
        xs, ys, lo, hi = [], [], [], []
        for i, m in enumerate(methods):
            row = next((r for r in rows if r["method"] == m and r["split"] == split), None)
            if row is None:
                continue
            xs.append(i + (j - 1) * width)
            ys.append(row["pass1"])
            lo.append(row["pass1"] - row["pass1_ci"][0])
            hi.append(row["pass1_ci"][1] - row["pass1"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=labels[split])
    ax.set_xticks(range(len(methods)), methods, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (greedy), 95% Wilson CI")
    ax.set_title("Task success by training method")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def train_or_reuse(args, work: Path, clock: Clock) -> tuple[Path, dict, dict, dict]:
    """(preset, policy folder per method, training notes, the reused training.json or {}):
    train every method, or take an earlier run's (--reuse-training) and train only the
    served GRPO variants it lacks; training.json records what trained them either way."""
    trained: dict = {}
    if args.reuse_training:  # its tasks, preset, policies and training clock; evaluate only
        old: Path = args.reuse_training
        trained = json.loads((old / "training.json").read_text())
        # Its preset, but this run's GRPO budget: GRPO variants it did not train are trained
        # here from its SFT policy.
        preset = work / "preset.yaml"
        data = yaml.safe_load((old / "preset.yaml").read_text())
        data["grpo"] = yaml.safe_load(write_preset(args, work / "own.yaml").read_text())["grpo"]
        preset.write_text(yaml.safe_dump(data, sort_keys=False))
        (work / "tasks").symlink_to((old / "tasks").resolve())
        clock.cpu.update(trained["cpu"])
        clock.wall.update(trained["wall"])
    else:
        from components.tasks.generate import generate_suite

        preset = write_preset(args, work / "preset.yaml")
        clock.run("tasks", generate_suite, work / "tasks", args.n_tasks, args.seed)
    train, _ = load_tasks(work / "tasks", split="train")
    # The statistics searches (prior-fixes, random-kinds) learn from the train split only.
    args.statistics = clock.run("kind rates", fix_statistics, train)
    args.preset_file = preset
    if args.reuse_training:
        policies, notes = trained["policies"], trained["notes"]
        for method in [m for m in SERVED_GRPO if m in args.methods.split(",")]:
            if method not in policies:
                policies[method], notes[method] = clock.run(
                    method.removeprefix("sft+"), served_grpo, work, preset, policies["sft"], method
                )
    else:
        policies, notes = train_all(args, work, preset, clock)
    (work / "training.json").write_text(json.dumps(
        {"policies": policies, "notes": notes, "cpu": clock.cpu, "wall": clock.wall,
         "settings": trained.get("settings", {}) if args.reuse_training else
         {k: v for k, v in vars(args).items() if k not in ("statistics", "preset_file")}},
        indent=2, default=str))  # fmt: skip
    return preset, policies, notes, trained


def settings_line(args, trained: dict) -> str:
    skip = ("out", "preset", "statistics", "preset_file")
    settings = ", ".join(f"{k}={v}" for k, v in vars(args).items() if k not in skip)
    if args.reuse_training:  # what trained the policies, as that run was set
        trained_by = ", ".join(f"{k}={v}" for k, v in trained.get("settings", {}).items()
                               if k not in skip)  # fmt: skip
        settings += f"\n\ntraining reused from {args.reuse_training}, whose settings were: "
        settings += trained_by or "(not recorded)"
        settings += "; the GRPO-on-a-server methods trained here with this run's --grpo-* flags"
    return settings


def new_work_folder(args: argparse.Namespace) -> Path:
    """`args.out`, created empty (one work folder per run), with the run's args.json."""
    work: Path = args.out
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"{work}: not empty; one work folder per run")
    work.mkdir(parents=True, exist_ok=True)
    (work / "args.json").write_text(json.dumps(vars(args), default=str, indent=2))
    return work


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = new_work_folder(args)
    clock = Clock()
    started = time.monotonic()
    preset, policies, notes, trained = train_or_reuse(args, work, clock)
    rows, diagnostics = evaluate_all(args, work, policies, clock)
    stats = args.statistics
    notes["kind_rates"] = {k: round(v, 4) for k, v in stats.kind_success_rates.items()}
    notes["kind_listing_shares"] = {k: round(v, 4) for k, v in stats.kind_listing_shares.items()}
    add_differences(rows)

    md = table(rows, clock) + "\n\n" + comparisons(rows)
    stages = stage_table(clock)
    wall = time.monotonic() - started
    settings = settings_line(args, trained)
    report = (f"# bench/learning.py\n\nsettings: {settings}\n\n{md}\n\n"
              f"pass@1 n = tasks evaluated per split; pass@k: any of k episodes at T=1 "
              f"(baseline: k seeds). CPU = time.process_time() of this process (all torch and "
              f"tool threads) + reaped children. Commands run in the bwrap sandbox (pytest) "
              f"are NOT reaped by this process and are missing from CPU (a 2.4 s sandboxed "
              f"busy loop adds 0.006 s): the wall column is the upper bound (x cores).\n\n## Stages\n\n{stages}\n\nwall total {wall / 60:.1f} min\n")  # fmt: skip
    (work / "results.md").write_text(report)
    (work / "results.json").write_text(json.dumps(
        {"rows": rows, "notes": notes, "cpu_s": clock.cpu, "wall_s": clock.wall,
         "policies": policies}, indent=2, default=str))  # fmt: skip
    (work / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    plot(rows, work / "success.png")
    print("\n" + report)
    print("training notes: " + json.dumps(notes, default=str))
    print(f"\nwritten: {work}/results.md, results.json, diagnostics.json, success.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
