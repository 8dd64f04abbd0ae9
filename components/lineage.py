"""Fingerprints of what a run produced, so a rerun can say where it first differs.

`weights_sha256` hashes a checkpoint's tensors (names, dtypes, shapes, bytes, in name
order) rather than its files: two saves of the same weights may differ in file metadata,
two different models never share a hash. `results_digest` hashes an evaluation's per-task
outcomes (success, reward, steps), the part of its metrics that load cannot change.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def weights_sha256(checkpoint_dir: str | Path) -> str:
    """sha256 over every tensor of the checkpoint's *.safetensors files."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint_dir}: no *.safetensors weights")
    digest = hashlib.sha256()
    tensors = {}
    for path in files:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = (path, name)
    for name in sorted(tensors):
        path, _ = tensors[name]
        with safe_open(str(path), framework="np") as f:
            array = f.get_tensor(name)
        digest.update(f"{name}|{array.dtype}|{list(array.shape)}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def results_digest(results_json: str | Path) -> str:
    """sha256 of the per-task outcomes of an evaluation's results.json (write_results)."""
    rows = json.loads(Path(results_json).read_text())["results"]
    outcomes = sorted(
        (r["task_id"], r["episode_id"], r["status"], r["success"], r["reward"], r["steps"])
        for r in rows
    )
    return hashlib.sha256(json.dumps(outcomes).encode()).hexdigest()
