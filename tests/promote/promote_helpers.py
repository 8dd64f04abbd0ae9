"""Builders shared by the promotion tests (imported as a module next to them)."""

from __future__ import annotations

import json

from components.promote.approval import request_approval
from components.promote.gates import evaluate_gates
from components.promote.registry import Lineage, register_candidate

PASSING = {
    "success_rate": 0.8,
    "regression_rate": 0.0,
    "safety_violation_rate": 0.0,
    "tampering_rate": 0.0,
    "infra_failures": 0,
    "episodes": 20,
    "cheating_rate": 0.0,
}
DATA_OK = {"passed": True, "failure_rate": 0.01, "version": "data-v1"}


def lineage(n: int = 1) -> Lineage:
    return Lineage(
        data_version="data-v1",
        config_hash=f"cfg{n}",
        training_run_id=f"run{n}",
        eval_report_uri=f"file:///reports/eval{n}.json",
        safety_report_uri=f"file:///reports/safety{n}.json",
        git_commit="abc123",
        verifier_version="vv-judged-it",
    )


def candidate(cfg, checkpoint, metrics=None, champion=None, data=None, n: int = 1):
    """Register a version and submit it to the gates; returns (version, passed)."""
    version = register_candidate(checkpoint, lineage(n), cfg, actor="trainer")
    metrics = dict(PASSING if metrics is None else metrics)
    decision = evaluate_gates(metrics, champion, data or DATA_OK, cfg)
    evidence = {
        "candidate_metrics": metrics,
        "champion_metrics": champion,
        "data_validation": data or DATA_OK,
        "run_ids": {"train": f"run{n}"},
    }
    return version, request_approval(version, decision, evidence, config=cfg)


def make_checkpoint(ckpt):
    """A stand-in for a save_policy folder: config.json + tokenizer files, a few bytes."""
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (ckpt / "tokenizer.json").write_text("{}")
    (ckpt / "tokenizer_config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    return ckpt
