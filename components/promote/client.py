"""The MLflow client on the promotion store: the one low-level piece that registry.py,
audit.py and approval.py all talk through (so none of them imports another for it)."""

from __future__ import annotations

from pathlib import Path

from components.promote.config import PromotionConfig


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
