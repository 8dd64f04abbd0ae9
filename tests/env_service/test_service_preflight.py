"""`agentrl env serve` reads its verdict key before any worker starts: a key it cannot read
or make, or (with --require-verdict-key, as on Kubernetes) a key that is not there yet, is
one line and exit 1, never a server whose records could never train."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.env_service.served_env import REPO


def serve(tasks_dir, state_dir, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTRL_STATE_DIR": str(state_dir)}
    argv = [sys.executable, "-m", "components.env_service", "--tasks", str(tasks_dir), *extra]
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("state", "extra", "says"),
    [
        ("missing", ["--require-verdict-key"], "create the Secret agentrl-verdict-key"),
        ("/etc/agentrl-verdict", [], "which sandboxed commands can read"),
        ("open", [], "readable by others"),
    ],
)
def test_a_server_without_a_usable_verdict_key_refuses_to_start(
    suite, tmp_path, state, extra, says
):
    if state == "missing":
        state_dir = tmp_path / "empty"
    elif state == "open":
        state_dir = tmp_path / "open"
        state_dir.mkdir()
        (state_dir / "verdict-mac.key").write_text("k" * 64)
        (state_dir / "verdict-mac.key").chmod(0o644)
    else:
        state_dir = state
    done = serve(suite[0], state_dir, "--port", "1", *extra)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "could never train" in lines[0]
    if state == "missing":
        assert not (tmp_path / "empty" / "verdict-mac.key").exists()  # nothing made
