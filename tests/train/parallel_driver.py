"""One process of the data-parallel checks (tests/train/test_parallel.py), run by torchrun
(or called in-process for the one-process reference).

    python -m torch.distributed.run --nproc_per_node 2 tests/train/parallel_driver.py \
        --policy DIR --mode grpo-step|dpo-step|sft-step|grpo-run --engine plain|zero2|zero3 \
        --out FILE

grpo-step / dpo-step / sft-step: one optimizer step of GRPO's `optimizer_step` / DPO's
`_accumulate` / SFT's `accumulate_sft` on a fixed batch built from the conftest records; rank 0 saves the step's metrics and the
gradient the optimizer is about to apply (averaged over ranks; under DeepSpeed gathered
from the ZeRO partitions) with torch.save. grpo-run: `train_grpo` with scripted episodes
for --iterations iterations (resuming from --run-dir), rank 0 saves the final weights.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]

from components.rollout.engine import Rollout  # noqa: E402
from components.train.config import DeepSpeedConfig, DPOConfig, GRPOConfig, SFTConfig  # noqa: E402
from tests.train.conftest import EXPERT_RECORDS, FAILED_RECORDS  # noqa: E402

ENGINES = {"plain": None, "zero2": DeepSpeedConfig(zero_stage=2),
           "zero3": DeepSpeedConfig(zero_stage=3)}  # fmt: skip


def fixed_rollouts(tokenizer) -> tuple[list[Rollout], torch.Tensor]:
    """Five episodes (the expert transcripts, truncated to differing lengths), fixed
    sampling log-probs and advantages: 5 over 2 ranks deals 3 + 2 (one zero-weight pass)."""
    from components.policy.chat import tokenize_trajectory

    rollouts = []
    for i, record in enumerate(EXPERT_RECORDS[:5]):
        out = tokenize_trajectory(tokenizer, record["trajectory"], max_tokens=300 + 40 * i)
        logps = [-0.5 - 0.1 * (t % 7) if m else 0.0
                 for t, m in enumerate(out["assistant_mask"])]  # fmt: skip
        rollouts.append(Rollout(None, out["input_ids"], out["assistant_mask"], logps,
                                record["task_id"], 0))  # fmt: skip
    return rollouts, torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])


def _capture(stepper, into: dict) -> None:
    """Record the gradient the optimizer step applies, averaged over ranks."""
    names = [n for n, p in stepper.model.named_parameters() if p.requires_grad]
    params = dict(stepper.model.named_parameters())
    if stepper.engine is not None:
        from deepspeed.utils import safe_get_full_grad

        real = stepper.engine.step

        def step():
            into.update({n: safe_get_full_grad(params[n]).detach().clone() for n in names})
            return real()

        stepper.engine.step = step
        return
    real = stepper.optimizer.step

    def optimizer_step(*args, **kwargs):
        into.update({n: params[n].grad.detach().clone() for n in names})
        return real(*args, **kwargs)

    stepper.optimizer.step = optimizer_step


def grpo_step(model, tokenizer, engine: str, loss_type: str) -> dict:
    import copy

    from components.rollout.config import RolloutConfig
    from components.train.grpo import per_token
    from components.train.grpo.update import Learner, optimizer_step, reference_logps
    from components.train.parallel import make_stepper

    reference = copy.deepcopy(model).eval().requires_grad_(False)
    config = GRPOConfig(micro_batch_size=2, beta=0.05, loss_type=loss_type, max_grad_norm=0.0,
                        deepspeed=ENGINES[engine])  # fmt: skip
    stepper = make_stepper(model, config.deepspeed, learning_rate=1e-3, weight_decay=0.0,
                           max_grad_norm=0.0, micro_batch_size=2)  # fmt: skip
    grads: dict = {}
    _capture(stepper, grads)
    rollouts, advantages = fixed_rollouts(tokenizer)
    device = torch.device("cpu")
    learner = Learner(stepper, reference, config, 1.0, RolloutConfig().max_episode_tokens,
                      tokenizer.pad_token_id, device)  # fmt: skip
    ref = reference_logps(reference, rollouts, learner)
    metrics = optimizer_step(learner, rollouts, per_token(advantages, rollouts), ref,
                             [4, 0, 3, 1, 2])  # fmt: skip
    return {"metrics": metrics, "grads": grads}


def dpo_step(model, tokenizer, engine: str) -> dict:
    import copy

    from components.train.data import preference_pairs
    from components.train.dpo import _accumulate, _pair_batches, _pair_tokens, _score_reference
    from components.train.parallel import make_stepper

    config = DPOConfig(batch_size=3, grad_accum=2, max_seq_len=512, max_grad_norm=0.0,
                       deepspeed=ENGINES[engine])  # fmt: skip
    pairs = preference_pairs(EXPERT_RECORDS + FAILED_RECORDS, max_pairs_per_task=1, seed=0)
    examples = [_pair_tokens(p, tokenizer, config.max_seq_len) for p in pairs]
    device = torch.device("cpu")
    _score_reference(copy.deepcopy(model).eval(), examples, tokenizer.pad_token_id, config, device)
    stepper = make_stepper(model, config.deepspeed, learning_rate=1e-3, weight_decay=0.0,
                           max_grad_norm=0.0, micro_batch_size=3)  # fmt: skip
    grads: dict = {}
    _capture(stepper, grads)
    batches = _pair_batches(examples, config.batch_size, config.seed)
    loss, chosen, rejected, tokens = _accumulate(stepper, batches, tokenizer.pad_token_id,
                                                 config, device)  # fmt: skip
    stepper.step()
    metrics = {"loss": loss, "chosen": chosen.tolist(), "rejected": rejected.tolist(),
               "tokens": tokens}  # fmt: skip
    return {"metrics": metrics, "grads": grads}


def sft_step(model, tokenizer, engine: str) -> dict:
    """One SFT window of 3 micro-batches of 2 expert transcripts: 3 over 2 ranks deals 2 + 1
    (one zero-weight pass)."""
    from components.train.data import collate, sft_examples
    from components.train.parallel import all_sum, make_stepper
    from components.train.sft import accumulate_sft

    config = SFTConfig(batch_size=2, max_seq_len=512, deepspeed=ENGINES[engine])
    examples = sft_examples(EXPERT_RECORDS, tokenizer, config.max_seq_len)
    stepper = make_stepper(model, config.deepspeed, learning_rate=1e-3, weight_decay=0.0,
                           max_grad_norm=0.0, micro_batch_size=2)  # fmt: skip
    grads: dict = {}
    _capture(stepper, grads)
    window = [collate(examples[i : i + 2], tokenizer.pad_token_id, 0) for i in range(0, 6, 2)]
    loss, seen = accumulate_sft(stepper, window, torch.device("cpu"), False)
    stepper.step()
    return {"metrics": all_sum({"loss": loss.item(), "tokens": seen}), "grads": grads}


def grpo_run(model, tokenizer, engine: str, tasks_dir: str, run_dir: str, iterations: int):
    from components.env.config import EnvConfig
    from components.rollout.config import RolloutConfig
    from components.sandbox.config import SandboxConfig
    from components.tasks.task import load_tasks
    from components.train.grpo import train_grpo
    from tests.train.test_grpo import scripted_generate

    tasks = load_tasks(tasks_dir, split="train")[0][:2]
    config = GRPOConfig(iterations=iterations, tasks_per_iteration=2, group_size=2,
                        learning_rate=1e-3, ppo_epochs=2, minibatch_size=2, micro_batch_size=1,
                        beta=0.05, output_dir=run_dir, deepspeed=ENGINES[engine])  # fmt: skip
    rollout = RolloutConfig(max_new_tokens=400, max_episode_tokens=1024, batch_size=8,
                            workers=1, temperature=1.0)  # fmt: skip
    result = train_grpo(model, tokenizer, tasks, config, rollout, EnvConfig(max_steps=1),
                        SandboxConfig(), generate_fn=scripted_generate(model, tokenizer, tasks))  # fmt: skip
    return {"metrics": result.metrics, "policy_dir": result.policy_dir,
            "resumed_from": result.resumed_from}  # fmt: skip


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--policy", required=True)
    p.add_argument("--mode", required=True,
                   choices=["grpo-step", "dpo-step", "sft-step", "grpo-run"])  # fmt: skip
    p.add_argument("--engine", default="plain", choices=sorted(ENGINES))
    p.add_argument("--loss-type", default="token")
    p.add_argument("--tasks", default="")
    p.add_argument("--run-dir", default="")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from components.policy.model import load_policy
    from components.train.parallel import join_process_group

    rank, _ = join_process_group()
    model, tokenizer = load_policy(args.policy)
    if args.mode == "grpo-step":
        result = grpo_step(model, tokenizer, args.engine, args.loss_type)
    elif args.mode == "dpo-step":
        result = dpo_step(model, tokenizer, args.engine)
    elif args.mode == "sft-step":
        result = sft_step(model, tokenizer, args.engine)
    else:
        result = grpo_run(model, tokenizer, args.engine, args.tasks, args.run_dir,
                          args.iterations)  # fmt: skip
    if rank == 0 and args.out:
        torch.save(result, args.out)
    return result


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run()
