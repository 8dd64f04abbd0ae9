"""Typed settings for the data stages: one frozen dataclass per component, each field with
its help text (components/typed_config.py says why dataclasses).

Values are checked here, in `__post_init__`, so a bad config fails when it is loaded rather
than halfway through a run. A preset's `data` section holds the sections `ingest`,
`validate` and `versioning` (`DataConfig`); every key is optional and unknown keys are
errors. The records themselves are checked by schema.py (pydantic: untrusted input).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from components.typed_config import config_from_dict, doc

FORMATS = ("auto", "mission", "openai", "miniswe", "rollout", "atif")
SECRET_POLICIES = ("redact", "reject")

# A pattern may start with BOUNDARY ("not preceded by a word character"). Detection (GX,
# pandas) runs the patterns as written, which RE2 can execute natively: no look-around, no
# \b or \s, which make pandas fall back to slow Python regexes on Arrow strings. Redaction
# (Python `re`) turns a leading BOUNDARY into a look-behind so only the secret is replaced.
BOUNDARY = r"(?:^|[^A-Za-z0-9_])"

# Common credential shapes.
DEFAULT_SECRET_PATTERNS: dict[str, str] = {
    "openai_key": BOUNDARY + r"sk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_\-]{20,}",
    "aws_access_key_id": BOUNDARY + r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    "github_token": BOUNDARY + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "slack_token": BOUNDARY + r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    "google_api_key": BOUNDARY + r"AIza[0-9A-Za-z_\-]{35}",
    # The whole block when its END line is there, else at least the header.
    "private_key_block": (
        r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"
        r"(?:(?:.|\n)*?-----END (?:[A-Z]+ )*PRIVATE KEY-----)?"
    ),
}


def _one_of(config, name: str, allowed: tuple) -> None:
    value = getattr(config, name)
    if value not in allowed:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {allowed}, got {value!r}")


def _positive(config, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be >= 1")


def _not_negative(config, *names: str) -> None:
    for name in names:
        if not getattr(config, name) >= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be >= 0")


def _compiles(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regular expression {pattern!r}: {e}") from e


@dataclass(frozen=True)
class IngestConfig:
    """`agentrl data ingest`: how input files become Parquet shards."""

    format: Literal["auto", "mission", "openai", "miniswe", "rollout"] = field(
        default="auto", metadata=doc("input format; auto detects it per record from its keys")
    )
    out_dir: str = field(
        default="data/ingested", metadata=doc("folder for shards, manifest, quarantine")
    )
    rows_per_shard: int = field(
        default=50_000, metadata=doc("trajectories per Parquet shard (steps follow their shard)")
    )
    max_record_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=doc("a JSON line or file larger than this is quarantined unread"),
    )
    default_source: str = field(
        default="", metadata=doc("source name for records that carry none ('' = the format's name)")
    )
    max_depth: int = field(
        default=100,
        metadata=doc("a record nested deeper than this (objects/arrays) is quarantined"),
    )
    lock_timeout_s: float = field(
        default=600.0,
        metadata=doc("how long to wait for another writer of the output folder, in seconds"),
    )
    workers: int = field(
        default=2,
        metadata=doc("processes that decode and check a large JSON-lines file (1 = this one)"),
    )
    parallel_min_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata=doc("a JSON-lines file at least this large is read by `workers` processes"),
    )

    def __post_init__(self) -> None:
        _one_of(self, "format", FORMATS)
        _positive(self, "rows_per_shard", "max_record_bytes", "max_depth", "workers")
        _positive(self, "parallel_min_bytes")
        _not_negative(self, "lock_timeout_s")


@dataclass(frozen=True)
class ValidationConfig:
    """`agentrl data validate`: the Great Expectations rules and the quarantine threshold."""

    in_dir: str = field(default="data/ingested", metadata=doc("ingested dataset to validate"))
    out_dir: str = field(default="data/validated", metadata=doc("folder for the validated dataset"))
    report_dir: str = field(
        default="reports/data_validation",
        metadata=doc("report.json and Great Expectations data docs (HTML) go here"),
    )
    max_failure_rate: float = field(
        default=0.05,
        metadata=doc("the stage fails when quarantined / ingested exceeds this share"),
    )
    secret_policy: Literal["redact", "reject"] = field(
        default="redact",
        metadata=doc("redact: replace API keys with [REDACTED:<kind>]; reject: quarantine"),
    )
    secret_patterns: dict[str, str] = field(
        default_factory=lambda: dict(DEFAULT_SECRET_PATTERNS),
        metadata=doc("name -> regular expression of a credential that must not be stored"),
    )
    reward_min: float = field(
        default=-3.0, metadata=doc("lowest valid total reward (sum of penalties)")
    )
    reward_max: float = field(default=1.0, metadata=doc("highest valid total reward"))
    reward_term_min: float = field(
        default=-1.0, metadata=doc("lowest valid value of one reward term")
    )
    reward_term_max: float = field(
        default=1.0, metadata=doc("highest valid value of one reward term")
    )
    min_steps: int = field(default=2, metadata=doc("fewest events in a trajectory"))
    max_steps: int = field(default=1000, metadata=doc("most events in a trajectory"))
    max_task_chars: int = field(default=100_000, metadata=doc("longest task instruction"))
    max_observation_chars: int = field(
        default=100_000, metadata=doc("longest single observation (oversized ones are rejected)")
    )
    max_content_chars: int = field(default=100_000, metadata=doc("longest user/assistant text"))
    id_pattern: str = field(
        default=r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]*$",
        metadata=doc("regular expression every trajectory and task id must match"),
    )
    eval_splits: tuple[str, ...] = field(
        default=("val", "test"),
        metadata=doc("task splits whose tasks must never appear in training data"),
    )
    eval_task_root: str | None = field(
        default=None,
        metadata=doc("task folder; tasks in eval_splits found there are contamination"),
    )
    eval_task_ids: tuple[str, ...] = field(
        default=(), metadata=doc("extra task ids that must not appear (eval sets)")
    )
    lock_timeout_s: float = field(
        default=600.0,
        metadata=doc("how long to wait for a writer of the input or output folder, in seconds"),
    )

    def __post_init__(self) -> None:
        _not_negative(self, "lock_timeout_s")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(
                f"ValidationConfig.max_failure_rate must be in [0, 1], got {self.max_failure_rate}"
            )
        _one_of(self, "secret_policy", SECRET_POLICIES)
        _positive(self, "min_steps", "max_steps", "max_task_chars", "max_observation_chars",
                  "max_content_chars")  # fmt: skip
        for pattern in (*self.secret_patterns.values(), self.id_pattern):
            _compiles(pattern)
        if self.reward_min > self.reward_max:
            raise ValueError("reward_min must be <= reward_max")
        if self.reward_term_min > self.reward_term_max:
            raise ValueError("reward_term_min must be <= reward_term_max")
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must be <= max_steps")


@dataclass(frozen=True)
class S3RemoteConfig:
    """An S3-compatible DVC remote (no credentials: those come from the environment)."""

    url: str = field(metadata=doc("s3://bucket/prefix of the DVC remote"))
    endpointurl: str | None = field(
        default=None, metadata=doc("S3-compatible endpoint (MinIO, Ceph...); None = AWS")
    )
    region: str | None = field(
        default=None, metadata=doc("bucket region, if the endpoint needs one")
    )
    # Credentials are deliberately absent: DVC reads AWS_ACCESS_KEY_ID /
    # AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (or a profile) from the environment.
    profile: str | None = field(
        default=None, metadata=doc("AWS profile name from ~/.aws (optional)")
    )

    def __post_init__(self) -> None:
        if not self.url.startswith("s3://"):
            raise ValueError(f"S3 remote url must start with s3://, got {self.url!r}")


@dataclass(frozen=True)
class VersioningConfig:
    """`agentrl data snapshot / versions / rollback`: where DVC keeps the data versions."""

    repo_root: str = field(default=".", metadata=doc("git repository holding data.dvc and .dvc/"))
    data_dir: str = field(
        default="data", metadata=doc("folder tracked by data.dvc (relative to root)")
    )
    version_log: str = field(
        default="data-versions.jsonl",
        metadata=doc("git-tracked log of snapshots: id, date, counts, sources, file hashes"),
    )
    remote_name: str = field(
        default="local", metadata=doc("DVC remote used by snapshot and rollback")
    )
    local_remote: str = field(
        default=".dvc-remote",
        metadata=doc("folder of the default local remote (relative paths: to repo_root)"),
    )
    s3: S3RemoteConfig | None = field(
        default=None, metadata=doc("use this S3-compatible remote instead of the local folder")
    )
    lock_timeout_s: float = field(
        default=600.0,
        metadata=doc("how long snapshot / rollback wait for another writer of data/, in seconds"),
    )

    def __post_init__(self) -> None:
        _not_negative(self, "lock_timeout_s")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", self.remote_name):
            raise ValueError(
                f"remote_name must be letters, digits, - or _, got {self.remote_name!r}"
            )


@dataclass(frozen=True)
class DataConfig:
    """A preset's `data` section: one config per data stage."""

    ingest: IngestConfig = field(default_factory=IngestConfig, metadata=doc("ingest stage"))
    validate: ValidationConfig = field(
        default_factory=ValidationConfig, metadata=doc("validate stage")
    )
    versioning: VersioningConfig = field(
        default_factory=VersioningConfig, metadata=doc("DVC snapshots and rollback")
    )


def load_config(path: str | Path | None) -> DataConfig:
    """Read a YAML file with the sections ingest / validate / versioning; None gives defaults."""
    if path is None:
        return DataConfig()
    import yaml

    return config_from_dict(DataConfig, yaml.safe_load(Path(path).read_text()), str(path))
