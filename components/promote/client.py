"""The MLflow client on the promotion store: the one low-level piece that registry.py,
audit.py and approval.py all talk through (so none of them imports another for it).

Writers use `mlflow_client`, which creates the store and the registered model. Readers
(status, history, the registry's getters) use `read_client` + `find_model`, which create
nothing: a status of a misspelt model must not register it.
"""

from __future__ import annotations

from pathlib import Path

from components.promote.config import PromotionConfig

CHAMPION = "champion"
CHALLENGER = "challenger"
RESERVED_ALIASES = (CHAMPION, CHALLENGER)


def mlflow_client(config: PromotionConfig):
    """An MlflowClient on the config's store; the registered model exists afterwards."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = config.resolved_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        client.get_registered_model(config.model_name)
    except MlflowException:
        try:
            client.create_registered_model(
                config.model_name,
                description="agentrl coding agent; aliases: champion (approved), challenger "
                "(passed gates, awaiting approval)",
            )
        except MlflowException:  # created meanwhile by another process
            client.get_registered_model(config.model_name)
    return client


def read_client(config: PromotionConfig):
    """An MlflowClient on an existing store, or None: a local SQLite file that does not
    exist (or is empty) is not created. A server URI is always returned."""
    from mlflow import MlflowClient

    uri = config.resolved_tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file() or db.stat().st_size == 0:
            return None
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def find_model(client, config: PromotionConfig):
    """The registered model, or None when the client is None or the model does not exist."""
    from mlflow.exceptions import MlflowException

    if client is None:
        return None
    try:
        return client.get_registered_model(config.model_name)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def reserved(aliases) -> dict[str, str]:
    """The champion/challenger part of an alias map, versions as strings (an audit record
    read from disk may hold anything: not a mapping reads as no aliases)."""
    if not isinstance(aliases, dict):
        return {}
    return {k: str(v) for k, v in aliases.items() if k in RESERVED_ALIASES and v}
