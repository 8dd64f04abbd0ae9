"""`agentrl train grpo` (and `train ppo`, train/ppo.py, through `main_episode_trainer`): from
a saved policy on a task suite, every setting from a preset (sections grpo or ppo, rollout,
env, sandbox, runtime; with `rollout.server: vllm` it starts real vLLM on the policy's base
itself, serve/vllm_launcher.py). Wired in by components/train/__main__.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from components.rollout.policy_sync import PolicySyncError
from components.train.grpo.recipe import GRPOResult, train_grpo
from components.train.parallel import join_process_group, relaunch_as_ranks


def main_grpo(argv: Sequence[str] | None = None) -> int:
    """GRPO from a saved policy on a task suite, every setting from the preset's sections
    grpo, rollout, env and sandbox (a missing section means its defaults). Launched by
    torchrun (`python -m torch.distributed.run --nproc_per_node N -m components.cli train
    grpo ...`), the ranks share the sampling and the update; rank 0 writes the results."""
    # train_grpo looked up when it runs: a test may replace it on this module.
    return main_episode_trainer(
        "grpo", lambda *a, **k: train_grpo(*a, **k), main_grpo.__doc__, argv
    )


def main_episode_trainer(algorithm: str, train, doc: str | None, argv: Sequence[str] | None) -> int:
    """`agentrl train ALGORITHM`: `train` (train_grpo's signature, returning a GRPOResult)
    on the tasks with the preset's section ALGORITHM and its rollout, env and sandbox."""
    from components.cli_args import (
        ArgumentParser,
        existing_dir,
        output_dir,
        preset_file,
        saved_policy,
    )
    from components.preset import DEFAULT_PRESET, load_preset
    from components.tasks.task import SPLITS

    p = ArgumentParser(prog=f"agentrl train {algorithm}", description=doc)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file,
                   help="preset YAML (configs/)")  # fmt: skip
    p.add_argument("--policy", required=True, type=saved_policy,
                   help="policy checkpoint (save_policy output)")  # fmt: skip
    p.add_argument("--tasks", required=True, type=existing_dir, help="task suite folder")
    p.add_argument("--split", default="train", choices=("", *SPLITS),
                   help="task split to train on ('' = all)")  # fmt: skip
    p.add_argument("--out", required=True, type=lambda t: str(output_dir(t)),
                   help="output_dir: checkpoints, metrics, final policy")  # fmt: skip
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring checkpoints")
    args = p.parse_args(argv)

    from components.policy.model import load_policy
    from components.serve.vllm_launcher import sampling_server
    from components.tasks.task import load_tasks

    preset = load_preset(args.preset)
    config = dataclasses.replace(preset.section(algorithm), output_dir=args.out)
    tasks, errors = load_tasks(args.tasks, split=args.split or None)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SystemExit(f"agentrl train {algorithm}: invalid task: {errors[0]}{more}")
    given = list(argv) if argv is not None else sys.argv[1:]
    if (code := relaunch_as_ranks(["train", algorithm, *given])) is not None:
        return code
    rank, _ = join_process_group()
    model, tokenizer = load_policy(args.policy)
    rollout = preset.section("rollout")
    # rollout.server vllm: rank 0 (the one that samples on a server) starts vLLM itself.
    server = (sampling_server(rollout, args.policy, preset.section("runtime").startup_timeout_s,
                              Path(args.out) / "vllm-logs")
              if rank == 0 else contextlib.nullcontext((rollout, None)))  # fmt: skip
    try:
        with server as (rollout, _base):
            result = train(
                model, tokenizer, tasks, config, rollout, preset.section("env"),
                preset.section("sandbox"), resume=not args.no_resume,
            )  # fmt: skip
    except PolicySyncError as exc:  # the server would sample a stale or missing version
        raise SystemExit(f"agentrl train {algorithm}: {exc}") from None
    if rank == 0:
        _write_result(result, Path(args.out))
    return 0


def _write_result(result: GRPOResult, out: Path) -> None:
    """Print the run's summary; write it with per-iteration curves to out/result.json."""
    last = result.metrics[-1] if result.metrics else {}
    summary = {"iterations": result.iterations, "resumed_from": result.resumed_from,
               "policy_dir": result.policy_dir, "checkpoint_dir": result.checkpoint_dir,
               "last": last}  # fmt: skip
    print(json.dumps(summary, indent=2))
    # Per-iteration curves as lists (one value per iteration) for the pipeline's tracking.
    curves = {
        k: [m.get(k) for m in result.metrics]
        for k in sorted({k for m in result.metrics for k in m})
        if all(isinstance(m.get(k), int | float) and not isinstance(m.get(k), bool)
               for m in result.metrics)
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({**summary, "curves": curves}, indent=2) + "\n")
