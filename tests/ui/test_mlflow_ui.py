"""The `ui` tier: scripts/ui_check.py in a real browser after a tiny pipeline run and its
reproduction (`make ui-deps` first; skipped cleanly without Playwright or chromium)."""

from __future__ import annotations

import shutil

import pytest

pytestmark = pytest.mark.ui


@pytest.mark.timeout(3600)
def test_mlflow_ui_shows_comparable_parents_real_times_traces_and_the_model(tmp_path, monkeypatch):
    pytest.importorskip("playwright", reason="make ui-deps installs Playwright")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no chromium on PATH (make ui-deps installs Debian's)")
    from components.promote import config as promote_config
    from scripts import ui_check

    # The build moves into its folder and points the registry there: undone afterwards.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(promote_config, "REPO_ROOT", promote_config.REPO_ROOT)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    workdir = tmp_path / "ui-check"
    assert ui_check.main(["--build", "--workdir", str(workdir)]) == 0
    shots = sorted(p.name for p in (workdir / "screenshots").glob("*.png"))
    assert shots == ["artifact-table.png", "compare-parents-diff.png", "compare-parents.png",
                     "logged-model.png", "model-version.png", "parent-run.png",
                     "runs-parents.png", "stage-run-sft.png", "trace.png"]  # fmt: skip
