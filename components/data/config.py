"""Typed settings for the data stages: one model per component, each field with its help text.

Values are checked here, where they are defined, so a bad config fails when it is loaded
rather than halfway through a run. `load_config(path)` reads a YAML file with the sections
`ingest`, `validate` and `versioning`; every key is optional.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FORMATS = ("auto", "mission", "openai", "miniswe", "rollout")

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


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class IngestConfig(_Config):
    format: Literal["auto", "mission", "openai", "miniswe", "rollout"] = Field(
        "auto", description="input format; auto detects it per record from its keys"
    )
    out_dir: str = Field("data/ingested", description="folder for shards, manifest, quarantine")
    rows_per_shard: int = Field(
        50_000, ge=1, description="trajectories per Parquet shard (steps follow their shard)"
    )
    max_record_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="a JSON line or file larger than this is quarantined unread",
    )
    default_source: str = Field(
        "", description="source name for records that carry none ('' = the format's name)"
    )


class ValidationConfig(_Config):
    in_dir: str = Field("data/ingested", description="ingested dataset to validate")
    out_dir: str = Field("data/validated", description="folder for the validated dataset")
    report_dir: str = Field(
        "reports/data_validation",
        description="report.json and Great Expectations data docs (HTML) go here",
    )
    max_failure_rate: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="the stage fails when quarantined / ingested exceeds this share",
    )
    secret_policy: Literal["redact", "reject"] = Field(
        "redact",
        description="redact: replace API keys with [REDACTED:<kind>]; reject: quarantine",
    )
    secret_patterns: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SECRET_PATTERNS),
        description="name -> regular expression of a credential that must not be stored",
    )
    reward_min: float = Field(-3.0, description="lowest valid total reward (sum of penalties)")
    reward_max: float = Field(1.0, description="highest valid total reward")
    reward_term_min: float = Field(-1.0, description="lowest valid value of one reward term")
    reward_term_max: float = Field(1.0, description="highest valid value of one reward term")
    min_steps: int = Field(2, ge=1, description="fewest events in a trajectory")
    max_steps: int = Field(1000, ge=1, description="most events in a trajectory")
    max_task_chars: int = Field(100_000, ge=1, description="longest task instruction")
    max_observation_chars: int = Field(
        100_000, ge=1, description="longest single observation (oversized ones are rejected)"
    )
    max_content_chars: int = Field(100_000, ge=1, description="longest user/assistant text")
    id_pattern: str = Field(
        r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]*$",
        description="regular expression every trajectory and task id must match",
    )
    eval_splits: list[str] = Field(
        default_factory=lambda: ["val", "test"],
        description="task splits whose tasks must never appear in training data",
    )
    eval_task_root: str | None = Field(
        None, description="task folder; tasks in eval_splits found there are contamination"
    )
    eval_task_ids: list[str] = Field(
        default_factory=list, description="extra task ids that must not appear (eval sets)"
    )

    @field_validator("secret_patterns", "id_pattern")
    @classmethod
    def _compiles(cls, value):
        for pattern in value.values() if isinstance(value, dict) else [value]:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"invalid regular expression {pattern!r}: {e}") from e
        return value

    @model_validator(mode="after")
    def _ranges(self):
        if self.reward_min > self.reward_max:
            raise ValueError("reward_min must be <= reward_max")
        if self.reward_term_min > self.reward_term_max:
            raise ValueError("reward_term_min must be <= reward_term_max")
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must be <= max_steps")
        return self


class S3RemoteConfig(_Config):
    url: str = Field(description="s3://bucket/prefix of the DVC remote")
    endpointurl: str | None = Field(
        None, description="S3-compatible endpoint (MinIO, Ceph...); None = AWS"
    )
    region: str | None = Field(None, description="bucket region, if the endpoint needs one")
    # Credentials are deliberately absent: DVC reads AWS_ACCESS_KEY_ID /
    # AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (or a profile) from the environment.
    profile: str | None = Field(None, description="AWS profile name from ~/.aws (optional)")

    @field_validator("url")
    @classmethod
    def _is_s3(cls, value: str) -> str:
        if not value.startswith("s3://"):
            raise ValueError(f"S3 remote url must start with s3://, got {value!r}")
        return value


class VersioningConfig(_Config):
    repo_root: str = Field(".", description="git repository holding data.dvc and .dvc/")
    data_dir: str = Field("data", description="folder tracked by data.dvc (relative to root)")
    version_log: str = Field(
        "data-versions.jsonl",
        description="git-tracked log of snapshots: id, date, counts, sources, file hashes",
    )
    remote_name: str = Field("local", description="DVC remote used by snapshot and rollback")
    local_remote: str = Field(
        ".dvc-remote",
        description="folder of the default local remote (relative paths: to repo_root)",
    )
    s3: S3RemoteConfig | None = Field(
        None, description="use this S3-compatible remote instead of the local folder"
    )

    @field_validator("remote_name")
    @classmethod
    def _remote_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
            raise ValueError(f"remote_name must be letters, digits, - or _, got {value!r}")
        return value


class DataConfig(_Config):
    ingest: IngestConfig = Field(default_factory=IngestConfig, description="ingest stage")
    validate_: ValidationConfig = Field(
        default_factory=ValidationConfig, alias="validate", description="validate stage"
    )
    versioning: VersioningConfig = Field(
        default_factory=VersioningConfig, description="DVC snapshots and rollback"
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def load_config(path: str | Path | None) -> DataConfig:
    """Read a YAML config (sections ingest / validate / versioning); None gives defaults."""
    if path is None:
        return DataConfig()
    import yaml

    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: top level must be a mapping")
    return DataConfig.model_validate(raw)
