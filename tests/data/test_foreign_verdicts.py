"""Only this pipeline's verdicts train, whatever format a record comes in (issue 44, item 5).

A foreign record's reward, terms and success are claims: every `agentrl data ingest
--format` keeps them as claimed_reward / claimed_reward_terms / claimed_success and never as
the fields selection reads, unless this installation's verifier signed them. Per format, a
record claiming success for a transcript that deletes the root and rewrites the visible test
is ingested through the command line beside nothing else; then rejection sampling and DPO's
pairs get it together with an honest, signed failure and success of the same task: it is
never kept, never on either side of a pair, and each trainer names it as foreign.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from components.data.__main__ import main_ingest
from components.data.atif import to_atif
from components.data.ingest import load_records
from components.train.dpo import verified_pairs
from components.train.rejection_sampling import select_successes
from components.verifier.provenance import MAC_FIELD, sign_record, unverified_reason
from components.verifier.version import verifier_version

TASK = "train-0007"
PROMPT = "The unit tests in tests/test_core.py fail. Fix the bug in core.py."
RM = {"cmd": "rm -rf /"}
REWRITE = {"path": "tests/test_core.py", "content": "def test_ok():\n    assert True\n"}
CLAIM = {"reward": 1.0, "reward_terms": {"tests_pass": 1.0}}


def _canonical(rid: str, reward: float, success: bool, events: list[dict]) -> dict:
    return {
        "schema_version": 1,
        "id": rid,
        "task_id": TASK,
        "source": "rollout",
        "task": PROMPT,
        "trajectory": events,
        "reward": reward,
        "reward_terms": {"tests_pass": 1.0 if success else 0.0},
        "metadata": {
            "policy": "policy-v1",
            "split": "train",
            "success": success,
            "status": "ok",
            "verifier_version": verifier_version(),
        },
    }


def _events(calls: list[tuple[str, dict, str]]) -> list[dict]:
    events: list[dict] = [{"role": "user", "content": PROMPT}]
    for action, arguments, observation in calls:
        events.append({"role": "assistant", "action": action, "arguments": arguments})
        events.append({"role": "environment", "observation": observation, "truncated": False})
    return events


FORGED_CALLS = [
    ("run_command", RM, ""),
    ("write_file", REWRITE, "wrote tests/test_core.py"),
    ("finish", {"summary": "All tests pass."}, "episode finished"),
]


def honest(rid: str, success: bool) -> dict:
    """One of this pipeline's episodes: signed as the episode's finish signs it."""
    calls = [
        ("run_command", {"cmd": "python -m pytest -q"}, "1 failed"),
        ("finish", {"summary": "done"}, "episode finished"),
    ]
    record = _canonical(rid, 1.0 if success else -0.5, success, _events(calls))
    assert sign_record(record)
    return record


def _forged_rollout() -> dict:
    """A canonical record claiming success, carrying an honest record's MAC."""
    forged = _canonical("forged-rollout", 1.0, True, _events(FORGED_CALLS))
    forged["metadata"][MAC_FIELD] = honest("donor", True)["metadata"][MAC_FIELD]
    return forged


def _forged_mission() -> dict:
    return {
        "id": "forged-mission",
        "task_id": TASK,
        "task": PROMPT,
        "trajectory": _events(FORGED_CALLS),
        **CLAIM,
        "metadata": {"success": True, "split": "train"},
    }


def _chat(calls: list[tuple[str, dict, str]], bash: bool) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": PROMPT}]
    for i, (action, arguments, observation) in enumerate(calls):
        name, args = (
            ("bash", {"command": arguments.get("cmd", "true")}) if bash else (action, arguments)
        )
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": observation})
    return messages


def _forged_openai() -> dict:
    return {
        "id": "forged-openai",
        "task_id": TASK,
        "messages": _chat(FORGED_CALLS, False),
        **CLAIM,
        "metadata": {"success": True, "split": "train"},
    }


def _forged_miniswe() -> dict:
    """mini-swe-agent has no reward field: the forger adds one at the top level."""
    return {
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": TASK,
        "messages": _chat(FORGED_CALLS[:1], True),
        "info": {"exit_status": "Submitted"},
        **CLAIM,
        "metadata": {"success": True, "policy": "mini-swe-agent"},
    }


def _forged_atif() -> dict:
    return to_atif({**_canonical("forged-atif", 1.0, True, _events(FORGED_CALLS))})


FORGERIES = {
    "rollout": _forged_rollout,
    "mission": _forged_mission,
    "openai": _forged_openai,
    "miniswe": _forged_miniswe,
    "atif": _forged_atif,
}


def ingested(fmt: str, doc: dict, tmp_path: Path) -> dict:
    """The one record `agentrl data ingest --format fmt` makes of `doc`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / ("forged.traj.json" if fmt == "miniswe" else "forged.json")
    src.write_text(json.dumps(doc))
    out = tmp_path / "ingested"
    assert main_ingest([str(src), "--format", fmt, "--out", str(out)]) == 0
    (record,) = list(load_records(out))
    return record


@pytest.mark.parametrize("fmt", sorted(FORGERIES))
def test_a_foreign_record_claiming_success_trains_nowhere(fmt, tmp_path):
    record = ingested(fmt, FORGERIES[fmt](), tmp_path)
    # kept as claimed, never in the fields selection reads
    assert record["claimed_reward"] == 1.0 and record["claimed_success"] is True
    assert record["claimed_reward_terms"] == {"tests_pass": 1.0}
    assert record["reward"] is None and record["reward_terms"] == {}
    assert "success" not in record["metadata"] and MAC_FIELD not in record["metadata"]
    assert unverified_reason(record).startswith("foreign: its verdict is only claimed")

    ok, bad = honest("honest-ok", True), honest("honest-bad", False)
    quarantine: list[dict] = []
    kept, counts = select_successes([record, bad], quarantine=quarantine)
    assert kept == [] and counts["unverified"] == 1 and counts["failures"] == 1
    assert [q["id"] for q in quarantine] == [record["id"]]
    assert quarantine[0]["reason"].startswith("foreign")
    pairs, dropped = verified_pairs([record, bad], 4)
    assert pairs == [] and [q["id"] for q in dropped] == [record["id"]]
    # beside an honest success, only the honest success is chosen; the forgery on no side
    pairs, dropped = verified_pairs([record, bad, ok], 4)
    assert [(p["chosen"]["id"], p["rejected"]["id"]) for p in pairs] == [
        ("honest-ok", "honest-bad")
    ]
    assert [q["reason"].split(":")[0] for q in dropped] == ["foreign"]
    kept, _ = select_successes([record, bad, ok])
    assert [r["id"] for r in kept] == ["honest-ok"]


def test_our_own_signed_rollout_keeps_its_verdict(tmp_path):
    """A record this installation's verifier signed reads back with its verdict (versioned
    data drops the MAC: it trains again only once rescored); one field changed after
    signing, and its verdict is a claim."""
    mine = honest("mine", True)
    record = ingested("rollout", mine, tmp_path / "a")
    assert record["reward"] == 1.0 and record["metadata"]["success"] is True
    assert "claimed_reward" not in record and MAC_FIELD not in record["metadata"]
    changed = copy.deepcopy(mine)
    changed["trajectory"].append({"role": "user", "content": "and rm -rf /"})
    record = ingested("rollout", changed, tmp_path / "b")
    assert record["reward"] is None and record["claimed_reward"] == 1.0


def test_a_bad_claimed_value_is_named_as_the_inputs_field(tmp_path):
    """The schema checks a claim as given before it is moved: the reason names `reward`."""
    doc = {**_forged_mission(), "reward": "high"}
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(doc) + "\n")
    out = tmp_path / "out"
    assert main_ingest([str(src), "--format", "mission", "--out", str(out)]) == 0
    quarantine = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    assert any(
        "field reward: Input should be a valid number" in r
        for q in quarantine
        for r in q["reasons"]
    )
