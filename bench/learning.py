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
OUT/success.png; prints the table. The training stages are in bench/learning_train.py, what
is read off episodes and the report's pieces in bench/learning_report.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning_report import (  # noqa: E402
    _delta,
    _pct,
    diagnose,
    paired_difference,
    pass_at_k,
    plot,
    stage_table,
    well_formed,
)
from bench.learning_train import SERVED_GRPO, sections, served_grpo, train_all, write_preset  # noqa: E402
from components.env.batch_eval import wilson_interval  # noqa: E402
from components.env.episode import EpisodeResult  # noqa: E402
from components.evaluate.episodes import evaluate_model, run_policy  # noqa: E402
from components.scripted.registry import fix_statistics  # noqa: E402
from components.tasks.task import Task, load_tasks  # noqa: E402

IN_PROCESS = ("untrained", "sft", "sft+rs", "sft+dpo", "sft+grpo")
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
            print(f"    {name}: {self.wall[name]:.0f}s wall, {self.cpu[name]:.0f}s CPU", flush=True)


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
        for name, value in dict(
            n_tasks=40,
            expert_limit=12,
            sft_steps=15,
            sample_tasks=3,
            sample_k=2,
            rs_steps=4,
            dpo_steps=4,
            grpo_iterations=1,
            grpo_tasks=2,
            grpo_group=2,
            eval_limit=3,
            k=2,
            passk_limit=3,
            max_steps=4,
            max_new_tokens=64,
        ).items():
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


# ------------------------------------------------------------------------------ evaluation


def sample_checkpoint(tasks: list[Task], policy_dir: str, preset: Path, k: int, seed: int):
    """k episodes per task at temperature 1 through the rollout engine (pass@k)."""
    env, sandbox, rollout, _ = sections(preset)
    sampling = dataclasses.replace(rollout, temperature=1.0, samples_per_task=k, seed=seed + 1)
    return evaluate_model(tasks, policy_dir, sampling, env, sandbox)


def greedy_checkpoint(tasks: list[Task], policy_dir: str, preset: Path) -> list[EpisodeResult]:
    """pass@1: the one evaluation path (components/evaluate/episodes.py), as trained."""
    env, sandbox, rollout, evaluation = sections(preset)
    return run_policy(
        tasks,
        f"model:{policy_dir}",
        rollout=evaluation.rollout_config(rollout),
        env=env,
        sandbox=sandbox,
    )


def baseline_runs(tasks: list[Task], args, seeds: list[int], method: str = BASELINE):
    """A scripted policy through the same path, once per seed."""
    env, sandbox, rollout, _ = sections(args.preset_file)
    if method == BASELINE:  # one edit_file: the free-form tools
        env = env.with_tool_set("free_form")
    out: list[EpisodeResult] = []
    for seed in seeds:
        out += run_policy(
            tasks,
            method,
            rollout=rollout,
            env=env,
            sandbox=sandbox,
            workers=args.workers,
            seed=seed,
            statistics=args.statistics,
        )
    return out


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
                greedy = clock.run(
                    f"{name} pass@1", baseline_runs, tasks, args, [args.seed], method
                )
                seeds = [args.seed + 1 + i for i in range(args.k)]
                sampled = clock.run(f"{name} pass@k", baseline_runs, k_tasks, args, seeds, method)
            elif policies[method] is None:
                continue
            else:
                greedy = clock.run(
                    f"{name} pass@1", greedy_checkpoint, tasks, policies[method], args.preset_file
                )
                sampled = clock.run(
                    f"{name} pass@k",
                    sample_checkpoint,
                    k_tasks,
                    policies[method],
                    args.preset_file,
                    args.k,
                    args.seed,
                )
            eval_cpu, eval_wall = cpu_seconds() - c0, time.monotonic() - w0
            ok = [r for r in greedy if r.status == "ok"]
            s1 = sum(r.success for r in ok)
            sk, nk = pass_at_k(sampled, ids)
            wg, ng = well_formed(greedy)
            ws, ns = well_formed(sampled)
            rows.append(
                {
                    "method": method,
                    "split": split,
                    "n": len(ok),
                    "infra_failures": len(greedy) - len(ok),
                    "pass1": s1 / max(len(ok), 1),
                    "pass1_ci": wilson_interval(s1, len(ok)),
                    "pass1_by_task": {r.task_id: r.success for r in ok},
                    "passk": sk / max(nk, 1),
                    "passk_ci": wilson_interval(sk, nk),
                    "k": args.k,
                    "wf_greedy": wg / max(ng, 1),
                    "wf_greedy_ci": wilson_interval(wg, ng),
                    "wf_sampled": ws / max(ns, 1),
                    "wf_sampled_ci": wilson_interval(ws, ns),
                    "eval_cpu_min": eval_cpu / 60,
                    "eval_wall_min": eval_wall / 60,
                }
            )
            diagnostics[f"{method}/{split}"] = {
                "greedy": diagnose(greedy, by_id),
                "sampled": diagnose(sampled, by_id),
            }
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
    lines = [
        f"best learned method (by val pass@1): {best}",
        "",
        "| split | vs | best pass@1 | theirs | difference, paired [95% CI] | interval excludes 0 |",
        "|---|---|---|---|---|---|",
    ]
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
            lines.append(
                f"| {split} | {other} | {mine['pass1']:.0%} | {theirs['pass1']:.0%} | "
                f"{d[0] * 100:+.1f} pts [{d[1][0] * 100:+.1f}, {d[1][1] * 100:+.1f}] "
                f"| {excludes} |"
            )
    return "\n".join(lines)


def table(rows: list[dict], clock: Clock) -> str:
    head = (
        "| method | split | n | pass@1 greedy [95% CI] | pass@k (T=1) [95% CI] | "
        "well-formed greedy [95% CI] | well-formed T=1 [95% CI] | train CPU min "
        "(cumulative) | eval CPU min | eval wall min | pass@1 - SFT's, paired [95% CI] |"
    )
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
    (work / "training.json").write_text(
        json.dumps(
            {
                "policies": policies,
                "notes": notes,
                "cpu": clock.cpu,
                "wall": clock.wall,
                "settings": trained.get("settings", {})
                if args.reuse_training
                else {
                    k: v for k, v in vars(args).items() if k not in ("statistics", "preset_file")
                },
            },
            indent=2,
            default=str,
        )
    )
    return preset, policies, notes, trained


def settings_line(args, trained: dict) -> str:
    skip = ("out", "preset", "statistics", "preset_file")
    settings = ", ".join(f"{k}={v}" for k, v in vars(args).items() if k not in skip)
    if args.reuse_training:  # what trained the policies, as that run was set
        trained_by = ", ".join(
            f"{k}={v}" for k, v in trained.get("settings", {}).items() if k not in skip
        )
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
    report = (
        f"# bench/learning.py\n\nsettings: {settings}\n\n{md}\n\n"
        f"pass@1 n = tasks evaluated per split; pass@k: any of k episodes at T=1 "
        f"(baseline: k seeds). CPU = time.process_time() of this process (all torch and "
        f"tool threads) + reaped children. Commands run in the bwrap sandbox (pytest) "
        f"are NOT reaped by this process and are missing from CPU (a 2.4 s sandboxed "
        f"busy loop adds 0.006 s): the wall column is the upper bound (x cores).\n\n"
        f"## Stages\n\n{stages}\n\nwall total {wall / 60:.1f} min\n"
    )
    (work / "results.md").write_text(report)
    (work / "results.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "notes": notes,
                "cpu_s": clock.cpu,
                "wall_s": clock.wall,
                "policies": policies,
            },
            indent=2,
            default=str,
        )
    )
    (work / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    plot(rows, work / "success.png")
    print("\n" + report)
    print("training notes: " + json.dumps(notes, default=str))
    print(f"\nwritten: {work}/results.md, results.json, diagnostics.json, success.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
