"""promote: wait for a person to approve or reject the challenger in the Prefect UI.

The run pauses with a typed form (approve, approver, reason); `champion` moves only on
approval (components/promote/approval.py). The same decision can be given from a shell:
`agentrl promote approve VERSION --reason ... [--flow-run-id ID]`.

    .venv/bin/python -m flows.promote --version 3
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow


@flow(name="promote", log_prints=True)
def promote(version: str, timeout_s: int = 86400) -> str:
    from components.promote.approval import wait_for_approval_in_prefect

    print(f"waiting for a decision on version {version} (Prefect UI: resume this run)")
    outcome = wait_for_approval_in_prefect(version, timeout_s)
    print(f"version {version}: {outcome}")
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.promote", description=__doc__)
    p.add_argument("--version", required=True)
    p.add_argument("--timeout-s", type=int, default=86400)
    a = p.parse_args(argv)
    print(promote(a.version, a.timeout_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
