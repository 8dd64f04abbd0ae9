"""The environment variables a sandboxed command sees (`sandbox_env`): a short allow-list,
nothing else from the host, and the harness's own pytest plugins (`HARNESS_PLUGINS`) on
its PYTHONPATH."""

from __future__ import annotations

import sys
from pathlib import Path

HARNESS_PLUGINS = Path(__file__).resolve().parent / "harness_plugins"


def sandbox_env(home: Path, python_env: str = "") -> dict[str, str]:
    """The whole environment a sandboxed command sees (nothing else from the host passes).
    With a task environment its bin/ comes first: `python` and `pytest` are the task's; the
    project's bin/ stays behind it for the other allowed tools (ruff)."""
    venv_bin = str(Path(sys.executable).parent)  # not resolved: keep the venv's own bin/
    first = f"{python_env}/bin:" if python_env else ""
    return {
        "PATH": f"{first}{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        # The host venv's pytest plugins (kmock, asyncio, ...) are ours, not the task's:
        # they slow every run and can break it. Tasks get plain pytest + pytest-timeout,
        # its limit counted in CPU time (harness_plugins/agentrl_cpu_timeout.py), so that
        # load decides no test's outcome. The folder holds only the harness's own modules.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_PLUGINS": "pytest_timeout,agentrl_cpu_timeout",
        "PYTHONPATH": str(HARNESS_PLUGINS),
    }
