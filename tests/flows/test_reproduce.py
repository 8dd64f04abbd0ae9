"""flows/reproduce.py: the comparison names the first stage whose output differs, and a
checkout that cannot reproduce a version (other code, other preset) says why."""

from __future__ import annotations

import yaml

from flows import reproduce

REGISTERED = {"data_version": "d1", "sft_sha256": "s1", "weights_sha256": "w1",
              "eval_digest": "e1"}  # fmt: skip


def test_equal_when_every_fingerprint_matches():
    report = reproduce.compare(REGISTERED, dict(REGISTERED))
    assert report["verdict"] == "equal" and report["first_difference"] is None
    assert [r["stage"] for r in report["stages"]] == ["data", "SFT", "RL", "eval"]


def test_the_first_differing_stage_is_named():
    report = reproduce.compare(REGISTERED, {**REGISTERED, "sft_sha256": "s2",
                                            "weights_sha256": "w2"})  # fmt: skip
    assert report["verdict"] == "differs" and report["first_difference"] == "SFT"
    report = reproduce.compare(REGISTERED, {**REGISTERED, "eval_digest": "e2"})
    assert report["first_difference"] == "eval"


def test_a_changed_preset_value_or_other_code_cannot_reproduce(tmp_path, monkeypatch):
    from components.preset import load_preset
    from components.promote import registry

    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"sft": {"max_steps": 5}}))
    tags = {"git_commit": "abc", "preset": str(preset),
            "config_hash": load_preset(preset).config_hash()}  # fmt: skip
    monkeypatch.setattr(registry, "current_git_commit", lambda: "abc")
    assert reproduce.preconditions(tags) == []
    preset.write_text(yaml.safe_dump({"sft": {"max_steps": 6}}))
    (problem,) = reproduce.preconditions(tags)
    assert problem.startswith("preset:") and tags["config_hash"] in problem
    monkeypatch.setattr(registry, "current_git_commit", lambda: "def")
    assert any(p.startswith("code:") for p in reproduce.preconditions(tags))
