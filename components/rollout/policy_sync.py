"""Policy sync: after each update, make the inference server serve the new weights by name.

The trainer writes each policy version to a folder the server can read (a shared volume in
a cluster; the same path on both sides) and calls `PolicySync.sync(name, folder)`:
- LoRA ("lora"): vLLM's runtime adapter endpoint, `POST /v1/load_lora_adapter
  {lora_name, lora_path, load_inplace: true}` (vLLM needs `--enable-lora`,
  `--max-lora-rank` >= r and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); requests then name
  the version as their `model`. Versions no longer sampled are unloaded
  (`/v1/unload_lora_adapter`), so the server's adapter slots (`--max-loras`) never fill up.
- Full weights ("full"): `POST /update_weights_from_disk {model_path, weight_version}`
  (SGLang's endpoint, implemented by `agentrl serve`; vLLM has no stable HTTP endpoint
  for it, see components/serve/versions.py and docs/scale-out.md); the served name becomes
  the version. A server without it (vLLM: a 404) stops the run at once with a one-line
  PolicySyncError saying to train with LoRA; retrying cannot help.

Several replicas behind one Service (vLLM's Deployment with replicas > 1): each must load
the version, or a request balanced to one that did not would fail. `sync_url` names a
host that resolves to every replica (a headless Service); the sync goes to each address.

A sync is done when every replica lists the name (`GET /v1/models`). A failed sync leaves the
server on the old version (the servers load atomically); it is retried `retries` times
with exponential backoff, then `PolicySyncError` stops the run with a one-line message.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from components.rollout.config import RolloutConfig


class PolicySyncError(RuntimeError):
    """The server could not be made to serve a policy version: the run must stop."""


def version_name(prefix: str, version: int) -> str:
    """The served name of policy version `version` (the weights after that many updates)."""
    return f"{prefix}-v{version}"


def version_dir(output_dir: str | Path, version: int) -> Path:
    """Where a training run writes policy version `version` for the server to load."""
    return Path(output_dir) / "versions" / f"v{version:06d}"


def version_number(name: str) -> int | None:
    """The version in a `version_name`, or None for a name that is not one (in-process
    sampling records "")."""
    head, sep, tail = name.rpartition("-v")
    return int(tail) if sep and head and tail.isdigit() else None


@dataclass
class PolicySync:
    """The trainer's side of the sync, against an OpenAI-compatible server at `base_url` (…/v1)."""

    base_url: str
    mode: Literal["lora", "full"]
    retries: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 600.0
    sync_url: str = ""  # a host resolving to every replica; "" = base_url

    def __post_init__(self) -> None:
        if self.mode not in ("lora", "full"):
            raise ValueError(f"PolicySync.mode: unknown {self.mode!r}")

    def replicas(self) -> list[str]:
        return replica_urls(self.sync_url or self.base_url)

    def sync(self, name: str, folder: str | Path) -> None:
        """Serve the weights in `folder` as `name` on every replica; PolicySyncError after
        retries + 1 tries."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                for url in self.replicas():
                    self._load(url, name, str(Path(folder).resolve()))
                if name in self.served():
                    return
                last = f"a replica does not list {name} after loading it"
            except PolicySyncError:
                raise  # no retry changes what the server implements
            except (httpx.HTTPError, RuntimeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        last = " ".join(last.split())[:300]
        raise PolicySyncError(
            f"policy sync failed: the server at {self.base_url} did not take version {name} "
            f"from {folder} in {self.retries + 1} tries; last error: {last}"
        )

    def _load(self, base_url: str, name: str, folder: str) -> None:
        if self.mode == "lora":
            url = f"{base_url.rstrip('/')}/load_lora_adapter"
            payload = {"lora_name": name, "lora_path": folder, "load_inplace": True}
        else:
            url = f"{_root(base_url)}/update_weights_from_disk"
            payload = {"model_path": folder, "weight_version": name}
        response = httpx.post(url, json=payload, timeout=self.timeout_s)
        if self.mode == "full" and response.status_code == 404:
            raise PolicySyncError(
                f"policy sync failed: the server at {base_url} has no full-weight reload "
                f"(POST /update_weights_from_disk: HTTP 404). vLLM has no stable endpoint for "
                f"one: train with LoRA (policy.lora) to sample on vLLM; `agentrl serve` needs "
                f"--allow-runtime-updates"
            )
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")

    def unload(self, name: str) -> None:
        """Unload adapter `name` (LoRA); one that is not loaded is fine."""
        if self.mode != "lora":
            return
        for url in self.replicas():
            response = httpx.post(f"{url.rstrip('/')}/unload_lora_adapter",
                                  json={"lora_name": name}, timeout=self.timeout_s)  # fmt: skip
            if response.status_code not in (200, 404):
                raise PolicySyncError(f"unloading {name} failed: HTTP {response.status_code}")

    def served(self) -> list[str]:
        """The names every replica serves (in the first one's order)."""
        listed = []
        for url in self.replicas():
            response = httpx.get(f"{url.rstrip('/')}/models", timeout=30)
            response.raise_for_status()
            listed.append([m["id"] for m in response.json()["data"]])
        return [n for n in listed[0] if all(n in other for other in listed[1:])]


def replica_urls(url: str) -> list[str]:
    """`url` once per IPv4 address its host resolves to (a headless Service: one per pod);
    `url` itself when it resolves to one address or none."""
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, socket.AF_INET,
                                   socket.SOCK_STREAM)  # fmt: skip
    except OSError:
        return [url]
    addresses = sorted({info[4][0] for info in infos})
    if len(addresses) <= 1:
        return [url]
    netloc = [f"{a}:{parts.port}" if parts.port else a for a in addresses]
    return [urlunsplit((parts.scheme, n, parts.path, parts.query, "")) for n in netloc]


def _root(base_url: str) -> str:
    """The server root of an OpenAI base URL (…/v1 -> …)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def serve_checkpoint(
    config: RolloutConfig, policy_dir: str | Path, name: str = ""
) -> RolloutConfig:
    """Make the server at config.base_url serve the saved policy `policy_dir` (an adapter
    folder as a LoRA adapter on the server's base, else its full weights) as `name`
    (default: the folder's name), and return `config` with `model` set to that name: what
    a sampling stage outside GRPO (`agentrl rollout sample`, for RS and DPO) samples with."""
    from components.policy.lora import is_adapter_dir

    name = name or Path(policy_dir).resolve().name
    mode = "lora" if is_adapter_dir(policy_dir) else "full"
    sync = PolicySync(config.base_url, mode, retries=config.sync_retries,
                      timeout_s=config.sync_timeout_s, sync_url=config.sync_url)  # fmt: skip
    sync.sync(name, policy_dir)
    return dataclasses.replace(config, model=name)
