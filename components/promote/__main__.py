"""Command lines of promotion; components/cli.py mounts them as `agentrl promote ...`.

    agentrl promote approve VERSION --reason TEXT [--approver NAME] [--flow-run-id ID]
    agentrl promote reject VERSION --reason TEXT [--approver NAME] [--flow-run-id ID]
    agentrl promote rollback --reason TEXT [--approver NAME]
    agentrl promote status [--json]
    agentrl promote history [--version V] [--action A] [--json]
    agentrl promote request --policy DIR --eval DIR ... --out DIR   (the pipeline's stage)

Every command takes --preset FILE (its `promote` section, components/promote/config.py;
no preset or no section: the defaults), and --model NAME, --tracking-uri URI and
--audit-path FILE, which override it. The approver defaults to $USER; a reason is
required. With --flow-run-id, approve/reject resume that paused Prefect run with the same
answer as its UI form would, and the flow applies it (Prefect has no resume command).
`status` and `history` create nothing, and warn when the audit log does not verify or the
registry's aliases are not the ones it records.
Exit status: 0 done, 1 refused by the rules, an unknown model, or (history) an audit log
that does not verify, 2 usage. Every refusal is one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys

from components.cli_args import ArgumentParser, nonempty, positive_int, preset_file
from components.cli_args import tracking_uri as tracking_uri_arg
from components.promote.audit import default_actor
from components.promote.client import check_store
from components.promote.config import PromotionConfig, promotion_config
from components.promote.errors import PromotionError
from components.stage_contract import PromotionResult, stage


def _parser(prog: str, description: str) -> ArgumentParser:
    p = ArgumentParser(prog=f"agentrl promote {prog}", description=description)
    p.add_argument(
        "--preset", default=None, type=preset_file,
        help="preset YAML; its `promote` section configures promotion",
    )  # fmt: skip
    p.add_argument("--model", default=None, type=nonempty,
                   help="registered model name (default agentrl-coder)")  # fmt: skip
    p.add_argument("--tracking-uri", default=None, type=tracking_uri_arg,
                   help="MLflow URI (default embedded SQLite)")  # fmt: skip
    p.add_argument("--audit-path", default=None, help="JSONL audit log (default mlruns/)")
    return p


def _person(p: ArgumentParser) -> None:
    p.add_argument("--reason", required=True, help="why (recorded; must not be empty)")
    p.add_argument(
        "--approver", default=None, help="who decides (recorded; default $USER / login name)"
    )


def _config(args) -> PromotionConfig:
    return promotion_config(
        args.preset,
        model_name=args.model,
        tracking_uri=args.tracking_uri,
        audit_path=args.audit_path,
    )


def _check_person(p: ArgumentParser, args) -> str:
    if not args.reason.strip():
        p.error("--reason must not be empty")
    approver = (args.approver or default_actor()).strip()
    if not approver:
        p.error("--approver must not be empty")
    return approver


def _decide(kind: str, argv: list[str] | None) -> int:
    p = _parser(kind, f"{kind.capitalize()} a pending challenger (recorded in the audit log).")
    p.add_argument("version", type=lambda t: str(positive_int(t)),
                   help="model version number (the current challenger)")  # fmt: skip
    _person(p)
    p.add_argument(
        "--flow-run-id", default=None, help="resume this paused Prefect approval run instead"
    )
    args = p.parse_args(argv)
    approver = _check_person(p, args)
    from components.promote.approval import approve, reject

    if args.flow_run_id:
        from prefect.flow_runs import resume_flow_run

        answer = {"approve": kind == "approve", "approver": approver, "reason": args.reason}
        resume_flow_run(args.flow_run_id, run_input=answer)
        print(f"resumed flow run {args.flow_run_id} with {kind}; the flow applies the decision")
        return 0
    try:
        config = _config(args)
        check_store(config)  # a damaged store is named before the lock is taken
        record = (approve if kind == "approve" else reject)(
            args.version, approver, args.reason, config=config
        )
    except (PromotionError, OSError) as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {k: record[k] for k in ("action", "version", "actor", "time_utc", "aliases_after")},
            indent=2,
        )
    )
    return 0


def main_approve(argv: list[str] | None = None) -> int:
    return _decide("approve", argv)


def main_reject(argv: list[str] | None = None) -> int:
    return _decide("reject", argv)


def main_rollback(argv: list[str] | None = None) -> int:
    p = _parser("rollback", "Restore the previous approved champion (recorded).")
    _person(p)
    args = p.parse_args(argv)
    approver = _check_person(p, args)
    from components.promote.approval import rollback

    try:
        config = _config(args)
        check_store(config)
        record = rollback(approver, args.reason, config=config)
    except (PromotionError, OSError) as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    print(f"champion -> version {record['version']} (was {record['evidence']['rolled_back_from']})")
    return 0


def main_status(argv: list[str] | None = None) -> int:
    p = _parser("status", "Show aliases, champion history and pending approvals.")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    from components.promote.approval import status

    try:
        config = _config(args)
        check_store(config)
        st = status(config)
    except (PromotionError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    for warning in st["warnings"]:
        print(f"WARNING: {warning}")
    print(f"model {st['model']}  ({st['tracking_uri']})")
    for alias in ("champion", "challenger"):
        print(f"  {alias:<11} {st['aliases'].get(alias, '-')}")
    print(
        f"  approved by {st['champion_approved_by'] or '-'}; "
        f"history {st['champion_history'] or '-'}"
    )
    judged, current = st["champion_verifier_version"], st["current_verifier_version"]
    stale = "" if not judged or judged == current else "  (stale: agentrl rescore it)"
    print(f"  verifier    champion judged by {judged or '-'}; current {current}{stale}")
    if not st["pending"]:
        print("no pending approvals")
    for item in st["pending"]:
        print(f"pending: version {item['version']} (requested {item['requested_at']})")
    return 0


def main_history(argv: list[str] | None = None) -> int:
    p = _parser("history", "Print the audit log of promotion decisions.")
    p.add_argument("--version", default=None, type=lambda t: str(positive_int(t)),
                   help="only this model version")  # fmt: skip
    p.add_argument("--action", default=None, help="only this action (approved, rejected, ...)")
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    args = p.parse_args(argv)
    from components.promote.audit import read_history, verify_log
    from components.promote.lock import shared_lock

    config = _config(args)
    try:
        check_store(config)  # a damaged store is named even when the log is empty
        with shared_lock(config):
            records = read_history(config, version=args.version, action=args.action)
            problems, notes = verify_log(config)
    except (PromotionError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for rec in records:
        if args.json:
            print(json.dumps(rec, sort_keys=True))
        else:
            time, version, action, actor, reason = (
                str(rec.get(k, "?")) for k in ("time_utc", "version", "action", "actor", "reason")
            )
            print(f"{time}  v{version:<4} {action:<18} {actor:<16} {reason}")
    if not records and not args.json:
        print("no audit records")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"WARNING: audit log does not verify: {problem}", file=sys.stderr)
    return 1 if problems else 0


@stage("promote", result=PromotionResult)
def main_request(argv: list[str]) -> int:
    """`agentrl promote request`: the pipeline's last stage, gates and the challenger
    (components/promote/request.py)."""
    from components.promote.request import main_request as request

    return request(argv)


COMMANDS = {
    "approve": main_approve,
    "reject": main_reject,
    "rollback": main_rollback,
    "status": main_status,
    "history": main_history,
    "request": main_request,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: python -m components.promote {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        sys.exit(2)
    from components.cli import run

    sys.exit(run(["promote", *sys.argv[1:]]))
