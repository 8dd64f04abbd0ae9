"""CLI: `agentrl env serve --tasks DIR [--preset P] [--host 127.0.0.1] [--port 8100]
[--workers N] [--max-queue Q] [--request-timeout-s S] [--require-verdict-key]` (also
`python -m components.env_service ...`).

Before any worker starts, the verdict key the server signs records with is read (made on
first use, as everywhere: components/verifier/provenance.py); a server that cannot read or
make it refuses to start with one line: its records would never train. With
`--require-verdict-key` (the Kubernetes Deployment, infra/base/env-service.yaml) the key
must exist already, i.e. the Secret `agentrl-verdict-key` is mounted: a key made here would
sign records no trainer accepts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from components.cli_args import (
    ArgumentParser,
    CommandError,
    port,
    positive_float,
    positive_int,
    preset_file,
)


def main_serve(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="agentrl env serve",
        description="Serve the coding environment over HTTP: sessions per episode, run by "
        "worker processes; the verdict and reward are computed here (components/env_service/).",
    )
    p.add_argument(
        "--tasks",
        required=True,
        type=suite_dir,
        help="the task suite clients name tasks from, by id (absent or empty: read again "
        "when it changes or a session names a task it lacks)",
    )
    p.add_argument("--preset", type=preset_file, help="preset whose `sandbox` section to use")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=port, default=8100)
    p.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    p.add_argument(
        "--max-queue",
        type=positive_int,
        default=64,
        help="requests that may wait for a worker (more: 503)",
    )
    p.add_argument(
        "--request-timeout-s",
        type=positive_float,
        default=300.0,
        help="longest one request may take (past it: 504, the worker replaced)",
    )
    p.add_argument(
        "--require-verdict-key",
        action="store_true",
        help="refuse to start unless the verdict key exists already (a mounted Secret)",
    )
    args = p.parse_args(argv)
    key = verdict_key_preflight(args.require_verdict_key)
    from components.env_service.server import EnvServiceConfig, serve
    from components.sandbox.config import SandboxConfig
    from components.tasks.task import load_tasks
    from components.typed_config import ConfigError, config_from_dict

    tasks, errors = load_tasks(args.tasks)
    if errors:
        raise CommandError(f"invalid task: {errors[0]}")
    sandbox = {}
    if args.preset:
        from components.preset import load_preset

        sandbox = load_preset(args.preset).raw("sandbox")
    try:
        config_from_dict(SandboxConfig, sandbox, f"{args.preset or 'defaults'}:sandbox")
    except ConfigError as e:
        raise CommandError(str(e)) from None
    config = EnvServiceConfig(args.workers, args.max_queue, args.request_timeout_s)
    print(
        f"agentrl env serve: {len(tasks)} tasks in {args.tasks} (read again when it "
        f"changes), {args.workers} workers on "
        f"http://{args.host}:{args.port}; records signed with the verdict key {key}",
        flush=True,
    )
    serve(args.tasks, sandbox, config, host=args.host, port=args.port)
    return 0


def suite_dir(text: str) -> Path:
    """--tasks: a folder, or a path where one will be (a cluster's server starts before the
    flow writes its suite on the shared volume)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return path


def verdict_key_preflight(require_existing: bool) -> str:
    """The verdict key's path once it reads (module docstring); CommandError otherwise."""
    from components.verifier.provenance import (
        STATE_DIR_ENV,
        ProvenanceError,
        key_path,
        verdict_key,
    )

    try:
        path = key_path()
        if require_existing and not path.exists():
            raise ProvenanceError(
                f"verdict key {path}: missing, and --require-verdict-key forbids making one "
                f"({STATE_DIR_ENV}={os.environ.get(STATE_DIR_ENV, '')!r}): create the Secret "
                "agentrl-verdict-key (docs/scale-out.md)"
            )
        verdict_key()
    except ProvenanceError as e:
        raise CommandError(f"{e}; the server's records could never train") from None
    return str(path)


if __name__ == "__main__":
    from components.cli import boundary

    argv = [a for a in sys.argv[1:] if a != "--debug"]
    sys.exit(boundary(lambda: main_serve(argv), "agentrl env serve", "--debug" in sys.argv))
