"""Our GRPO against TRL's GRPOTrainer, side by side in one run: the same starting policy,
prompts, reward, seed, group size, learning rate, steps, completion length, temperature
and beta, on a single-turn verifiable task.

The task: "What is a + b? Answer with the number only." with a, b drawn from
1..--max-operand; the reward is 1.0 when the last integer in the completion is a + b, else
0.0 (a pure string check, nothing executed). Before training, the start is screened on
the held-out prompts at the training temperature (pass@1 and pass@8: the task is meant to
sit at a pass@8 of 10-70%, where groups disagree often enough to learn from).

Ours is the project's own code, not a copy: sampling with the rollout engine's
`generate_transformers` (token ids and sampling log-probs kept), advantages with
`losses.group_advantages` (as `train.grpo.advantages.advantages_of` uses it), and the update with
`train.grpo.update.update_with` (`losses.grpo_loss`, collation, micro-batches and the
plain-torch `Stepper`: clip, AdamW), each step's completions given to it as `Rollout`s.
TRL's is `trl.GRPOTrainer` as shipped (trl 1.16), one generation batch per optimizer step.

Settings matched (TRL's name = ours): num_generations = group_size;
per_device_train_batch_size = generation_batch_size = prompts x G (one micro-batch, one
optimizer step per generation, gradient_accumulation_steps 1, steps_per_generation 1,
num_iterations = ppo_epochs = 1); loss_type the same reduction ("dapo" = our "token":
the summed token loss over the step's completion tokens; "grpo"; "dr_grpo" with
max_completion_length = our max_episode_tokens); scale_rewards "group" = scale_by_std
(Bessel std + 1e-4); epsilon 0.2 both sides; beta with the k3 KL; top_k 0, top_p 1, the
same temperature in sampling and in the loss's log-probs; AdamW (0.9, 0.999, 1e-8), weight
decay 0, constant learning rate, no warmup, grad-norm clip 1.0; float32, no gradient
checkpointing; LoRA (`--lora-r`) the same adapters with the same seeded initialisation
(policy/lora.py's add_adapters) for both; the prompts rendered by the checkpoint's chat
template for both (checked token for token); the same prompts in the same order.

Differences that remain (the algorithm's, not the bench's):
- old log-probs: TRL, with num_iterations 1, takes them as the current forward's detached
  log-probs (ratio exactly 1); ours uses the log-probs stored at sampling (KV-cached,
  left-padded decoding), so the ratio is 1 up to float noise and the clip never binds.
- random streams: TRL samples from the global torch stream seeded by `seed`; ours from a
  stream per step derived from `seed`. Same settings, different draws: the two runs'
  completions differ, so their curves differ by sampling noise as well.
- stop tokens: TRL stops at the tokenizer's eos and the generation config's eos; ours at
  the chat format's end of turn (for SmolLM2-Instruct both are <|im_end|>).
- padding: TRL left-pads prompts and right-pads completions, ours right-pads whole
  sequences; positions differ only between prompts of different lengths (with single-digit
  operands every prompt here has the same length).
- TRL's loss also computes token entropies (for logging) and only the completion's logits
  (`logits_to_keep`); ours scores every position of the sequence: a wall difference only.

Before training, one batch goes through both updates from the same start (ours:
update_with; TRL's: GRPOTrainer.compute_loss on the same tokens and advantages) and the two
gradients are compared: the algorithm checked on identical inputs, apart from sampling.

The task and what both trainers share are in bench/grpo_vs_trl_task.py, the comparison and
the report in bench/grpo_vs_trl_report.py.

Outputs (OUT = --out): OUT/grpo-vs-trl-<date>.md (settings, the screen, per-step mean
reward of both, the held-out evaluation and the ratios), OUT/grpo-vs-trl-<date>.png (both
reward curves), OUT/grpo-vs-trl-<date>.json (the numbers). Printed: the ratio lines.

Final reward: each final policy sampled --eval-samples times at the training temperature
on --eval-prompts held-out prompts (never trained on), both with the same per-row random
streams; its mean reward, and ours / TRL's with a 95% bootstrap interval over the held-out
prompts (paired: a prompt's two means stay together). The mean reward of the last
--last-k training steps is reported beside it.

    .venv/bin/python bench/grpo_vs_trl.py          # SmolLM2-135M-Instruct, ~45 min on 2 busy cores
    .venv/bin/python bench/grpo_vs_trl.py --model tiny --steps 2 --group-size 2 --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.grpo_vs_trl_report import (  # noqa: E402
    _ratio,
    bootstrap_ratio,
    curve,
    gradient_line,
    plot,
    ratio_lines,
    report,
)
from bench.grpo_vs_trl_task import (  # noqa: E402
    Problem,
    Run,
    as_rollouts,
    evaluate,
    load_start,
    messages,
    problems,
    prompt_ids,
    rewards_of,
    sample,
    screen,
    starting_policy,
    training_prompts,
    trl_reward,
)
from bench.report import write_table  # noqa: E402

DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct"
LOSS_TYPES = ("dapo", "grpo", "dr_grpo")
SCREEN_K = 8  # pass@8 of the screen


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit status 2, not a usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="grpo_vs_trl.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=str(DEFAULT_MODEL),
        help="HF checkpoint folder (agentrl policy fetch smollm2-135m-instruct), "
        "or 'tiny': a from-scratch tiny policy (the smoke test's)",
    )
    p.add_argument("--steps", type=_positive(int), default=16, help="optimizer steps each")
    p.add_argument("--group-size", type=_positive(int), default=8, help="G: samples per prompt")
    p.add_argument("--prompts-per-step", type=_positive(int), default=2)
    p.add_argument("--lr", type=_positive(float), default=1e-4, help="constant AdamW rate")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--beta", type=float, default=0.0, help="k3 KL weight (TRL's default 0)")
    p.add_argument("--loss-type", choices=LOSS_TYPES, default="dapo", help="TRL's default dapo")
    p.add_argument("--temperature", type=_positive(float), default=1.0)
    p.add_argument("--max-completion-length", type=_positive(int), default=8)
    p.add_argument("--max-operand", type=_positive(int), default=9, help="a, b in 1..this")
    p.add_argument("--eval-prompts", type=_positive(int), default=16, help="held-out prompts")
    p.add_argument("--eval-samples", type=_positive(int), default=8, help="samples per prompt")
    p.add_argument("--last-k", type=_positive(int), default=5, help="steps in the train mean")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive(int), default=2, help="torch threads")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="only the same-batch gradient check (printed; nothing written)",
    )
    args = p.parse_args(argv)
    if args.group_size < 2:
        p.error("--group-size: must be >= 2 (a group needs a baseline)")
    if args.lora_r < 0 or args.beta < 0:
        p.error("--lora-r and --beta must be >= 0")
    if args.model != "tiny" and not (Path(args.model) / "config.json").is_file():
        p.error(f"--model: {args.model} is not a HF checkpoint folder (or 'tiny')")
    pairs = args.max_operand**2
    if args.eval_prompts >= pairs:
        p.error(f"--eval-prompts: must leave training prompts among the {pairs} sums")
    return args


# ---------------------------------------------------------------------------------------
# The two trainers


def our_settings(args):
    """(GRPOConfig, RolloutConfig) of our run: TRL's settings under our names."""
    from components.rollout.config import RolloutConfig
    from components.train.config import GRPOConfig

    config = GRPOConfig(
        iterations=args.steps,
        tasks_per_iteration=args.prompts_per_step,
        group_size=args.group_size,
        learning_rate=args.lr,
        beta=args.beta,
        loss_type="token" if args.loss_type == "dapo" else args.loss_type,
        scale_by_std=True,
        epsilon_low=0.2,
        epsilon_high=0.2,
        ppo_epochs=1,
        minibatch_size=0,
        micro_batch_size=args.prompts_per_step * args.group_size,
        max_grad_norm=1.0,
        weight_decay=0.0,
        seed=args.seed,
        use_cpu=True,
    )
    # max_episode_tokens is dr_grpo's divisor: TRL's max_completion_length
    rollout_config = RolloutConfig(
        temperature=args.temperature,
        top_p=1.0,
        max_new_tokens=args.max_completion_length,
        max_episode_tokens=args.max_completion_length,
    )
    return config, rollout_config


def own_reward_advantages(rollouts: list, config) -> tuple:
    """(advantages [B], keep): `advantages_of`'s group advantages of this bench's own
    rewards. They come from its answer check, not from an episode verdict of the pipeline's
    verifier, so they carry no signed record and the trainers' provenance check
    (advantages_of -> rollout_rewards) would rightly refuse them all."""
    import torch

    from components.train.losses import group_advantages

    ids: dict[str, int] = {}
    group_ids = torch.tensor([ids.setdefault(r.group_id, len(ids)) for r in rollouts])
    rewards = torch.tensor([float(r.result.reward) for r in rollouts])
    advantages = group_advantages(
        rewards, group_ids, scale_by_std=config.scale_by_std, leave_one_out=config.leave_one_out
    )
    return advantages, [i for i, r in enumerate(rollouts) if any(r.assistant_mask)]


def train_ours(start: Path, schedule: list[Problem], held_out: list[Problem], args) -> Run:
    """Our GRPO: per step, sample G completions of each of the step's prompts, reward them,
    group advantages, one update (group_advantages + update_with)."""
    import torch

    from components.seeding import derive_seed
    from components.train.devices import frozen_copy
    from components.train.grpo.update import update_with
    from components.train.parallel import make_stepper

    model, tokenizer = load_start(start, args)
    device = torch.device("cpu")
    config, rollout_config = our_settings(args)
    stepper = make_stepper(model, None, learning_rate=args.lr, weight_decay=0.0, max_grad_norm=1.0)
    # Full fine-tuning's KL reference is a frozen copy; under LoRA, the base (adapters off).
    reference = frozen_copy(model, None, device) if args.beta > 0 and not args.lora_r else None
    rewards, walls = [], []
    started = last = time.perf_counter()
    for step in range(args.steps):
        batch = schedule[step * args.prompts_per_step : (step + 1) * args.prompts_per_step]
        model.eval()
        completions = sample(
            model,
            tokenizer,
            batch,
            args.group_size,
            args,
            derive_seed(args.seed, "bench-sample", step),
        )
        step_rewards = rewards_of(tokenizer, batch, args.group_size, completions)
        rollouts = as_rollouts(tokenizer, batch, args.group_size, completions, step_rewards, step)
        advantages, keep = own_reward_advantages(rollouts, config)
        model.train()
        update_with(
            stepper,
            reference,
            [rollouts[i] for i in keep],
            advantages[keep],
            config,
            rollout_config,
            tokenizer.pad_token_id,
            device,
            step,
        )
        rewards.append(step_rewards)
        now = time.perf_counter()
        walls.append(now - last)
        last = now
        print(
            f"ours step {step + 1}/{args.steps}: mean reward "
            f"{statistics.mean(step_rewards):.3f}, {walls[-1]:.1f} s",
            flush=True,
        )
    train_wall = time.perf_counter() - started
    return Run(rewards, walls, evaluate(model, tokenizer, held_out, args), train_wall)


def trl_settings(args, output_dir: Path):
    """TRL's GRPOConfig of its run: one generation batch, one micro-batch, one optimizer
    step per step; our defaults where TRL's differ (constant rate, float32)."""
    from trl import GRPOConfig

    batch_size = args.prompts_per_step * args.group_size
    return GRPOConfig(
        output_dir=str(output_dir),
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        max_steps=args.steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        generation_batch_size=batch_size,
        num_generations=args.group_size,
        num_iterations=1,
        shuffle_dataset=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        beta=args.beta,
        loss_type=args.loss_type,
        scale_rewards="group",
        epsilon=0.2,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        log_completions=False,
    )


def train_trl(
    start: Path, schedule: list[Problem], held_out: list[Problem], args, work: Path
) -> Run:
    """TRL's GRPOTrainer on the same start and prompts, in the same order; its reward
    function records each generation batch's rewards (one per optimizer step)."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    model, tokenizer = load_start(start, args)
    rewards: list[list[float]] = []
    step_ends: list[float] = []

    def last_number(prompts, completions, answer, **kwargs) -> list[float]:
        out = trl_reward(completions, answer)
        rewards.append(out)
        return out

    class StepClock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            step_ends.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            step_ends.append(time.perf_counter())
            print(
                f"trl step {len(rewards)}/{args.steps}: mean reward "
                f"{statistics.mean(rewards[-1]):.3f}, {step_ends[-1] - step_ends[-2]:.1f} s",
                flush=True,
            )

    config = trl_settings(args, work / "trl")
    dataset = Dataset.from_list([{"prompt": messages(p), "answer": p.answer} for p in schedule])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[last_number],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.remove_callback(PrinterCallback)
    # The same prompt tokens for both: TRL's own rendering against ours.
    trl_ids = trainer._tokenize_prompts([messages(p) for p in schedule[:2]])[0]
    if [list(x) for x in trl_ids] != [prompt_ids(tokenizer, p) for p in schedule[:2]]:
        raise SystemExit("TRL renders the prompts to other tokens than ours")
    started = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - started
    walls = [b - a for a, b in itertools.pairwise(step_ends)]
    if len(rewards) != args.steps:
        raise SystemExit(f"TRL called the reward {len(rewards)} times in {args.steps} steps")
    return Run(rewards, walls, evaluate(trainer.model, tokenizer, held_out, args), train_wall)


def same_batch_gradients(start: Path, batch: list[Problem], args, work: Path) -> dict | None:
    """One batch, one update, both ways: G completions of each problem sampled once (ours),
    rewards alternating 0/1 within each group (so every group has signal), advantages
    from our group_advantages for both (tests/train/test_losses.py checks them against TRL's);
    then our update_with's gradient (read before its optimizer step) against the gradient
    of TRL's own GRPOTrainer.compute_loss on the same tokens, from the same start. Returns
    their cosine, relative L2 difference and norms; None with beta > 0 (TRL's loss would
    also need the reference log-probs its sampling step computes)."""
    import torch

    if args.beta > 0:
        return None
    ours, tokenizer, completions, advantages = _our_gradients(start, batch, args)
    theirs = _trl_gradients(start, batch, args, work, (tokenizer, completions, advantages))
    names = sorted(ours)
    a = torch.cat([ours[n].flatten() for n in names]).double()
    b = torch.cat([theirs[n].grad.flatten() for n in names]).double()
    return {
        "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
        "relative_difference": float((a - b).norm() / b.norm()),
        "grad_norm_ours": float(a.norm()),
        "grad_norm_trl": float(b.norm()),
    }


def _our_gradients(start: Path, batch: list[Problem], args) -> tuple:
    """(our update_with's gradient by parameter name, tokenizer, the sampled completions,
    their advantages): the batch sampled once from the start, rewards alternating 0/1."""
    import torch

    from components.train.grpo.update import update_with
    from components.train.parallel import Stepper, make_stepper

    class GradientRecorder(Stepper):
        """The plain stepper, keeping the gradient it steps with."""

        def step(self) -> float:
            self.grads = {
                n: p.grad.detach().clone()
                for n, p in self.model.named_parameters()
                if p.requires_grad
            }
            return super().step()

    k = args.group_size
    ours, tokenizer = load_start(start, args)
    ours.eval()
    completions = sample(ours, tokenizer, batch, k, args, 0)
    rewards = [float(i % 2) for i in range(len(completions))]
    rollouts = as_rollouts(tokenizer, batch, k, completions, rewards, 0)
    config, rollout_config = our_settings(args)
    advantages, _ = own_reward_advantages(rollouts, config)
    plain = make_stepper(ours, None, learning_rate=args.lr, max_grad_norm=1.0)
    stepper = GradientRecorder(**{f: getattr(plain, f) for f in Stepper.__dataclass_fields__})
    ours.train()
    pad_id, cpu = tokenizer.pad_token_id, torch.device("cpu")
    update_with(stepper, None, rollouts, advantages, config, rollout_config, pad_id, cpu, 0)
    return stepper.grads, tokenizer, completions, advantages


def _trl_gradients(start: Path, batch: list[Problem], args, work: Path, sampled_batch) -> dict:
    """TRL's GRPOTrainer.compute_loss, backpropagated from the start on the same tokens and
    advantages (`sampled_batch`: tokenizer, completions, advantages); the model's named
    parameters, their .grad set."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.trainer.utils import pad

    tokenizer, completions, advantages = sampled_batch
    k = args.group_size
    theirs, _ = load_start(start, args)
    dataset = Dataset.from_list([{"prompt": messages(p), "answer": p.answer} for p in batch])
    trainer = GRPOTrainer(
        model=theirs,
        reward_funcs=[trl_reward],
        args=trl_settings(args, work),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    prompts = [torch.tensor(prompt_ids(tokenizer, p)) for p in batch for _ in range(k)]
    sampled = [torch.tensor(c.token_ids) for c in completions]
    ones = lambda rows: [torch.ones_like(r) for r in rows]  # noqa: E731
    inputs = {  # what TRL's _generate_and_score_completions hands its loss
        "prompt_ids": pad(prompts, padding_value=tokenizer.pad_token_id, padding_side="left"),
        "prompt_mask": pad(ones(prompts), padding_value=0, padding_side="left"),
        "completion_ids": pad(sampled, padding_value=tokenizer.pad_token_id, padding_side="right"),
        "completion_mask": pad(ones(sampled), padding_value=0, padding_side="right"),
        "advantages": advantages.float(),
        "num_items_in_batch": torch.tensor(sum(len(c) for c in sampled)),
    }
    theirs.train()
    trainer.compute_loss(theirs, inputs).backward()
    return dict(theirs.named_parameters())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    pool, held_out = problems(args.max_operand, args.seed, args.eval_prompts)
    schedule = training_prompts(pool, args.steps, args.prompts_per_step, args.seed)
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as tmp:
        work = Path(tmp)
        start = starting_policy(args, work, [p.question for p in pool + held_out])
        check = same_batch_gradients(start, schedule[: args.prompts_per_step], args, work / "c")
        print(gradient_line(check), flush=True)
        if args.check_only:
            return 0
        model, tokenizer = load_start(start, args)
        start_label = "tiny from-scratch policy" if args.model == "tiny" else str(start)
        screened = screen(evaluate(model, tokenizer, held_out, args), args.eval_samples)
        del model
        print(
            f"screen of the start ({start_label}): "
            + ", ".join(f"{k} {v:.3f}" for k, v in screened.items()),
            flush=True,
        )
        runs = {
            "ours": train_ours(start, schedule, held_out, args),
            "trl": train_trl(start, schedule, held_out, args, work),
        }
    ours, trl = runs["ours"], runs["trl"]
    tail = {
        name: statistics.mean(x for r in run.rewards[-args.last_k :] for x in r)
        for name, run in runs.items()
    }
    ratios = {
        "final_reward": bootstrap_ratio(ours.evaluation, trl.evaluation, args.seed),
        "last_k": _ratio(tail["ours"], tail["trl"]),
        "wall_per_step": statistics.mean(ours.step_wall) / statistics.mean(trl.step_wall),
    }
    text = report(args, start_label, screened, runs, ratios, check)
    name = "grpo-vs-trl"
    path = write_table(text, args.out, name)
    stem = path.with_suffix("")
    plot(
        runs,
        screened["pass@1"],
        stem.with_suffix(".png"),
        f"GRPO on a + b: ours vs TRL ({start_label.split('/')[-1]})",
    )
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "args": vars(args),
                "start": start_label,
                "screen": screened,
                "ratios": ratios,
                "same_batch_gradients": check,
                "runs": {
                    n: {
                        "mean_reward_per_step": curve(r),
                        "rewards": r.rewards,
                        "step_wall_s": r.step_wall,
                        "held_out": r.evaluation,
                        "train_wall_s": r.train_wall,
                    }
                    for n, r in runs.items()
                },
            },
            indent=1,
            default=str,
        )
    )
    print("\n".join(ratio_lines(ratios)))
    print(f"plot: {stem.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
