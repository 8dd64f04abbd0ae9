"""`agentrl promote ...` through its argv functions (and one real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from promote_helpers import PASSING, candidate

from components.cli_args import UsageError
from components.promote.__main__ import (
    main_approve,
    main_history,
    main_reject,
    main_rollback,
    main_status,
)
from components.promote.registry import get_alias

ROOT = Path(__file__).resolve().parents[2]


def store(cfg) -> list[str]:
    return ["--tracking-uri", cfg.tracking_uri, "--model", cfg.model_name,
            "--audit-path", cfg.audit_path]  # fmt: skip


def test_cli_approve_reject_rollback_status_history(cfg, checkpoint, capsys, monkeypatch):
    monkeypatch.setenv("USER", "erin")
    s = store(cfg)
    v1, _ = candidate(cfg, checkpoint)
    assert main_status(["--json", *s]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["aliases"] == {"challenger": v1} and [p["version"] for p in st["pending"]] == [v1]

    assert main_approve([v1, "--reason", "reviewed", *s]) == 0  # approver from $USER
    assert get_alias("champion", cfg) == v1
    assert json.loads(capsys.readouterr().out)["actor"] == "erin"
    assert main_approve([v1, "--reason", "again", *s]) == 1  # no longer pending: refused
    assert "refused" in capsys.readouterr().err

    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    assert main_reject([v2, "--reason", "flaky", "--approver", "frank", *s]) == 0
    assert get_alias("champion", cfg) == v1
    v3, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=3)
    assert main_approve([v3, "--reason", "better", "--approver", "gina", *s]) == 0
    assert main_rollback(["--reason", "regression in prod", *s]) == 0
    assert get_alias("champion", cfg) == v1
    capsys.readouterr()

    assert main_history(["--json", *s]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    decided = [(r["action"], r["version"], r["actor"]) for r in recs
               if r["action"] in ("approved", "rejected", "rolled_back", "refused")]  # fmt: skip
    assert decided == [("approved", v1, "erin"), ("refused", v1, "erin"),
                       ("rejected", v2, "frank"), ("approved", v3, "gina"),
                       ("rolled_back", v1, "erin")]  # fmt: skip
    assert main_status(s) == 0
    out = capsys.readouterr().out
    assert "champion    1" in out
    # the verifier that judged the champion's evaluation, beside the current one
    from components.verifier.version import verifier_version

    assert f"champion judged by vv-judged-it; current {verifier_version()}  (stale" in out
    assert main_status(["--json", *s]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["champion_verifier_version"] == "vv-judged-it"
    assert st["current_verifier_version"] == verifier_version()


def test_cli_requires_reason_and_version(cfg, capsys):
    for argv in (["1", *store(cfg)], ["1", "--reason", " ", *store(cfg)], ["--reason", "x"]):
        with pytest.raises(UsageError) as e:  # one line at the boundary, exit 2
            main_approve(argv)
        assert e.value.code == 2
    with pytest.raises(UsageError):
        main_rollback(["--reason", "", *store(cfg)])
    assert get_alias("champion", cfg) is None


def test_the_presets_promote_section_reaches_every_command(cfg, checkpoint, tmp_path, capsys):
    """The registry, model name and audit log come from the preset's `promote` section."""
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"promote": {
        "model_name": cfg.model_name, "tracking_uri": cfg.tracking_uri,
        "artifact_root": cfg.artifact_root, "audit_path": cfg.audit_path}}))  # fmt: skip
    v1, _ = candidate(cfg, checkpoint)
    assert main_status(["--json", "--preset", str(preset)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["model"] == cfg.model_name and st["aliases"] == {"challenger": v1}
    assert main_approve([v1, "--reason", "ok", "--approver", "hal", "--preset", str(preset)]) == 0
    assert get_alias("champion", cfg) == v1
    capsys.readouterr()
    assert main_history(["--json", "--preset", str(preset), "--action", "approved"]) == 0
    assert json.loads(capsys.readouterr().out)["actor"] == "hal"


def test_module_entry_point_is_light_and_prints_history(tmp_path):
    audit = tmp_path / "audit.jsonl"
    audit.write_text(json.dumps({"model": "agentrl-coder", "version": "1", "action": "approved",
                                 "actor": "alice", "reason": "ok",
                                 "time_utc": "2026-01-01T00:00:00.000+00:00"}) + "\n")  # fmt: skip
    code = ("import sys, components.promote.__main__ as m; rc = m.main_history(sys.argv[1:]); "
            "print(sorted(x for x in ('mlflow', 'prefect') if x in sys.modules)); sys.exit(rc)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, "--audit-path", str(audit)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "approved" in out.stdout and "alice" in out.stdout
    assert out.stdout.strip().endswith("[]")  # history needs neither mlflow nor prefect
