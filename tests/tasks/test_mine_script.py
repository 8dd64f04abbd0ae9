"""scripts/mine_real_libraries.py: the smoke test mines the offline fixture repository at a
tiny budget and checks the table; the slow test downloads a real library from PyPI (skipped
when PyPI cannot be reached) and requires oracle 100% and noop 0% on what it mined."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def _script():
    spec = importlib.util.spec_from_file_location("mine_real_libraries",
                                                  ROOT / "scripts" / "mine_real_libraries.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_on_the_fixture_repository(tmp_path, capsys):
    results = tmp_path / "mine.md"
    code = _script().main(["--local", f"minilib={ROOT / 'tests/fixtures/mine_repo'}",
                           "--max-candidates", "2", "--max-tasks", "1", "--results", str(results)])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    text = results.read_text()
    assert "| minilib | - | 3.11 | 11 | 0 |" in text and "| 1/1 | 0/1 |" in text  # oracle, noop
    data = json.loads(results.with_suffix(".json").read_text())
    assert data["prepare"]["cold"]["built"] == 1 and data["prepare"]["warm"]["built"] == 0


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.integration
def test_a_real_library_from_pypi_end_to_end(tmp_path, monkeypatch):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    script = _script()
    monkeypatch.setattr(script, "LIBRARIES", (("inflection", "0.5.1", "3.11", "auto", ()),))
    results = tmp_path / "mine.md"
    code = script.main(["--max-candidates", "3", "--max-tasks", "2", "--results", str(results)])
    row = json.loads(results.with_suffix(".json").read_text())["libraries"][0]
    assert row["ok"] and row["kept"], row["error"]
    assert row["eval"]["oracle"]["success"] == len(row["kept"])
    assert row["eval"]["noop"]["success"] == 0 and code == 0
