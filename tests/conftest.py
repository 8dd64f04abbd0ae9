"""Test tiers: plain `pytest` runs the fast CPU tier (see pyproject addopts).

`-m integration`, `-m slow` and `-m gpu` opt in; gpu tests skip cleanly without CUDA.
"""

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The verdict-signing key (components/verifier/provenance.py) of this test session, not the
# user's ~/.local/state/agentrl one.
os.environ.setdefault("AGENTRL_STATE_DIR", tempfile.mkdtemp(prefix="agentrl-test-state-"))
# The stores a test does not name itself: this session's temporary folder, never the
# checkout's mlruns/ (a test once registered a model there) nor a user's tracking server.
# Subprocesses inherit the variable; `_session_stores` points the registry's audit log there.
SESSION_STORES = Path(tempfile.mkdtemp(prefix="agentrl-test-stores-"))
(SESSION_STORES / "mlruns").mkdir()
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{SESSION_STORES / 'mlruns' / 'mlflow.db'}"


@pytest.fixture(autouse=True, scope="session")
def _session_stores():
    """The promotion registry's defaults (<repo>/mlruns: database, artifacts, audit log and
    its lock) moved to this session's folder for every test, and so is the artifact
    folder MLflow gives an experiment created without one (`./mlruns/<id>` of the working
    directory, the checkout's: a test's model landed there)."""
    from mlflow.tracking._tracking_service import utils as mlflow_store_defaults

    from components.promote import config as promote_config

    patch = pytest.MonkeyPatch()
    patch.setattr(promote_config, "REPO_ROOT", SESSION_STORES)
    patch.setattr(
        mlflow_store_defaults,
        "DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH",
        str(SESSION_STORES / "artifacts"),
    )
    yield SESSION_STORES
    patch.undo()


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # only when a gpu test is selected: torch import is slow

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def prefect_harness(tmp_path_factory):
    """A temporary Prefect server and database; persisted task results go to a temporary
    folder too, not to ~/.prefect."""
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-results")
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: storage}),
    ):
        yield


@pytest.fixture
def pipeline_workdir(tmp_path, monkeypatch):
    """A run folder for an in-process retrain flow: the working directory, with MLflow's
    database and the model registry inside it."""
    from components.promote import config as promote_config

    root = tmp_path.resolve() / "run"
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    monkeypatch.setattr(promote_config, "REPO_ROOT", root)
    return root


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A saved tiny policy (one layer, 512-token vocabulary): a checkpoint to register."""
    import torch

    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy

    torch.set_num_threads(1)
    config = PolicyConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
        vocab_size=512, tokenizer_stdlib_bytes=20_000, max_position_embeddings=1024,
    )  # fmt: skip
    return save_policy(*build_policy(config), tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="session")
def suite_tasks(tmp_path_factory):
    """A small generated suite shared by the environment, verifier and scripted-policy
    tests (generated once per session, only when a test asks for it)."""
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    root = tmp_path_factory.mktemp("env-suite") / "tasks"
    generate_suite(root, 10, 0)
    found, errors = load_tasks(root)
    assert not errors
    return found
