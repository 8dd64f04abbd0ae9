"""A small generated suite shared by the environment tests (generated once per session)."""

import pytest

from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks


@pytest.fixture(scope="session")
def suite_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("env-suite") / "tasks"
    generate_suite(root, 10, 0)
    found, errors = load_tasks(root)
    assert not errors
    return found
