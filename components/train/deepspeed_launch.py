"""SFT through DeepSpeed ZeRO as one launched process per device: `train_sft` with
`SFTConfig.deepspeed` set, on every rank (the stepper is parallel.make_stepper's).

Launch with either launcher, e.g. on CPU (gloo):

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \
        -m components.train.deepspeed_launch --records expert.jsonl \
        --policy-config policy.json --sft-config sft.json --result result.json

The engine comes from `deepspeed.initialize` with the shipped JSON (configs/deepspeed/
zero{2,3}.json), its "auto" values filled from SFTConfig (`DeepSpeedConfig.load`). The JSON
asks for `torch_adam` (torch's AdamW): no C++ op to compile, and it runs on CPU and GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from components.train.config import SFTConfig


def main(argv: list[str] | None = None) -> None:
    """Entry point for one launched process: build the policy, train, rank 0 writes --result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", required=True, help="trajectory records (JSONL)")
    parser.add_argument("--policy-config", required=True, help="PolicyConfig as JSON")
    parser.add_argument("--sft-config", required=True, help="SFTConfig as JSON (with deepspeed)")
    parser.add_argument("--result", default="", help="rank 0 writes the SFTResult here (JSON)")
    args = parser.parse_args(argv)

    import dataclasses

    import torch.distributed as dist

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy
    from components.train.sft import train_sft
    from components.typed_config import config_from_dict

    policy_config = config_from_dict(PolicyConfig, json.loads(Path(args.policy_config).read_text()))
    config = SFTConfig(**json.loads(Path(args.sft_config).read_text()))
    if config.deepspeed is None:
        raise SystemExit("--sft-config must set 'deepspeed' (e.g. {\"zero_stage\": 2})")
    lines = Path(args.records).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    model, tokenizer = build_policy(policy_config, records)
    try:
        result = train_sft(model, tokenizer, records, config)
    except ValueError as exc:  # no example with an assistant token
        raise SystemExit(str(exc)) from None
    if dist.get_rank() == 0 and args.result:
        Path(args.result).write_text(json.dumps(dataclasses.asdict(result), indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
