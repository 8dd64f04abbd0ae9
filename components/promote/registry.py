"""The MLflow model registry as the promotion stage uses it: versions, lineage, aliases.

A candidate is registered as an MLflow model (components/promote/mlflow_model.py: a pyfunc
around the policy, with a signature, the checkpoint folder unchanged inside it), logged
from the run that trained it (`training_run_id`, the pipeline's training stage run), so the
version's "Source Run" is that run; a version whose training run is not in this store (a
registry on another server, a checkpoint trained elsewhere) is logged from a registration
run in the registry experiment instead. `download_version("champion")` returns the
checkpoint folder as it was saved: what every consumer loads (`load_policy`, vLLM, the
server).

Lineage travels as model-version tags (data_version, git_commit, config_hash,
training_run_id, pipeline_run_id, eval_report_uri, safety_report_uri), also on the
logged model.

Aliases: `challenger` and `champion` are reserved (client.py names them). Only approval.py
moves them (challenger by passing gates, champion by a person's approval or a rollback to an
earlier approved champion), through the audit log's decisions; `set_alias` / `delete_alias`
here refuse them, and `set_version_tags` refuses the tags that record approval state, so no
path around the approval exists in this module. The getters create nothing (no store, no
registered model): they answer a misspelt model with nothing.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from components.promote.audit import default_actor, record_decision
from components.promote.client import RESERVED_ALIASES, find_model, mlflow_client, read_client
from components.promote.config import REPO_ROOT, PromotionConfig
from components.promote.errors import UnknownModel

# Tags that carry approval state; written only by approval.py / audit.py.
RESERVED_TAG_PREFIXES = (
    "approval_",
    "gates_passed",
    "gate_checks",
    "metric.",
    "approved_",
    "rejected_",
    "rolled_back",
    "audit.",
    "champion_history",
    "previous_champion",
    "audit_",
)
LINEAGE_KEYS = (
    "data_version",
    "git_commit",
    "config_hash",
    "training_run_id",
    "pipeline_run_id",
    "eval_report_uri",
    "safety_report_uri",
    "preset",
    "sft_sha256",
    "weights_sha256",
    "eval_digest",
    "verifier_version",
)


@dataclass(frozen=True)
class Lineage:
    """Where a candidate came from; every field ends up as a model-version tag."""

    data_version: str
    config_hash: str
    training_run_id: str = ""  # the MLflow run that trained it: the version's source run
    pipeline_run_id: str = ""  # the pipeline (parent) run it came out of
    eval_report_uri: str = ""
    safety_report_uri: str = ""
    git_commit: str = ""  # '' = HEAD of this repository at registration time
    # What `agentrl reproduce` needs (flows/reproduce.py): the preset file the run read,
    # and the fingerprints of its stages (components/lineage.py).
    preset: str = ""
    sft_sha256: str = ""
    weights_sha256: str = ""
    eval_digest: str = ""
    # The verifier that judged its evaluation (components/verifier/version.py).
    verifier_version: str = ""


def current_git_commit(repo: Path = REPO_ROOT) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _registry_experiment_id(client, config: PromotionConfig) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(config.registry_experiment)
    if exp is not None:
        return exp.experiment_id
    root = config.resolved_artifact_root()
    location = None if root is None else str(Path(root) / config.registry_experiment)
    try:
        return client.create_experiment(config.registry_experiment, artifact_location=location)
    except MlflowException:  # created meanwhile by another process
        return client.get_experiment_by_name(config.registry_experiment).experiment_id


def adapter_base_tags(checkpoint_dir: Path) -> dict[str, str]:
    """For a LoRA adapter checkpoint (components/policy/lora.py's metadata file): the base
    it belongs to, so a served or promoted adapter is never paired with another base."""
    meta_file = checkpoint_dir / "agentrl_adapter.json"
    if not meta_file.is_file():
        return {}
    meta = json.loads(meta_file.read_text())
    return {"adapter": "lora", "base_path": str(meta.get("base_path", "")),
            "base_sha256": str(meta.get("base_sha256", ""))}  # fmt: skip


def register_candidate(
    checkpoint_dir: str | Path,
    lineage: Lineage,
    config: PromotionConfig | None = None,
    actor: str | None = None,
    extra_tags: dict[str, str] | None = None,
) -> str:
    """Register a checkpoint folder as a new model version; returns the version number.
    A LoRA adapter folder is registered merged into its base (`_register_merged_adapters`).

    The version has no alias: it is a candidate until request_approval sees its gates.
    """
    config = config or PromotionConfig()
    checkpoint_dir = Path(checkpoint_dir)
    if (checkpoint_dir / "agentrl_adapter.json").is_file():
        return _register_merged_adapters(checkpoint_dir, lineage, config, actor)
    if not (checkpoint_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{checkpoint_dir} is not a Hugging Face checkpoint (no config.json)"
        )
    if not any((checkpoint_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{checkpoint_dir} has no tokenizer (save_policy writes one)")
    if not lineage.data_version or not lineage.config_hash:
        raise ValueError("lineage needs data_version and config_hash: a model must be traceable")
    tags = {k: str(v) for k, v in asdict(lineage).items()}
    tags["git_commit"] = tags["git_commit"] or current_git_commit()
    tags.update(adapter_base_tags(checkpoint_dir))
    tags.update(extra_tags or {})
    client = mlflow_client(config)
    source_run = _training_run(client, lineage.training_run_id)
    if source_run is not None:
        tags["training_run_uri"] = f"runs:/{source_run.info.run_id}"
    registration_run = None
    if source_run is None:
        registration_run = client.create_run(
            _registry_experiment_id(client, config),
            run_name=f"register-{config.model_name}",
            tags={**tags, "agentrl.stage": "register", "checkpoint_dir": str(checkpoint_dir)},
        )
        source_run = registration_run
    try:
        # The reports go where the next run cannot overwrite them: the pipeline run's
        # artifacts (else the source run's); the tags name them by runs:/ URI.
        keeper = _training_run(client, lineage.pipeline_run_id) or source_run
        tags.update(keep_reports(client, keeper.info.run_id, tags))
        model = _log_policy_model(client, checkpoint_dir, source_run, tags)
    except Exception:
        if registration_run is not None:
            client.set_terminated(registration_run.info.run_id, status="FAILED")
        raise
    if registration_run is not None:
        client.set_terminated(registration_run.info.run_id)
    run = source_run
    version = client.create_model_version(
        config.model_name,
        # Its files, not models:/ID: MLflow resolves that against the process-wide store.
        # MLflow's SQL registry keeps no model_id on a version: the version names its
        # logged model in tag `model_uri`, the model its versions in its own tag.
        source=model.artifact_location,
        run_id=run.info.run_id,
        tags={**tags, "model_uri": f"models:/{model.model_id}"},
        description=f"data {lineage.data_version}, config {lineage.config_hash}",
        model_id=model.model_id,
    )
    link_logged_model(client, model.model_id, config.model_name, str(version.version))
    record_decision(
        "registered",
        version=str(version.version),
        actor=actor or default_actor(),
        reason="new candidate",
        evidence={
            "lineage": tags,
            "registration_run_id": run.info.run_id,
            "model_id": model.model_id,
            "source": version.source,
        },
        config=config,
        client=client,
    )
    return str(version.version)


def _register_merged_adapters(adapter_dir: Path, lineage: Lineage, config: PromotionConfig,
                              actor: str | None) -> str:  # fmt: skip
    """A LoRA candidate is registered as its adapters folded into the base (what `agentrl
    policy merge` writes): a version that loads on its own, not one that needs a base
    folder on the machine that trained it. The tags keep the base's sha256 and the
    adapters' own."""
    import tempfile

    from components.lineage import weights_sha256
    from components.policy.lora import merge_adapters
    from components.policy.model import load_policy, save_policy

    with tempfile.TemporaryDirectory(prefix="agentrl-merged-") as tmp:
        model, tokenizer = load_policy(adapter_dir)
        merged = save_policy(merge_adapters(model), tokenizer, Path(tmp) / "policy")
        extra = {**adapter_base_tags(adapter_dir), "adapter_dir": str(adapter_dir),
                 "adapters_sha256": weights_sha256(adapter_dir)}  # fmt: skip
        return register_candidate(merged, lineage, config, actor, extra_tags=extra)


# Lineage tags that name a report; a local file there is kept as a run artifact.
REPORT_TAGS = ("eval_report_uri", "safety_report_uri")


def keep_reports(client, run_id: str, tags: dict) -> dict[str, str]:
    """The report tags whose value is a local file, that file logged under `reports/` of
    run `run_id` and the tag rewritten to its `runs:/` URI: a path into the pipeline's
    folder names whatever the next run writes there. A URI (runs:/, models:/, s3:/...)
    stays as given; a path where no file is (no report was written) is left out, rather
    than recorded as a link that leads nowhere."""
    out = {}
    for key in REPORT_TAGS:
        value = tags.get(key, "")
        if not value or "://" in value or value.startswith(("runs:/", "models:/")):
            continue
        path = Path(value)
        if not path.is_file():
            out[key] = ""
            continue
        client.log_artifact(run_id, str(path), artifact_path="reports")
        out[key] = f"runs:/{run_id}/reports/{path.name}"
    return out


def link_logged_model(client, model_id: str, name: str, version: str) -> None:
    """What `mlflow.register_model("models:/<id>")` records on the logged model: the
    versions made from it (tag `mlflow.modelVersions`, a JSON list of {name, version}).
    The model's page reads it: without it the page says "Not registered"."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    model = client.get_logged_model(model_id)
    known = json.loads(model.tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    entry = {"name": name, "version": version}
    if entry not in known:
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*known, entry])})


def record_evaluation(
    version: str,
    metrics: dict,
    evaluation_run_id: str = "",
    params: dict | None = None,
    config: PromotionConfig | None = None,
) -> str:
    """The version's evaluation on its logged model: `metrics` (name -> number; an
    interval [lo, hi] as `_lo`/`_hi`) logged with the model's id on the evaluation's run
    (else the version's source run), so the model's page lists them and links that run;
    `params` (e.g. the training run's configuration) as the model's params. Returns the
    model id ('' for a version registered before versions had a logged model)."""
    from mlflow.entities import Metric

    from components.tracking import metric_values

    config = config or PromotionConfig()
    client = mlflow_client(config)
    mv = client.get_model_version(config.model_name, str(version))
    model_id = mv.model_id or mv.tags.get("model_uri", "").removeprefix("models:/")
    if not model_id:
        return ""
    run = _training_run(client, evaluation_run_id) or client.get_run(mv.run_id)
    ts = int(run.info.end_time or run.info.start_time or 0)
    numbers = metric_values(metrics).scalars
    batch = [Metric(k, v, ts, 0, model_id=model_id) for k, v in numbers.items()]
    for i in range(0, len(batch), 1000):
        client.log_batch(run.info.run_id, metrics=batch[i : i + 1000])
    if params:
        from components.tracking import flatten

        flat = {k: str(v)[:500] for k, v in flatten("", params, {}).items()}
        client.log_model_params(model_id, flat)
    return model_id


def _training_run(client, run_id: str):
    """The training run in this store, or None (no id, or a run of another store)."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def _log_policy_model(client, checkpoint_dir: Path, run, tags: dict):
    """The checkpoint as a logged MLflow model (pyfunc, components/promote/mlflow_model.py)
    whose source run is `run`, listed among the run's outputs; returns the LoggedModel."""
    import tempfile

    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    from components.promote import mlflow_model

    model = client.create_logged_model(run.info.experiment_id, name="policy",
                                       source_run_id=run.info.run_id,
                                       tags={k: v for k, v in tags.items() if v})  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            meta = Model(artifact_path=model.artifact_location, run_id=run.info.run_id,
                         model_uuid=model.model_id, model_id=model.model_id)  # fmt: skip
            mlflow_model.save(checkpoint_dir, Path(tmp) / "model", mlflow_model=meta)
            client.log_model_artifacts(model.model_id, str(Path(tmp) / "model"))
    except Exception:
        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, step=0)])
    return client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)


def _version_dict(mv, aliases_by_version: dict[str, list[str]]) -> dict:
    version = str(mv.version)
    return {
        "version": version,
        "aliases": sorted(aliases_by_version.get(version, [])),
        "run_id": mv.run_id,
        "source": mv.source,
        "created_utc_ms": mv.creation_timestamp,
        "tags": dict(mv.tags),
    }


def get_aliases(config: PromotionConfig | None = None) -> dict[str, str]:
    """alias -> version of the registered model ({} when there is none; creates nothing)."""
    config = config or PromotionConfig()
    model = find_model(read_client(config), config)
    return {} if model is None else {alias: str(v) for alias, v in model.aliases.items()}


def get_alias(alias: str, config: PromotionConfig | None = None) -> str | None:
    return get_aliases(config).get(alias)


def _reader(config: PromotionConfig):
    client = read_client(config)
    if client is None:
        raise UnknownModel(f"no MLflow store at {config.resolved_tracking_uri()}")
    return client


def get_version(version: str, config: PromotionConfig | None = None) -> dict:
    config = config or PromotionConfig()
    mv = _reader(config).get_model_version(config.model_name, str(version))
    by_version: dict[str, list[str]] = {}
    for alias, v in get_aliases(config).items():
        by_version.setdefault(v, []).append(alias)
    return _version_dict(mv, by_version)


def list_versions(config: PromotionConfig | None = None) -> list[dict]:
    """Every version of the registered model, oldest first, with aliases and tags ([] when
    there is no such model; creates nothing)."""
    config = config or PromotionConfig()
    client = read_client(config)
    if find_model(client, config) is None:
        return []
    by_version: dict[str, list[str]] = {}
    for alias, v in get_aliases(config).items():
        by_version.setdefault(v, []).append(alias)
    versions = client.search_model_versions(f"name = '{config.model_name}'")
    out = [_version_dict(mv, by_version) for mv in versions]
    return sorted(out, key=lambda v: int(v["version"]))


def set_alias(alias: str, version: str, config: PromotionConfig | None = None) -> None:
    """Point a free alias (e.g. `canary`) at a version; champion/challenger are refused."""
    if alias in RESERVED_ALIASES:
        raise PermissionError(f"alias {alias!r} is moved only by the approval workflow")
    config = config or PromotionConfig()
    mlflow_client(config).set_registered_model_alias(config.model_name, alias, str(version))


def delete_alias(alias: str, config: PromotionConfig | None = None) -> None:
    if alias in RESERVED_ALIASES:
        raise PermissionError(f"alias {alias!r} is moved only by the approval workflow")
    config = config or PromotionConfig()
    mlflow_client(config).delete_registered_model_alias(config.model_name, alias)


def set_version_tags(version: str, tags: dict, config: PromotionConfig | None = None) -> None:
    """Free-form tags on a version (notes, links); approval-state tags are refused."""
    reserved = [k for k in tags if k.startswith(RESERVED_TAG_PREFIXES)]
    if reserved:
        raise PermissionError(f"tags {reserved} are written only by the approval workflow")
    config = config or PromotionConfig()
    client = mlflow_client(config)
    for key, value in tags.items():
        client.set_model_version_tag(config.model_name, str(version), key, str(value))


def download_version(
    ref: str, config: PromotionConfig | None = None, dst: str | Path | None = None
) -> Path:
    """The checkpoint folder of a version number or alias (e.g. "champion"), ready for
    `load_policy`. A local store returns the stored folder itself; pass `dst` for a copy."""
    import mlflow.artifacts

    config = config or PromotionConfig()
    client = mlflow_client(config)
    # Resolve the version here, on our client: a models:/ URI would be resolved against the
    # process-wide registry URI instead, which may be another store.
    mv = (
        client.get_model_version(config.model_name, str(ref))
        if str(ref).isdigit()
        else client.get_model_version_by_alias(config.model_name, ref)
    )
    uri = client.get_model_version_download_uri(config.model_name, mv.version)
    path = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=uri,
        dst_path=None if dst is None else str(dst),
        tracking_uri=config.resolved_tracking_uri(),
    ))  # fmt: skip
    # An MLflow model keeps the folder as its artifact; a version registered before the
    # registry logged models is the folder itself.
    if not (path / "MLmodel").is_file():
        return path
    from components.promote.mlflow_model import checkpoint_in

    return checkpoint_in(path)
