"""No path promotes without an approval.

Every public function of components.promote is listed below, either as one that may move
`champion` (approve and what calls it; rollback, which only returns to an earlier approved
champion) or as one that must leave it alone. The second group is called against a registry
with a champion and a pending challenger, and `champion` is checked after each call. A new
public function fails `test_every_public_function_is_classified` until it is put in a group.
"""

from __future__ import annotations

import inspect

import pytest
from promote_helpers import DATA_OK, PASSING, candidate, lineage

import components.promote.__main__ as cli
from components.promote import approval, audit, chain, client, config, gates, lock, registry

MODULES = (config, client, gates, registry, approval, audit, chain, lock, cli)
MAY_MOVE_CHAMPION = {
    # completes an approve/rollback whose record is written but a killed process did not
    # finish applying (tests/promote/test_promote_integrity)
    "audit.reconcile",
    "approval.approve",
    "approval.wait_for_approval_in_prefect",  # calls approve (tests/promote/test_promote_prefect)
    "__main__.main_approve",  # calls approve, or resumes the Prefect form
    "approval.rollback",  # only to the previous approved champion (tested below)
    "__main__.main_rollback",
}


def _public_functions() -> set[str]:
    names = set()
    for module in MODULES:
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_"):
                names.add(f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
    return names


def _calls_that_must_not_promote(cfg, checkpoint, tmp_path) -> dict:
    """name -> a call of it, each aimed as close to a promotion as that function can get."""
    store = ["--tracking-uri", cfg.tracking_uri, "--model", cfg.model_name,
             "--audit-path", cfg.audit_path]  # fmt: skip

    def refused(fn, *args, **kw):
        with pytest.raises(PermissionError):
            fn(*args, **kw)

    def usage_error(fn, *args):
        from components.cli_args import UsageError

        with pytest.raises(UsageError):
            fn(*args)

    def no_such_run(run_id):
        from components.promote.errors import PromotionError

        with pytest.raises(PromotionError, match=run_id):
            client.check_run(run_id, cfg, "--evaluation-run-id")

    def new_pending():
        return candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=9)[0]

    def log():
        return chain.scan(cfg.resolved_audit_path(), cfg.model_name)

    def locked():
        with lock.promotion_lock(cfg):
            pass
        with lock.shared_lock(cfg):
            pass

    return {
        "chain.canonical": lambda: chain.canonical({"a": 1}),
        "chain.record_hash": lambda: chain.record_hash({"a": 1}),
        "chain.seal": lambda: chain.seal({"a": 1}, 1, chain.GENESIS),
        "chain.link": lambda: chain.link(log().last.record),
        "chain.parse_link": lambda: chain.parse_link("1:ab"),
        "chain.describe": lambda: chain.describe(log().last.record),
        "chain.append_line": lambda: chain.append_line(tmp_path / "other.jsonl", {"a": 1}),
        "chain.read_lines": lambda: chain.read_lines(cfg.resolved_audit_path()),
        "chain.scan": log,
        "chain.head_problems": lambda: chain.head_problems(log(), None, None),
        "lock.lock_path": lambda: lock.lock_path(cfg),
        "lock.promotion_lock": locked,
        "lock.shared_lock": locked,
        "client.read_client": lambda: client.read_client(cfg),
        "client.find_model": lambda: client.find_model(client.read_client(cfg), cfg),
        "client.reserved": lambda: client.reserved({"champion": "2"}),
        "audit.verify_log": lambda: audit.verify_log(cfg, aliases=registry.get_aliases(cfg)),
        "audit.audit_aliases": lambda: audit.audit_aliases(log()),
        "audit.registry_drift": lambda: audit.registry_drift(log(), registry.get_aliases(cfg)),
        "config.load_config": lambda: config.load_config(None),
        "config.promotion_config": lambda: config.promotion_config(None),
        "gates.evaluate_gates": lambda: gates.evaluate_gates(PASSING, None, DATA_OK, cfg),
        "registry.current_git_commit": registry.current_git_commit,
        "registry.adapter_base_tags": lambda: registry.adapter_base_tags(checkpoint),
        "client.mlflow_client": lambda: client.mlflow_client(cfg),
        "registry.register_candidate": lambda: registry.register_candidate(
            checkpoint, lineage(5), cfg
        ),
        "registry.get_aliases": lambda: registry.get_aliases(cfg),
        "registry.get_alias": lambda: registry.get_alias("challenger", cfg),
        "registry.get_version": lambda: registry.get_version("2", cfg),
        "registry.list_versions": lambda: registry.list_versions(cfg),
        "registry.set_alias": lambda: (
            refused(registry.set_alias, "champion", "2", cfg),
            refused(registry.set_alias, "challenger", "2", cfg),
            registry.set_alias("canary", "2", cfg),
        ),
        "registry.delete_alias": lambda: (
            refused(registry.delete_alias, "champion", cfg),
            registry.delete_alias("canary", cfg),
        ),
        "registry.set_version_tags": lambda: (
            refused(registry.set_version_tags, "2", {"approval_status": "approved"}, cfg),
            refused(registry.set_version_tags, "2", {"gates_passed": "true"}, cfg),
            registry.set_version_tags("2", {"note": "hello"}, cfg),
        ),
        "registry.download_version": lambda: registry.download_version("2", cfg, tmp_path / "d"),
        "registry.record_evaluation": lambda: registry.record_evaluation(
            "2", {"success_rate": 0.5}, config=cfg
        ),
        "registry.link_logged_model": lambda: registry.link_logged_model(
            client.mlflow_client(cfg),
            registry.record_evaluation("2", {}, config=cfg),
            cfg.model_name,
            "2",
        ),
        "registry.keep_reports": lambda: registry.keep_reports(client.mlflow_client(cfg), "", {}),
        "client.check_store": lambda: client.check_store(cfg),
        "client.check_run": lambda: no_such_run("0123456789abcdef0123456789abcdef"),
        "client.checked_sqlite_store": lambda: client.checked_sqlite_store(
            tmp_path / "other.db", create=True
        ),
        "audit.default_actor": audit.default_actor,
        "audit.utc_now": audit.utc_now,
        "audit.record_decision": lambda: audit.record_decision(
            "approved", version="2", actor="mallory", reason="forged record", config=cfg
        ),
        "audit.read_history": lambda: audit.read_history(cfg),
        "approval.request_approval": new_pending,
        "approval.reject": lambda: approval.reject(new_pending(), "carol", "no", config=cfg),
        "approval.pending_approvals": lambda: approval.pending_approvals(cfg),
        "approval.status": lambda: approval.status(cfg),
        "__main__.main_reject": lambda: cli.main_reject(["2", "--reason", "no", *store]),
        "__main__.main_status": lambda: cli.main_status(["--json", *store]),
        "__main__.main_history": lambda: cli.main_history(store),
        # The pipeline's request makes a challenger, never a champion
        # (tests/promote/test_promote_request.py plays it whole); here it is refused
        # before it reads anything: no candidate named.
        "__main__.main_request": lambda: usage_error(cli.main_request, store),
    }


def test_every_public_function_is_classified(cfg, checkpoint, tmp_path):
    listed = set(_calls_that_must_not_promote(cfg, checkpoint, tmp_path)) | MAY_MOVE_CHAMPION
    assert _public_functions() == listed


def test_no_function_but_approve_moves_champion(cfg, checkpoint, tmp_path):
    v1, _ = candidate(cfg, checkpoint)
    approval.approve(v1, "alice", "first champion", config=cfg)
    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    assert (v1, v2) == ("1", "2")
    for name, call in _calls_that_must_not_promote(cfg, checkpoint, tmp_path).items():
        call()
        assert registry.get_alias("champion", cfg) == v1, name


def test_rollback_only_returns_to_an_approved_champion(cfg, checkpoint):
    v1, _ = candidate(cfg, checkpoint)
    approval.approve(v1, "alice", "ok", config=cfg)
    v2, _ = candidate(cfg, checkpoint, {**PASSING, "success_rate": 0.9}, PASSING, n=2)
    approval.approve(v2, "bob", "ok", config=cfg)
    approval.rollback("dave", "incident", config=cfg)
    champion = registry.get_alias("champion", cfg)
    assert champion == v1 and registry.get_version(champion, cfg)["tags"]["approved_by"] == "alice"
    # The champion now has no approved predecessor: nothing further to roll back to.
    with pytest.raises(approval.PromotionRefused):
        approval.rollback("dave", "again", config=cfg)
    assert registry.get_alias("champion", cfg) == v1
