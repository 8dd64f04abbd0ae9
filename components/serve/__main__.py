"""CLI: `agentrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--name policy]
[--allow-runtime-updates]`."""

from __future__ import annotations

import sys
from pathlib import Path

from components.cli_args import (
    ArgumentParser,
    CommandError,
    existing_dir,
    nonempty,
    nonnegative_int,
    port,
)


def main_serve(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="agentrl serve",
        description="Serve a local checkpoint over an OpenAI-compatible HTTP API "
        "(/v1/models, /v1/completions, /v1/chat/completions).",
    )
    p.add_argument("--model", required=True, type=existing_dir,
                   help="checkpoint directory (save_policy)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--name", default="policy", type=nonempty,
                   help="model name clients send (vLLM: served name)")  # fmt: skip
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--threads", type=nonnegative_int, default=0,
                   help="torch CPU threads (0: torch default)")  # fmt: skip
    p.add_argument(
        "--allow-runtime-updates", action="store_true",
        help="enable POST /v1/load_lora_adapter, /v1/unload_lora_adapter (vLLM's, with "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING) and /update_weights_from_disk (SGLang's): the "
        "trainer's policy sync. Anyone who can reach the port can then swap the weights",
    )  # fmt: skip
    args = p.parse_args(argv)
    _check_checkpoint(args.model)
    import torch

    from components.policy.model import CheckpointError, load_policy
    from components.serve.server import serve

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_policy(args.model, dtype=args.dtype)
    except CheckpointError:  # damaged weights or config: the one line names the folder
        raise
    except (ValueError, KeyError, OSError) as e:  # a config.json that is not a model's
        raise CommandError(f"{args.model}: cannot load the checkpoint ({e})") from None
    if torch.cuda.is_available():
        model.to("cuda")
    print(f"agentrl serve: {args.name} on http://{args.host}:{args.port}/v1", flush=True)
    serve(model, tokenizer, host=args.host, port=args.port, model_name=args.name,
          runtime_updates=args.allow_runtime_updates)  # fmt: skip
    return 0


def _check_checkpoint(model: Path) -> None:
    """`model` is a full checkpoint with a tokenizer; a LoRA adapter folder is said to be
    one, with the two ways to serve it."""
    if (model / "adapter_config.json").is_file() or (model / "agentrl_adapter.json").is_file():
        raise CommandError(
            f"{model} is a LoRA adapter, not a full checkpoint: fold it into its base first "
            f"(`agentrl policy merge --policy {model} --out MERGED`, then serve MERGED/policy), "
            "or serve its base with --allow-runtime-updates and load the adapter with POST "
            "/v1/load_lora_adapter"
        )
    if not (model / "config.json").is_file():
        raise CommandError(f"{model} is not a checkpoint (no config.json)")
    if not (model / "tokenizer.json").is_file() and not (model / "tokenizer_config.json").is_file():
        raise CommandError(f"{model} is not a saved policy (config.json but no tokenizer)")


if __name__ == "__main__":
    from components.cli import run

    sys.exit(run(["serve", *sys.argv[1:]]))
