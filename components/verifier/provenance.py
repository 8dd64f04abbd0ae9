"""Whose verdict a record carries: only this installation's verifier may say what trains.

A record's reward, reward terms and success are data like any other field: an ingested file
(an ATIF trajectory's `extra.agentrl`, a canonical record written by hand) can claim any of
them. So the episode's finish signs the verdict it computed (`sign_record`): a keyed MAC,
hmac-sha256, over the episode id, the task id, the sha256 of the final diff, the reward, its
terms, success, the verifier version (components/verifier/version.py) and the sha256 of the
transcript the trainers read (the events, and `input_ids` / `assistant_mask` when present),
written to `metadata.verdict_mac`. Every trainer's data loading (rejection sampling, DPO's
pairs, GRPO's advantages) asks `unverified_reason`; a record it names a reason for is
excluded from selection, ranking, pairs and advantages, counted and logged with that reason
(`split_verified`), never silently dropped. The reasons: its verdict is only claimed (a
foreign record, `CLAIMED_FIELDS`), it carries no MAC, the MAC does not match (a field it
covers was changed, or another installation signed it), or it was judged by another
verifier version than the current one (`agentrl rescore` judges it again and re-signs).

The key: 32 random bytes in `<state dir>/verdict-mac.key`, created once per installation
with mode 0600 in a 0700 folder; the state dir is $AGENTRL_STATE_DIR, else
$XDG_STATE_HOME/agentrl, else ~/.local/state/agentrl. Neither is ever in a record. A key path
that a sandboxed command could see (the system folders, the interpreter's, the harness
plugins', an episode workspace) is refused: the agent's code runs as the
same user, so the file mode alone would not keep the key from it; the sandbox's view does.
Where no key can be made (a read-only home), episodes stay unsigned, with a warning: they
evaluate as before and never train. Processes that write and read records for training
(a rollout stage and a trainer in two pods) need the same key: point AGENTRL_STATE_DIR at
one mounted secret folder.

What this does not protect against: anything that runs as this user outside the sandbox
(it can read the key), and a verdict the verifier itself got wrong (rescoring's job).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from components.sandbox.bubblewrap import SYSTEM_PATHS, interpreter_dirs
from components.sandbox.environ import HARNESS_PLUGINS
from components.verifier.version import verifier_version

STATE_DIR_ENV = "AGENTRL_STATE_DIR"
KEY_FILE = "verdict-mac.key"
MAC_FIELD = "verdict_mac"  # in the record's metadata
MAC_PREFIX = "hmac-sha256:"
# Where a foreign record's verdict is kept: what it claims, never what trains.
CLAIMED_FIELDS = ("claimed_reward", "claimed_reward_terms", "claimed_success")
WORKSPACE_PREFIX = "agentrl-ws-"  # components/sandbox/workspace.py's episode workspaces
# Top-level fields a trainer tokenizes verbatim besides the events (components/train/data.py).
_TOKEN_FIELDS = ("input_ids", "assistant_mask")

log = logging.getLogger(__name__)


def canonical_json(obj) -> str:
    """Key-sorted, compact JSON (the same bytes as components/data/schema.py's)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ProvenanceError(RuntimeError):
    """The verdict key cannot be read or made; the message says where and why (one line)."""


def state_dir() -> Path:
    """The installation's state folder (see the module docstring)."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "agentrl"


def _sandbox_visible(path: Path) -> str | None:
    """The sandbox-visible folder `path` lies under, or None."""
    real = os.path.realpath(path)
    workspace = next((p for p in Path(real).parents if p.name.startswith(WORKSPACE_PREFIX)), None)
    if workspace is not None:
        return str(workspace)
    for folder in (*SYSTEM_PATHS, *interpreter_dirs(), str(HARNESS_PLUGINS)):
        top = os.path.realpath(folder)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return folder
    return None


def key_path() -> Path:
    path = state_dir() / KEY_FILE
    visible = _sandbox_visible(path)
    if visible is not None:
        raise ProvenanceError(
            f"verdict key {path}: under {visible}, which sandboxed commands can read; "
            f"set {STATE_DIR_ENV} to a folder outside it"
        )
    return path


def verdict_key() -> bytes:
    """This installation's MAC key, made on first use (raises ProvenanceError)."""
    return _key_at(str(key_path()))


@lru_cache(maxsize=8)
def _key_at(where: str) -> bytes:
    path = Path(where)
    try:
        if not path.exists():
            _create_key(path)
        return _read_key(path)
    except OSError as e:
        raise ProvenanceError(f"verdict key {path}: {e.strerror or e}") from e


def _create_key(path: Path) -> None:
    """Write a fresh key beside `path` and link it into place: two processes racing here
    both end up reading the one that won, never a half-written file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".verdict-key-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def _read_key(path: Path) -> bytes:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        raise ProvenanceError(f"verdict key {path}: not a regular file owned by this user")
    if info.st_mode & 0o077:
        raise ProvenanceError(f"verdict key {path}: readable by others (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); chmod 600 it")  # fmt: skip
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise ProvenanceError(f"verdict key {path}: shorter than 32 bytes")
    return key


def _sha256(text: str | None) -> str | None:
    return (
        None if text is None else hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    )


def _number(value):
    # 1 and 1.0 are the same reward (a Parquet round trip makes every reward a float).
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def transcript_sha256(record: dict) -> str:
    """sha256 of what a trainer reads of the record: its events (keys set to null dropped:
    the canonical schema fills those in on ingestion) and any verbatim token fields."""
    events = [
        {k: v for k, v in e.items() if v is not None} if isinstance(e, dict) else e
        for e in record.get("trajectory") or []
    ]
    tokens = {k: record.get(k) for k in _TOKEN_FIELDS if record.get(k) is not None}
    return _sha256(canonical_json({"events": events, **tokens})) or ""


def signed_message(record: dict, version: str) -> bytes:
    """The bytes the MAC covers: the record's verdict and what it is a verdict on."""
    meta = record.get("metadata") or {}
    terms = record.get("reward_terms") or {}
    diff = record.get("final_diff")
    fields = {
        "episode": record.get("id"),
        "task": record.get("task_id"),
        "final_diff_sha256": _sha256(diff) if isinstance(diff, str) else None,
        "reward": _number(record.get("reward")),
        "reward_terms": {str(k): _number(v) for k, v in terms.items()}
        if isinstance(terms, dict)
        else terms,
        "success": meta.get("success"),
        "verifier_version": version,
        "transcript_sha256": transcript_sha256(record),
    }
    return canonical_json(fields).encode("utf-8", "surrogatepass")


def verdict_mac(record: dict, version: str, key: bytes) -> str:
    return MAC_PREFIX + hmac.new(key, signed_message(record, version), hashlib.sha256).hexdigest()


def sign_record(record: dict) -> bool:
    """Sign `record`'s verdict in place under its `metadata.verifier_version` (the episode's
    finish and a rescore call this once the verdict is final). Returns False, with a
    warning, where no key can be had: the record then never trains."""
    meta = record.setdefault("metadata", {})
    meta.pop(MAC_FIELD, None)
    try:
        key = verdict_key()
    except ProvenanceError as e:
        _warn_unsigned(str(e))
        return False
    meta[MAC_FIELD] = verdict_mac(record, str(meta.get("verifier_version") or ""), key)
    return True


@lru_cache(maxsize=1)
def _warn_unsigned(why: str) -> None:
    log.warning("episode verdicts are left unsigned and will not train: %s", why)


def claims(record: dict) -> list[str]:
    """The claimed-verdict fields a record carries (a foreign record's)."""
    return [k for k in CLAIMED_FIELDS if k in record]


def is_signed_by_us(record: dict) -> bool:
    """Its MAC matches under the version it names: a verdict this installation gave,
    current or not."""
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    mac = meta.get(MAC_FIELD)
    if not isinstance(mac, str) or not mac.startswith(MAC_PREFIX):
        return False
    try:
        key = verdict_key()
    except ProvenanceError:
        return False
    expected = verdict_mac(record, str(meta.get("verifier_version") or ""), key)
    return hmac.compare_digest(mac, expected)


def unverified_reason(record: dict, current: str | None = None) -> str | None:
    """Why a trainer must not use this record's verdict; None when it may: signed by this
    installation under the current verifier version (`current`, default this process's)."""
    claimed = claims(record)
    if claimed:
        return f"foreign: its verdict is only claimed ({', '.join(claimed)})"
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    if not meta.get(MAC_FIELD):
        return "unsigned: no verdict MAC (not judged by this pipeline's verifier)"
    if not is_signed_by_us(record):
        return "bad verdict MAC: a signed field was changed, or another key signed it"
    version, current = meta.get("verifier_version"), current or verifier_version()
    if version != current:
        return f"judged by verifier {version}, not the current {current}: rescore it"
    return None


def split_verified(records: Iterable[dict], trainer: str) -> tuple[list[dict], list[dict]]:
    """(records a trainer may use, quarantined [{"id", "task_id", "reason"}]), in input
    order; the quarantine is logged with a count per reason."""
    current = verifier_version()
    kept: list[dict] = []
    quarantined: list[dict] = []
    for record in records:
        reason = unverified_reason(record, current)
        if reason is None:
            kept.append(record)
        else:
            quarantined.append({"id": record.get("id"), "task_id": record.get("task_id"),
                                "reason": reason})  # fmt: skip
    log_quarantine(quarantined, trainer)
    return kept, quarantined


def log_quarantine(quarantined: list[dict], trainer: str) -> None:
    if not quarantined:
        return
    counts = Counter(q["reason"].split(":")[0] for q in quarantined)
    log.warning("%s: %d record(s) quarantined as unverified (%s); first: %s: %s", trainer,
                len(quarantined), ", ".join(f"{k} {n}" for k, n in sorted(counts.items())),
                quarantined[0]["id"], quarantined[0]["reason"])  # fmt: skip


def as_claimed(record: dict) -> dict:
    """A foreign record's verdict moved to CLAIMED_FIELDS: reward None, no terms, no
    success; what it claimed is kept, never used. Returns `record`, changed in place."""
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    record["claimed_reward"] = record.get("reward")
    record["claimed_reward_terms"] = record.get("reward_terms") or {}
    record["claimed_success"] = meta.pop("success", None)
    meta.pop(MAC_FIELD, None)
    record["reward"], record["reward_terms"] = None, {}
    return record
