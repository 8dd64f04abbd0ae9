"""Fork server for the multi-process promotion tests (test_promote_races.py).

Imports MLflow and the promotion code once and opens no store; then, for every request
line on stdin, forks one child per operation. So children start their decisions within
milliseconds of each other, and a kill lands inside a decision, not in the imports.

    stdin:  {"ops": [OP, ...], "start_at": EPOCH_S}
            OP = {"op": "approve" | "rollback" | "request_and_approve", "config": {...},
                  "version": "3", "checkpoint": DIR, "n": 7, "delay_s": 0.1,
                  "ready": FILE}  (touched once the store is open, just before the decision)
    stdout: {"pids": [...]} once forked, then {"exits": [...]} when all have ended:
            0 done, 1 refused (PromotionError), 2 any other error (traceback on stderr),
            -9 killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)]

import mlflow  # noqa: E402, F401  (imported once, before any fork)
from promote_helpers import DATA_OK, PASSING, lineage  # noqa: E402

from components.promote import approval  # noqa: E402
from components.promote.client import find_model, read_client  # noqa: E402
from components.promote.config import PromotionConfig  # noqa: E402
from components.promote.errors import PromotionError  # noqa: E402
from components.promote.gates import evaluate_gates  # noqa: E402
from components.promote.lock import promotion_lock  # noqa: E402
from components.promote.registry import register_candidate  # noqa: E402


def request_and_approve(op: dict, cfg: PromotionConfig) -> None:
    """What `promote request` then `promote approve` do: register, gate against the
    champion and request under the lock, approve."""
    version = register_candidate(op["checkpoint"], lineage(op["n"]), cfg, actor="trainer")
    with promotion_lock(cfg):
        decision = evaluate_gates(PASSING, PASSING, DATA_OK, cfg)
        evidence = {"candidate_metrics": PASSING, "champion_metrics": PASSING}
        approval.request_approval(version, decision, evidence, config=cfg)
    approval.approve(version, "racer-b", "requested and approved", config=cfg)


def child(op: dict, start_at: float) -> int:
    cfg = PromotionConfig(**op["config"])
    if op.get("ready"):  # open the store first, then say the decision starts now
        find_model(read_client(cfg), cfg)
        Path(op["ready"]).touch()
    time.sleep(max(0.0, start_at - time.time()) + op.get("delay_s", 0.0))
    try:
        if op["op"] == "approve":
            approval.approve(op["version"], op.get("actor", "racer"), "race", config=cfg)
        elif op["op"] == "rollback":
            approval.rollback("racer", "fault test", config=cfg)
        else:
            request_and_approve(op, cfg)
    except PromotionError:
        return 1
    except BaseException:
        traceback.print_exc()
        return 2
    return 0


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pids = []
        for op in request["ops"]:
            pid = os.fork()
            if pid == 0:
                os._exit(child(op, request.get("start_at", 0.0)))
            pids.append(pid)
        print(json.dumps({"pids": pids}), flush=True)
        exits = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        print(json.dumps({"exits": exits}), flush=True)


if __name__ == "__main__":
    main()
