"""The MLflow client on the promotion store: the one low-level piece that registry.py,
audit.py and approval.py all talk through (so none of them imports another for it).

Writers use `mlflow_client`, which creates the store and the registered model. Readers
(status, history, the registry's getters) use `read_client` + `find_model`, which create
nothing: a status of a misspelt model must not register it. A local SQLite store is looked
at first (`checked_sqlite_store`): one that cannot be created or opened, or that is no
SQLite database (truncated, overwritten), is a PromotionError naming the file and the OS or
SQLite error, not a database driver's traceback or "no registered model".
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.request import pathname2url

from components.promote.config import PromotionConfig
from components.promote.errors import PromotionError

CHAMPION = "champion"
CHALLENGER = "challenger"
RESERVED_ALIASES = (CHAMPION, CHALLENGER)


def mlflow_client(config: PromotionConfig):
    """An MlflowClient on the config's store; the registered model exists afterwards."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = config.resolved_tracking_uri()
    if uri.startswith("sqlite:///"):
        checked_sqlite_store(Path(uri.removeprefix("sqlite:///")), create=True)
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
    db = Path(uri.removeprefix("sqlite:///"))
    if uri.startswith("sqlite:///") and not checked_sqlite_store(db, create=False):
        return None
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def check_store(config: PromotionConfig) -> None:
    """Before a command takes the promotion lock or writes anything: a local SQLite store
    that cannot be opened or is damaged is a PromotionError naming it. An absent one is
    fine here (a writer creates it, a reader says there is none); creates nothing."""
    uri = config.resolved_tracking_uri()
    if uri.startswith("sqlite:///"):
        checked_sqlite_store(Path(uri.removeprefix("sqlite:///")), create=False)


def check_run(run_id: str, config: PromotionConfig, what: str) -> None:
    """Before anything is written: run `run_id` (given as option `what`) is in the config's
    store, else a PromotionError naming the id and the store. Creates nothing: an absent
    local store has no run."""
    from mlflow.exceptions import MlflowException

    uri = config.resolved_tracking_uri()
    client = read_client(config)
    if client is None:
        raise PromotionError(f"{what} {run_id}: no such run (there is no MLflow store at {uri})")
    try:
        client.get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise PromotionError(f"{what} {run_id}: no such run in {uri}") from e
        raise PromotionError(f"{what} {run_id}: cannot look it up in {uri} ({e})") from e


def checked_sqlite_store(db: Path, create: bool) -> bool:
    """Whether the SQLite store `db` holds a database (False: absent or empty). With
    `create`, an absent one's folder is made and the file created empty (MLflow fills it).
    PromotionError naming `db` when it cannot be created or opened, or is not a sound
    SQLite database (PRAGMA quick_check: a truncated file fails it)."""
    try:
        if create and not db.exists():
            db.parent.mkdir(parents=True, exist_ok=True)
            db.touch()
        size = db.stat().st_size
    except FileNotFoundError:
        return False
    except OSError as e:
        action = "create" if create else "open"
        raise PromotionError(f"{db}: cannot {action} the MLflow store ({e.strerror or e})") from e
    if not db.is_file():
        raise PromotionError(f"{db}: the MLflow store is not a file")
    if size == 0:
        return False
    try:
        with closing(sqlite3.connect(f"file:{pathname2url(str(db))}?mode=ro", uri=True)) as con:
            verdict = con.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.Error as e:
        verdict = str(e)
    if verdict != "ok":
        raise PromotionError(
            f"{db}: the MLflow store is damaged or not an SQLite database "
            f"({verdict}); restore it from a backup or pass another "
            "--tracking-uri"
        )
    return True


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
