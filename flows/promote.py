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


PROG = "python -m flows.promote"


def run(a: argparse.Namespace) -> int:
    """The flow with Prefect's API as every entry point gets it (flows/retrain_main.py
    `prefect_api`: health-waited with the preset's `runtime.startup_timeout_s`), in a
    thread of its own so Ctrl-C and SIGTERM stay with components/shutdown.py's handler."""
    from components.preset import load_preset
    from components.shutdown import in_worker_thread
    from flows.retrain_main import prefect_api

    budget = load_preset(a.preset).section("runtime").startup_timeout_s
    with prefect_api(budget):
        print(in_worker_thread(lambda: promote(a.version, a.timeout_s)))
    return 0


def main(argv: list[str] | None = None) -> int:
    from components.cli import boundary, cpu_accelerator_default
    from components.cli_args import ArgumentParser, preset_file
    from components.preset import DEFAULT_PRESET

    cpu_accelerator_default()
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--version", required=True)
    p.add_argument("--timeout-s", type=int, default=86400)
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        type=preset_file,
        help="preset whose runtime section bounds the Prefect server's start",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    argv = list(sys.argv[1:] if argv is None else argv)
    return boundary(lambda: run(p.parse_args(argv)), PROG, debug="--debug" in argv)


if __name__ == "__main__":
    sys.exit(main())
