"""Promotion on record, whatever a hostile user or an unlucky operator does (issue 18).

The audit log is hash-chained with its head mirrored in the registry, so a deleted, edited,
forged or truncated line is named and a damaged one never crashes a read; the registry's
aliases must be the ones the log records (a champion set through MlflowClient is drift:
warned by status, refused by approve and rollback); a decision whose record is written is
completed by the next command, one whose record is not never moved anything; read-only
commands create nothing. Each case here failed on 469a02c.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from promote_helpers import PASSING, candidate, make_checkpoint

from components.promote import audit, chain, lock
from components.promote.__main__ import main_approve, main_history, main_rollback, main_status
from components.promote.approval import PromotionRefused, approve, reject, rollback, status
from components.promote.client import mlflow_client
from components.promote.config import PromotionConfig
from components.promote.errors import AuditIntegrityError
from components.promote.registry import get_alias, get_aliases

ROOT = Path(__file__).resolve().parents[2]


def store(cfg) -> list[str]:
    return ["--tracking-uri", cfg.tracking_uri, "--model", cfg.model_name,
            "--audit-path", cfg.audit_path]  # fmt: skip


@pytest.fixture(scope="module")
def approved_store(mlflow_store, tmp_path_factory) -> tuple[PromotionConfig, str, str]:
    """One store for the tampering tests (they refuse, so change nothing but the file):
    v1 approved, then v2 approved over it (champion history [v1, v2])."""
    root = tmp_path_factory.mktemp("tamper")
    cfg = PromotionConfig(model_name=f"agentrl-tamper-{uuid.uuid4().hex[:8]}",
                          audit_path=str(root / "audit.jsonl"), **mlflow_store)  # fmt: skip
    checkpoint = make_checkpoint(root / "ckpt")
    v1, _ = candidate(cfg, checkpoint)
    approve(v1, "alice", "first", config=cfg)
    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    approve(v2, "bob", "better", config=cfg)
    return cfg, v1, v2


@pytest.fixture
def tampered(approved_store):
    """The shared store, its audit log put back after each test."""
    path = Path(approved_store[0].audit_path)
    kept = path.read_bytes()
    yield approved_store
    path.write_bytes(kept)


@pytest.fixture
def two_approved(cfg, checkpoint) -> tuple[str, str]:
    """approved_store's history in the test's own store (for tests that change it)."""
    v1, _ = candidate(cfg, checkpoint)
    approve(v1, "alice", "first", config=cfg)
    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    approve(v2, "bob", "better", config=cfg)
    return v1, v2


def lines(cfg) -> list[str]:
    return Path(cfg.audit_path).read_text().splitlines(keepends=True)


def rewrite(cfg, new_lines: list[str]) -> None:
    Path(cfg.audit_path).write_text("".join(new_lines))


def line_of(cfg, action: str, version: str) -> int:
    """0-based index of the last line recording `action` of `version`."""
    found = [i for i, raw in enumerate(lines(cfg))
             if json.loads(raw)["action"] == action and json.loads(raw)["version"] == version]  # fmt: skip
    return found[-1]


def history_problems(cfg, capsys) -> str:
    capsys.readouterr()
    assert main_history(store(cfg)) == 1
    return capsys.readouterr().err


def assert_refused_unchanged(cfg, capsys, champion: str) -> str:
    """approve/rollback refuse with one line (no traceback) and nothing moves."""
    assert main_rollback(["--reason", "incident", "--approver", "dave", *store(cfg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("refused: ") and err.count("\n") == 1 and "Traceback" not in err
    assert get_alias("champion", cfg) == champion
    return err


def test_chain_links_every_record_and_the_registry_holds_its_head(tampered):
    cfg, _, _ = tampered
    log = chain.scan(Path(cfg.audit_path), cfg.model_name)
    assert [e.seq for e in log.chained] == list(range(1, len(log.entries) + 1))
    assert not log.problems and audit.verify_log(cfg, aliases=get_aliases(cfg)) == ([], [])
    model = mlflow_client(cfg).get_registered_model(cfg.model_name)
    assert model.tags[audit.HEAD_TAG] == chain.link(log.last.record)
    version = mlflow_client(cfg).get_model_version(cfg.model_name, log.last.record["version"])
    assert version.tags["audit.chain_head"] == chain.link(log.last.record)


def test_deleted_approval_line_is_named(tampered, capsys):
    cfg, v1, v2 = tampered
    kept = lines(cfg)
    i = line_of(cfg, "approved", v1)
    rewrite(cfg, kept[:i] + kept[i + 1 :])
    assert f"line {i + 1}: the record(s) before it (seq {i + 1}) are missing" in history_problems(
        cfg, capsys
    )
    assert "missing: deleted" in assert_refused_unchanged(cfg, capsys, v2)
    assert any("missing: deleted" in w for w in status(cfg)["warnings"])


def test_deleted_or_truncated_last_line_is_caught_by_the_registry_head(tampered, capsys):
    cfg, v1, v2 = tampered
    kept = lines(cfg)
    assert json.loads(kept[-1])["action"] == "approved"
    rewrite(cfg, kept[:-1])  # the approval of v2 vanishes
    err = history_problems(cfg, capsys)
    assert f"ends at seq {len(kept) - 1}" in err and f"chain head is seq {len(kept)}" in err
    assert_refused_unchanged(cfg, capsys, v2)
    rewrite(cfg, kept[:-1] + [kept[-1][:40]])  # truncated mid-line: read, named, no crash
    err = history_problems(cfg, capsys)
    assert f"line {len(kept)} is damaged" in err and "deleted or truncated" in err
    with pytest.raises(AuditIntegrityError):
        approve(v1, "alice", "again", config=cfg)


def test_edited_line_is_named(tampered, capsys):
    cfg, v1, v2 = tampered
    kept = lines(cfg)
    i = line_of(cfg, "approved", v1)
    edited = json.loads(kept[i])
    edited["actor"] = "mallory"
    rewrite(cfg, kept[:i] + [json.dumps(edited) + "\n"] + kept[i + 1 :])
    assert f"line {i + 1}: seq {i + 1} (approved of v{v1} by mallory) was edited" in (
        history_problems(cfg, capsys)
    )
    # Re-hashed by someone who knows the scheme: the next record's link names it instead.
    edited = chain.seal({k: v for k, v in edited.items() if k not in chain.LINK_FIELDS},
                        edited["seq"], edited["prev_hash"])  # fmt: skip
    rewrite(cfg, kept[:i] + [chain.canonical(edited) + "\n"] + kept[i + 1 :])
    assert f"does not link to line {i + 1}, which was edited or replaced" in history_problems(
        cfg, capsys
    )
    assert_refused_unchanged(cfg, capsys, v2)


def test_forged_lines_are_named(tampered, capsys):
    cfg, v1, v2 = tampered
    kept = lines(cfg)
    last = json.loads(kept[-1])
    forged = {**last, "id": "f" * 32, "version": v1, "actor": "mallory", "reason": "trust me"}
    # Well formed and correctly linked: only the registry's head shows it is not real.
    sealed = chain.seal({k: v for k, v in forged.items() if k not in chain.LINK_FIELDS},
                        last["seq"] + 1, last["hash"])  # fmt: skip
    rewrite(cfg, kept + [chain.canonical(sealed) + "\n"])
    err = history_problems(cfg, capsys)
    assert f"line {len(kept) + 1}: seq {last['seq'] + 1} (approved of v{v1} by mallory)" in err
    assert "not in the registry's chain: forged" in err
    assert_refused_unchanged(cfg, capsys, v2)
    # Without a link at all (a line as the old log wrote them).
    rewrite(cfg, kept + [json.dumps({k: v for k, v in forged.items()
                                     if k not in chain.LINK_FIELDS}) + "\n"])  # fmt: skip
    assert "has no chain link but follows chained records" in history_problems(cfg, capsys)


JUNK = [
    b"\xff\xfe not utf-8",
    ("[" * 5000 + "]" * 5000).encode(),  # nested past the parser's recursion limit
    b'{"model": "x", "reason": "a\xe2\x80\xa8b\xc2\x85c"}',  # raw U+2028 / U+0085
    b"[1, 2]",
    b"\x00" * 64,
]


def test_damaged_lines_never_crash_a_read_and_are_outside_the_chain(cfg, checkpoint, capsys):
    v1, _ = candidate(cfg, checkpoint)
    with open(cfg.audit_path, "ab") as f:
        f.write(b"\n".join(JUNK) + b"\n")
    problems, notes = audit.verify_log(cfg)
    assert not problems and len(notes) == len(JUNK) - 1  # the U+2028 line is another model's
    assert [r["action"] for r in audit.read_history(cfg)][-1] == "challenger_set"
    assert main_history(store(cfg)) == 0 and "challenger_set" in capsys.readouterr().out
    approve(v1, "alice", "fine", config=cfg)  # junk between records does not break the chain
    assert get_alias("champion", cfg) == v1 and audit.verify_log(cfg)[0] == []


def test_champion_set_outside_the_workflow_is_drift(cfg, two_approved, checkpoint, capsys):
    """The next approve + rollback must not make a champion set through MlflowClient legit."""
    v1, v2 = two_approved
    v3, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.95}, PASSING, n=3)
    mlflow_client(cfg).set_registered_model_alias(cfg.model_name, "champion", v1)
    assert main_status(store(cfg)) == 0
    out = capsys.readouterr().out
    assert out.startswith("WARNING: registry drift: champion is 1 in the registry but 2")
    for call in (lambda: approve(v3, "alice", "ok", config=cfg),
                 lambda: rollback("dave", "incident", config=cfg),
                 lambda: reject(v3, "carol", "no", config=cfg)):  # fmt: skip
        with pytest.raises(PromotionRefused, match="registry drift: champion is 1"):
            call()
    assert get_alias("champion", cfg) == v1 and get_alias("challenger", cfg) == v3
    refused = audit.read_history(cfg, action="refused")
    assert len(refused) == 3 and "registry drift" in refused[0]["evidence"]["problems"][0]
    # Put back as the log says, everything works again.
    mlflow_client(cfg).set_registered_model_alias(cfg.model_name, "champion", v2)
    approve(v3, "alice", "ok", config=cfg)
    assert rollback("dave", "incident", config=cfg)["version"] == v2
    assert status(cfg)["warnings"] == []


def test_alias_moved_under_a_decision_is_never_touched(cfg, checkpoint, monkeypatch):
    """Compare-and-set: another process moves champion between our record and our move;
    we leave its alias alone and say so, and the next command does not paper over it."""
    v1, _ = candidate(cfg, checkpoint)
    approve(v1, "alice", "first", config=cfg)
    v2, _ = candidate(cfg, checkpoint, n=2)
    real = chain.append_line

    def racing_append(path, record):
        real(path, record)
        if record["action"] == "approved":
            mlflow_client(cfg).delete_registered_model_alias(cfg.model_name, "champion")

    monkeypatch.setattr(chain, "append_line", racing_append)
    with pytest.raises(AuditIntegrityError, match="champion is unset in the registry, not 1"):
        approve(v2, "bob", "ok", config=cfg)
    monkeypatch.undo()
    assert get_alias("champion", cfg) is None  # what the other process did stays
    with pytest.raises(AuditIntegrityError, match="moved outside the approval workflow"):
        rollback("dave", "incident", config=cfg)
    # The operator restores what the record expected; the next command completes it.
    mlflow_client(cfg).set_registered_model_alias(cfg.model_name, "champion", v1)
    assert rollback("dave", "incident", config=cfg)["version"] == v1
    assert get_alias("champion", cfg) == v1 and status(cfg)["warnings"] == []


class Killed(BaseException):
    """Stands for SIGKILL at a point of a decision (the real kills: the slow tests)."""


def test_decision_killed_after_its_record_is_completed_by_the_next_command(
    cfg, checkpoint, monkeypatch
):
    v1, _ = candidate(cfg, checkpoint)

    def killed(record, config, client):
        raise Killed

    monkeypatch.setattr(audit, "_complete", killed)
    with pytest.raises(Killed):
        approve(v1, "alice", "ok", config=cfg)
    monkeypatch.undo()
    assert get_alias("champion", cfg) is None  # written, not applied
    assert any("was interrupted" in w for w in status(cfg)["warnings"])
    with pytest.raises(PromotionRefused, match="no pending approval"):
        approve(v1, "alice", "ok", config=cfg)  # completes the first, then is refused
    assert get_alias("champion", cfg) == v1 and get_alias("challenger", cfg) is None
    assert status(cfg)["warnings"] == []


def test_decision_killed_before_its_record_moved_nothing(cfg, checkpoint, monkeypatch):
    v1, _ = candidate(cfg, checkpoint)

    def killed(path, record):
        raise Killed

    monkeypatch.setattr(chain, "append_line", killed)
    with pytest.raises(Killed):
        approve(v1, "alice", "ok", config=cfg)
    monkeypatch.undo()
    assert get_alias("champion", cfg) is None and status(cfg)["warnings"] == []
    approve(v1, "alice", "ok", config=cfg)
    assert get_alias("champion", cfg) == v1


def test_read_only_commands_create_nothing(cfg, checkpoint, tmp_path, capsys):
    # A store that does not exist stays that way.
    absent = tmp_path / "nothing"
    argv = ["--tracking-uri", f"sqlite:///{absent / 'mlflow.db'}",
            "--audit-path", str(absent / "audit.jsonl")]  # fmt: skip
    assert main_status(argv) == 1 and main_history(argv) == 0
    assert not absent.exists()
    # A misspelt model in a store that exists: one line, nothing registered or created.
    v1, _ = candidate(cfg, checkpoint)
    client = mlflow_client(cfg)
    models = {m.name for m in client.search_registered_models(max_results=1000)}
    experiments = {e.name for e in client.search_experiments()}
    files = sorted(p.name for p in Path(cfg.audit_path).parent.iterdir())
    typo = ["--tracking-uri", cfg.tracking_uri, "--model", cfg.model_name + "x",
            "--audit-path", str(tmp_path / "typo" / "audit.jsonl")]  # fmt: skip
    capsys.readouterr()
    assert main_status(typo) == 1
    err = capsys.readouterr().err
    assert err == f"error: no registered model '{cfg.model_name}x' in {cfg.tracking_uri}\n"
    assert main_history(typo) == 0 and main_status(["--json", *typo]) == 1
    assert {m.name for m in client.search_registered_models(max_results=1000)} == models
    assert {e.name for e in client.search_experiments()} == experiments
    assert sorted(p.name for p in Path(cfg.audit_path).parent.iterdir()) == files
    assert not (tmp_path / "typo").exists()


def test_a_second_writer_or_a_reader_waits_then_fails_cleanly(cfg, checkpoint, monkeypatch, capsys):
    v1, _ = candidate(cfg, checkpoint)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; "
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)", str(lock.lock_path(cfg))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(lock, "WAIT_S", 0.3)
        assert main_approve([v1, "--reason", "ok", "--approver", "alice", *store(cfg)]) == 1
        assert "another promotion command has held" in capsys.readouterr().err
        assert get_alias("champion", cfg) is None
        assert main_status(store(cfg)) == 1  # a reader waits out a writer too, then says so
        assert "another promotion command has held" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    approve(v1, "alice", "ok", config=cfg)  # the kernel dropped the dead holder's lock
    assert get_alias("champion", cfg) == v1


def test_records_from_before_the_chain_are_covered_by_its_first_link(cfg, checkpoint):
    """A log written before the chain existed stays readable; its lines are sealed by the
    first chained record, so editing one of them afterwards is caught."""
    legacy = {"model": cfg.model_name, "version": "0", "action": "refused", "actor": "x",
              "reason": "old", "aliases_before": {}, "aliases_after": {}}  # fmt: skip
    Path(cfg.audit_path).write_text(json.dumps(legacy) + "\n")
    v1, _ = candidate(cfg, checkpoint)
    assert audit.verify_log(cfg)[0] == []
    kept = lines(cfg)
    rewrite(cfg, [json.dumps({**legacy, "actor": "mallory"}) + "\n"] + kept[1:])
    assert (
        "the first chained record does not cover the records before it"
        in (audit.verify_log(cfg)[0][0])
    )


def test_a_record_moves_only_what_its_action_means(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    with pytest.raises(ValueError, match="cannot move the aliases"):
        audit.record_decision("refused", version=v1, actor="m", reason="x", config=cfg,
                              aliases_before={}, aliases_after={"champion": v1})  # fmt: skip
    assert get_alias("champion", cfg) is None


def test_infra_failures_above_the_threshold_block_promotion(cfg, checkpoint, tmp_path):
    from test_promote_request import _stage_outputs

    from components.promote.request import main_request

    validation = tmp_path / "report.json"
    validation.write_text(json.dumps({"passed": True, "failure_rate": 0.0}))
    preset = tmp_path / "preset.yaml"
    preset.write_text(json.dumps({"promote": {
        "model_name": cfg.model_name, "tracking_uri": cfg.tracking_uri,
        "artifact_root": cfg.artifact_root, "audit_path": cfg.audit_path}}))  # fmt: skip
    assert PromotionConfig().max_infra_failure_rate == 0.05
    ev, sf = _stage_outputs(tmp_path, "crashy", 0.9, infra=3)  # 3 of 20 episodes
    out = tmp_path / "out"
    assert main_request(["--policy", str(checkpoint), "--eval", str(ev), "--safety", str(sf),
                         "--validation", str(validation), "--data-version", "d1",
                         "--config-hash", "c1", "--preset", str(preset),
                         "--out", str(out)]) == 0  # fmt: skip
    result = json.loads((out / "result.json").read_text())
    assert not result["gates_passed"] and not result["challenger"]
    failed = [c for c in result["gate_checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["infra_failure_rate"]
    assert failed[0]["reason"] == "infra_failure_rate 0.1500 > max 0.0500 (3 of 20 episodes)"
    assert get_alias("challenger", cfg) is None
