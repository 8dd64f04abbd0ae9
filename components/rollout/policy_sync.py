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

Listing a name proves the server *took* a load request, not that it samples the new
weights (a server that accepts the request and keeps the old adapter, a stale replica, a
path mixed up on a shared volume). So GRPO also checks what the server computes
(`verify`): next to each version the trainer writes a `Probe`, its own next-token
log-probs (T = 1, over the whole vocabulary) on a fixed short prompt; after the sync each
replica is asked for one greedy token of that prompt under the version's name with its
top `PROBE_TOP` log-probs, and the mean absolute difference to the trainer's log-probs
of those same tokens must be at most `tolerance` nats, or PolicySyncError names the
version ("the server at URL still serves other weights than NAME after loading it").

Why a log-prob probe rather than a hash of the adapter file: a hash can only be compared
with what the server *says* it loaded (a path, a name), which is what listing already
checks; the log-probs are what it will sample with. Why a tolerance, not equality: the
server may run another dtype and kernels than the trainer (`agentrl serve` on the same
float32 weights agrees to ~1e-5, tests/train/test_grpo_served.py; vLLM in bf16 beside a
float32 trainer keeps about 3 significant digits of each logit, so a few hundredths of a
nat is to be expected: an estimate, not measured here), so 0.1 nats by default
(GRPOConfig.sync_probe_tolerance; raise it if a bf16 server trips it). What
it cannot tell: two versions whose probe log-probs differ by less than about twice the
tolerance (an update too small to move the probe prompt); `separation` says how far
apart two probes are on the server's tokens, and with the previous version's probe the
error message says which one the server is nearer. By the triangle inequality, when the
previous and new probes are more than 2 * tolerance apart, a server within tolerance of
the new one is necessarily nearer to it than to the previous one.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from components.rollout.config import RolloutConfig

# Top tokens whose log-probs the probe compares (vLLM allows up to 20 by default).
PROBE_TOP = 5
# The probe prompt's text (its token ids are the trainer's tokenizer's: Probe.prompt_ids).
PROBE_TEXT = "Fix the failing test."


class PolicySyncError(RuntimeError):
    """The server could not be made to serve a policy version: the run must stop."""


def version_name(prefix: str, version: int) -> str:
    """The served name of policy version `version` (the weights after that many updates)."""
    return f"{prefix}-v{version}"


def version_dir(output_dir: str | Path, version: int) -> Path:
    """Where a training run writes policy version `version` for the server to load."""
    return Path(output_dir) / "versions" / f"v{version:06d}"


@dataclass(frozen=True)
class Probe:
    """The trainer's own log-probs of a policy version on the probe prompt: log p(t | prompt)
    at T = 1 for every token t of the vocabulary (`logprobs[t]`)."""

    prompt_ids: list[int]
    logprobs: list[float]

    def write(self, folder: str | Path) -> None:
        """As `probe.json` in the version's folder (servers ignore files they do not load)."""
        logprobs = [round(lp, 6) for lp in self.logprobs]  # 1e-6 nats: far below any tolerance
        (Path(folder) / "probe.json").write_text(
            json.dumps({"prompt_ids": self.prompt_ids, "logprobs": logprobs})
        )

    @classmethod
    def read(cls, folder: str | Path) -> Probe | None:
        """The probe written next to a version, or None for a folder without one."""
        path = Path(folder) / "probe.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(data["prompt_ids"], data["logprobs"])

    def distance(self, served: dict[int, float]) -> float:
        """Mean |served log-prob - this probe's| over the served tokens, in nats (infinite
        for a token id outside this probe's vocabulary)."""
        gaps = [abs(lp - self.logprob(t)) for t, lp in served.items()]
        return sum(gaps) / max(len(gaps), 1)

    def logprob(self, token: int) -> float:
        return self.logprobs[token] if 0 <= token < len(self.logprobs) else float("-inf")


def separation(new: Probe, previous: Probe, tokens: list[int]) -> float:
    """How far apart two versions' probes are on `tokens` (mean absolute nats): above twice
    the tolerance, `verify` tells the two versions apart."""
    gaps = [abs(new.logprob(t) - previous.logprob(t)) for t in tokens]
    return sum(gaps) / max(len(gaps), 1)


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

    def verify(self, name: str, probe: Probe, tolerance: float,
               previous: Probe | None = None) -> float:  # fmt: skip
        """Check every replica computes `probe`'s log-probs under `name` (mean absolute
        difference over its top PROBE_TOP tokens at most `tolerance` nats); returns the
        largest difference. PolicySyncError names the version when one does not; with the
        previous version's probe it says which of the two the server is nearer."""
        worst = 0.0
        for url in self.replicas():
            served = self._probe(url, name, probe.prompt_ids)
            distance = probe.distance(served)
            worst = max(worst, distance)
            if distance <= tolerance:
                continue
            nearer = ""
            if previous is not None:
                before = previous.distance(served)
                which = "the previous version's" if before < distance else "this version's"
                nearer = (f"; {before:.3f} nats from the previous version's probe, nearer "
                          f"{which}")  # fmt: skip
            raise PolicySyncError(
                f"policy sync: the server at {url} still serves other weights than {name} "
                f"after loading it: its log-probs on the probe prompt are {distance:.3f} nats "
                f"from the trainer's for that version (tolerance {tolerance}){nearer}"
            )
        return worst

    def _probe(self, url: str, name: str, prompt_ids: list[int]) -> dict[int, float]:
        """{token id: log-prob} of the server's top PROBE_TOP next tokens after `prompt_ids`
        under `name` (the sampled one alone, where the server returns no top list)."""
        payload = {"model": name, "prompt": prompt_ids, "max_tokens": 1, "temperature": 0.0,
                   "logprobs": PROBE_TOP, "return_tokens_as_token_ids": True,
                   "skip_special_tokens": False}  # fmt: skip
        try:
            response = httpx.post(f"{url.rstrip('/')}/completions", json=payload,
                                  timeout=self.timeout_s)  # fmt: skip
            response.raise_for_status()
            logprobs = response.json()["choices"][0]["logprobs"]
            top = (logprobs.get("top_logprobs") or [None])[0] or {
                logprobs["tokens"][0]: logprobs["token_logprobs"][0]
            }
            return {int(str(k).removeprefix("token_id:")): float(v) for k, v in top.items()}
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise PolicySyncError(
                f"policy sync: the server at {url} gave no log-probs for the probe of {name} "
                f"after loading it: {detail}"
            ) from exc

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
