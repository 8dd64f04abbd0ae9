"""What `make run` prints at the end (flows/retrain.py: print_summary): the cheating rate
beside the other evaluation numbers and the promotion gate on it (issue 31: "`make run`
shows the gate"). Hand-built summary in the shape the flow passes; no MLflow, no registry."""

from __future__ import annotations

import pytest

from components.promote.gates import evaluate_gates


def _summary(cheating_rate: float | None) -> dict:
    overall = {"success_rate": 0.75, "success_ci95": [0.4, 0.9], "test_pass_rate": 0.8,
               "tool_call_accuracy": 0.9, "valid_call_rate": 1.0, "recovery_rate": 0.5,
               "safety_violation_rate": 0.0, "tampering_rate": 0.0,
               "human_intervention_rate": 0.0, "infra_failures": 0, "infra_failure_rate": 0.0,
               "regression_rate": None, "episodes": 8, "cheating_rate": cheating_rate}  # fmt: skip
    decision = evaluate_gates(overall, None, {"passed": True, "failure_rate": 0.0},
                              current_verifier="v")  # fmt: skip
    return {"run_id": "r1", "mlflow_run_url": "http://127.0.0.1:5000/#/runs/r1",
            "data_version": "v3", "candidate": "runs/x/grpo", "evaluation": overall,
            "promotion": {"version": "7", "model": "agentrl-coder", "challenger": False,
                          "gate_checks": decision.to_dict()["checks"]},
            "preset": "configs/cpu-demo.yaml", "fingerprints": {},
            "stage_seconds": {"sft": 1.0, "evaluate": 2.0}}  # fmt: skip


@pytest.fixture
def printed(monkeypatch, capsys):
    import components.tracking as tracking
    import flows.retrain as retrain

    monkeypatch.setattr(retrain, "_live_status", lambda version, preset: {"status": "pending",
                                                                         "aliases": []})  # fmt: skip
    monkeypatch.setattr(tracking, "pipeline_runs_url", lambda *a, **k: "http://ui/#/runs")

    def run(cheating_rate: float | None) -> list[str]:
        retrain.print_summary(_summary(cheating_rate))
        return capsys.readouterr().out.splitlines()

    return run


def test_the_summary_shows_the_cheating_rate_and_its_gate(printed):
    lines = printed(0.0)
    assert "  cheating rate              0.0%" in lines
    gate = [x for x in lines if x.startswith("  [") and "] cheating_rate:" in x]
    assert gate == ["  [pass] cheating_rate: cheating_rate 0.0000 <= max 0.0000"]
    # the row sits among the evaluation numbers, the gate among the gates
    assert (
        lines.index("  cheating rate              0.0%")
        < lines.index("=== Promotion gates ===")
        < lines.index(gate[0])
    )


def test_a_cheating_candidate_fails_the_gate_and_an_unmeasured_one_too(printed):
    lines = printed(0.25)
    assert "  cheating rate              25.0%" in lines
    assert "  [FAIL] cheating_rate: cheating_rate 0.2500 > max 0.0000" in lines
    lines = printed(None)  # impossible_variants: 0 -> not measured: n/a, and the gate fails
    assert "  cheating rate              n/a" in lines
    assert "  [FAIL] cheating_rate: cheating_rate missing from the candidate's report" in lines
