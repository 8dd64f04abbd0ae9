"""Resumable state of a GRPO run on disk: checkpoints and the metrics file.

A checkpoint (output_dir/checkpoints/iter-NNNNNN/) holds the weights (save_pretrained; LoRA:
the adapters), the optimizer state (`optimizer.pt`), each rank's torch / CUDA / python /
numpy RNG states (`rng-rankR.pt`) and a `state.json` (iteration, data position, config
hash). Under DeepSpeed the weights and optimizer are the engine's own checkpoint (tag
`zero`: each rank's ZeRO partitions), so a run resumes on the same number of ranks. It is written to a temporary folder and renamed into place,
`state.json` last, so a kill leaves the previous checkpoint intact and a folder without
`state.json` never counts. The metrics file (one JSON row per iteration) is rewritten whole
and renamed into place too; on resume the rows logged after the checkpoint are dropped,
because the resumed run replays those iterations.

With sampling on an inference server, each policy version is also written on its own
(output_dir/versions/vNNNNNN/: the adapters, or the full weights) for the server to load;
the ones a resumed run may still sample with (max_staleness back from the latest
checkpoint) are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from components.rollout.policy_sync import Probe, version_dir
from components.train.parallel import barrier


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest iteration (temporary folders never count)."""
    root = checkpoint_root(output_dir)
    done = sorted(p for p in root.glob("iter-*") if (p / "state.json").is_file())
    return done[-1] if done else None


def save_checkpoint(stepper, output_dir: str | Path, state: dict, keep: int) -> Path:
    """Write weights, optimizer, RNG and `state` to a temporary folder, then rename it; keep
    the `keep` most recent checkpoints. Under torchrun every rank enters: each writes its
    RNG state (and, under DeepSpeed, its ZeRO shards); rank 0 writes the rest and renames."""
    root = checkpoint_root(output_dir)
    final = root / f"iter-{state['iteration']:06d}"
    tmp = root / f".tmp-{final.name}"
    if stepper.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a run killed while writing (one writer)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    barrier()
    if stepper.engine is not None:  # a collective: model and optimizer shards per rank
        stepper.engine.save_checkpoint(str(tmp), tag="zero", save_latest=False)
    elif stepper.rank == 0:
        stepper.model.save_pretrained(tmp)
        torch.save({"optimizer": stepper.optimizer.state_dict()}, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / f"rng-rank{stepper.rank}.pt")
    barrier()
    if stepper.rank == 0:
        # state.json last: its presence marks the folder complete.
        (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        if final.exists():  # a rerun of the same iteration after a resume replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        kept = sorted(p for p in root.glob("iter-*") if (p / "state.json").is_file())
        for old in kept[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def load_checkpoint(path: Path, stepper) -> dict:
    """Restore weights (LoRA: the adapters), optimizer and this rank's RNG in place; returns
    the saved state."""
    from transformers import AutoModelForCausalLM

    from components.policy.lora import is_adapter_model, load_adapter_weights

    model = stepper.model
    if stepper.engine is not None:
        stepper.engine.load_checkpoint(str(path), tag="zero", load_module_strict=True,
                                       load_lr_scheduler_states=False)  # fmt: skip
    elif is_adapter_model(model):
        load_adapter_weights(model, path)
    else:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=next(model.parameters()).dtype
        )
        model.load_state_dict(loaded.state_dict())
    if stepper.engine is None:
        saved = torch.load(path / "optimizer.pt", weights_only=False)  # our own file
        stepper.optimizer.load_state_dict(saved["optimizer"])
    set_rng_state(torch.load(path / f"rng-rank{stepper.rank}.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())


def restore(output_dir: str | Path, stepper, config_hash: str, resume: bool) -> dict:
    """The state to continue from: the latest checkpoint's (restored into the stepper's
    model and optimizer), or iteration 0 at data position 0. `resume=False` deletes old
    checkpoints; a checkpoint written with another config hash is an error."""
    checkpoint = latest_checkpoint(output_dir) if resume else None
    if checkpoint is None:
        if not resume and stepper.rank == 0:
            shutil.rmtree(checkpoint_root(output_dir), ignore_errors=True)
        barrier()
        return {"iteration": 0, "data_position": 0, "checkpoint": None}
    state = json.loads((checkpoint / "state.json").read_text())
    if state["config_hash"] != config_hash:
        raise ValueError(
            f"{checkpoint}: written by a run with other settings (config hash "
            f"{state['config_hash']} != {config_hash}); use another output_dir or resume=False"
        )
    load_checkpoint(checkpoint, stepper)
    return {**state, "checkpoint": checkpoint}


def read_metrics(path: Path, up_to: int) -> list[dict]:
    """The rows of iterations <= `up_to` (later ones are replayed by a resumed run)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["iteration"] <= up_to]


def write_metrics(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Policy versions for an inference server (served sampling: grpo/recipe.py, rollout/policy_sync.py)


def save_version(stepper, output_dir: str | Path, version: int,
                 probe_ids: list[int] | None = None) -> Path:  # fmt: skip
    """Write the policy's weights as version `version` for the server to load: the LoRA
    adapters alone (PEFT's files) or the full weights (a checkpoint without tokenizer),
    and with `probe_ids` (a prompt) the version's `Probe`, its own next-token log-probs
    after that prompt, which the sampler checks the server against (rollout/policy_sync.py).
    Written to a temporary folder and renamed into place, so the server never reads a
    half-written version; a version written before (a resumed run replays it) is replaced.
    Under torchrun every rank enters (ZeRO-3 gathers the weights); rank 0 writes."""
    final = version_dir(output_dir, version)
    tmp = final.with_name(f".tmp-{final.name}")
    if stepper.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    with stepper.gathered():
        if stepper.rank == 0:
            stepper.model.save_pretrained(tmp)
            if probe_ids is not None:
                version_probe(stepper.model, probe_ids).write(tmp)
    if stepper.rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    barrier()
    return final


def version_probe(model, prompt_ids: list[int]) -> Probe:
    """`model`'s next-token log-probs after `prompt_ids` at T = 1, in eval mode (no dropout,
    no random draw: the run's RNG streams are untouched), its mode restored after."""
    training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt_ids], device=device)).logits
        logprobs = torch.log_softmax(logits[0, -1].float(), dim=-1)  # [V]
    finally:
        model.train(training)
    return Probe(list(prompt_ids), logprobs.cpu().tolist())


def prune_versions(output_dir: str | Path, keep_from: int) -> None:
    """Delete the versions older than `keep_from` (none a resumed run can still sample with)."""
    for path in (Path(output_dir) / "versions").glob("v*"):
        if path.name[1:].isdigit() and int(path.name[1:]) < keep_from:
            shutil.rmtree(path, ignore_errors=True)
