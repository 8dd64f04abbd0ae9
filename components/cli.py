"""`agentrl` command line. Subcommands import their component lazily so startup stays fast.

`run` (the `agentrl` console script, `python -m components.cli`) is the one error boundary:
an expected error (a bad argument or preset value, a missing input, a refused operation)
is one line on stderr naming what was wrong, exit 2 (usage/config) or 1 (operation); any
other error is one line plus the file holding its traceback (`--debug` shows it instead);
Ctrl-C or SIGTERM stops what the command started and exits 130 / 143
(components/shutdown.py); a closed pipe exits quietly.
`main(argv)` dispatches without the boundary, for callers in this process (in-process
stages, tests) that want the exception.
"""

from __future__ import annotations

import importlib
import os
import sys

# (group, command) -> "module:function"; each function takes the remaining argv.
COMMANDS: dict[tuple[str, str], tuple[str, str]] = {
    ("tasks", "generate"): ("components.tasks.__main__:main_generate", "generate a task suite"),
    ("tasks", "check"): (
        "components.tasks.__main__:main_sandboxed_check",
        "gate tasks (sandboxed)",
    ),
    ("tasks", "import"): (
        "components.tasks.__main__:main_sandboxed_import",
        "load, gate, copy tasks",
    ),
    ("tasks", "export"): ("components.tasks.__main__:main_export", "tasks as Harbor tasks"),
    ("tasks", "prepare"): (
        "components.tasks.__main__:main_prepare",
        "build task environments once",
    ),
    ("tasks", "mine"): ("components.tasks.__main__:main_mine", "mine tasks from a repository"),
    ("env", "eval"): ("components.env.__main__:main_eval", "run a policy over tasks"),
    ("env", "isolation"): ("components.env.__main__:main_isolation", "show sandbox protections"),
    ("env", "serve"): ("components.env_service.__main__:main_serve", "environment as a service"),
    ("data", "ingest"): ("components.data.__main__:main_ingest", "ingest trajectory logs"),
    ("data", "validate"): ("components.data.__main__:main_validate", "validate (GX) + quarantine"),
    ("data", "snapshot"): ("components.data.__main__:main_snapshot", "DVC add + push data/"),
    ("data", "versions"): ("components.data.__main__:main_versions", "list data versions"),
    ("data", "rollback"): ("components.data.__main__:main_rollback", "restore a data version"),
    ("data", "repair"): ("components.data.__main__:main_repair", "rebuild a damaged data.dvc"),
    ("policy", "init"): ("components.policy.__main__:main_init", "build the tiny policy"),
    ("policy", "fetch"): ("components.policy.__main__:main_fetch", "registry checkpoint -> HF"),
    ("policy", "merge"): ("components.policy.__main__:main_merge", "fold LoRA into base"),
    ("train", "sft"): ("components.train.__main__:main_sft", "supervised fine-tuning"),
    ("rollout", "sample"): ("components.rollout.__main__:main_sample", "sample + verify episodes"),
    ("rollout", "export"): ("components.rollout.__main__:main_export", "episodes as ATIF"),
    ("train", "rs"): ("components.train.__main__:main_rejection_sampling", "rejection sampling"),
    ("train", "dpo"): ("components.train.__main__:main_dpo", "DPO on success/failure pairs"),
    ("train", "grpo"): ("components.train.__main__:main_grpo", "multi-turn GRPO"),
    ("train", "ppo"): ("components.train.__main__:main_ppo", "PPO with a value head"),
    ("evaluate", "run"): ("components.evaluate.__main__:main_evaluate", "metrics + report"),
    ("evaluate", "safety"): ("components.evaluate.__main__:main_safety", "reward-hacking suite"),
    ("promote", "approve"): ("components.promote.__main__:main_approve", "approve a challenger"),
    ("promote", "reject"): ("components.promote.__main__:main_reject", "reject a challenger"),
    ("promote", "rollback"): ("components.promote.__main__:main_rollback", "restore champion"),
    ("promote", "request"): ("components.promote.__main__:main_request", "gates + challenger"),
    ("promote", "status"): ("components.promote.__main__:main_status", "aliases + pending"),
    ("promote", "history"): ("components.promote.__main__:main_history", "audit log"),
    ("serve", ""): ("components.serve.__main__:main_serve", "OpenAI-compatible model server"),
    ("reproduce", ""): ("flows.reproduce:main", "rerun a registered version, compare"),
    ("rescore", ""): ("components.evaluate.__main__:main_rescore", "re-judge stored episodes"),
    ("demo", ""): ("components.evaluate.__main__:main_demo", "environment demo (make demo)"),
}


def cpu_accelerator_default() -> None:
    """Library defaults for a command line (a value already set wins): DeepSpeed
    (which transformers imports when it saves a model) warns in every process that finds
    no GPU, so where the machine has no NVIDIA device say CPU up front; transformers draws
    a progress bar for every shard it writes or loads, noise in a pipeline's log."""
    if not os.path.exists("/dev/nvidiactl"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # Prefect's server phones home (telemetry) from its own database session: offline that
    # is a traceback in the run's log, and on a busy machine a "database is locked" one.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    mlflow_telemetry_default()
    # OpenMP threads that wait by sleeping, not spinning (read when torch loads): on a
    # loaded machine, or with more threads than free cores, spinning made a training step
    # ~3x slower than one thread (bench/results/threads-*.md); the work is split the same.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def mlflow_telemetry_default() -> None:
    """MLflow's telemetry off unless the user opts in (MLFLOW_DISABLE_TELEMETRY=false): at
    `import mlflow` MLflow 3.x starts a client that writes an installation id to
    ~/.config/mlflow/telemetry.json and sends usage events. DO_NOT_TRACK, set to any true
    value, wins (MLflow itself honours only the exact "true")."""
    if os.environ.get("DO_NOT_TRACK", "").strip().lower() in ("1", "true", "yes", "on"):
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def usage(group: str = "") -> str:
    lines = [f"usage: agentrl {group or 'GROUP'} COMMAND [options]   (COMMAND --help for "
             "its options; --debug shows tracebacks)", ""]  # fmt: skip
    for (g, cmd), (_, text) in COMMANDS.items():
        if not group or g == group:
            lines.append(f"  {(g + ' ' + cmd).strip():<18} {text}")
    return "\n".join(lines)


def stage_threads() -> None:
    """A stage the launcher started (AGENTRL_TORCH_THREADS set: the preset's
    `launcher.torch_threads`) runs torch with that many intra-op threads; torch alone would
    cap OMP_NUM_THREADS at the machine's core count. Other command lines never import torch
    here."""
    threads = os.environ.get("AGENTRL_TORCH_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))


GROUPS = sorted({g for g, _ in COMMANDS})


def _group_commands(group: str) -> str:
    return ", ".join(cmd for g, cmd in COMMANDS if g == group)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `argv` to its command; errors propagate (`run` is the boundary). Called
    without argv (as a console script) it is `run()`."""
    if argv is None:
        return run()
    cpu_accelerator_default()
    stage_threads()
    argv = list(sys.argv[1:] if argv is None else argv)
    from components.cli_args import UsageError

    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        if not argv:
            raise UsageError("agentrl: missing command (listed above)")
        return 0
    group = argv.pop(0)
    if group not in GROUPS:
        raise UsageError(f"agentrl: unknown command {group!r} (groups: {', '.join(GROUPS)})")
    if (group, "") in COMMANDS:
        key = (group, "")
    else:
        if not argv or argv[0] in ("-h", "--help"):
            print(usage(group))
            if not argv:
                raise UsageError(f"agentrl {group}: missing command (one of "
                                 f"{_group_commands(group)})")  # fmt: skip
            return 0
        key = (group, argv.pop(0))
        if key not in COMMANDS:
            raise UsageError(f"agentrl: unknown command {' '.join(key)!r} ({group} commands: "
                             f"{_group_commands(group)})")  # fmt: skip
    module, func = COMMANDS[key][0].split(":")
    return int(getattr(importlib.import_module(module), func)(argv) or 0)


def command(argv: list[str]):
    """The function that `agentrl ARGV` runs (imported; a stage's carries its contract,
    components/stage_contract.py)."""
    group, rest = argv[0], argv[1:]
    key = (group, "") if (group, "") in COMMANDS else (group, rest[0] if rest else "")
    module, func = COMMANDS[key][0].split(":")
    return getattr(importlib.import_module(module), func)


# Errors of components that mean "the input or the operation was refused", by module:
# only modules already imported can have raised them, so none is imported here.
EXPECTED_ERRORS = {
    "components.typed_config": ("ConfigError",),
    "components.tasks.task": ("TaskFormatError",),
    "components.promote.errors": ("PromotionError",),
    "components.data.ingest": ("DatasetError",),
    "components.data.dvc_store": ("VersioningError",),
    "components.data.writers": ("LockTimeout",),
    "components.runtime": ("ServiceStartError",),
    "components.rollout.policy_sync": ("PolicySyncError",),
    "components.evaluate.rescore": ("RescoreError",),
}


def _expected(error: BaseException) -> int | None:
    """The exit status of an expected error (2 usage/config, 1 operation), else None."""
    from components.cli_args import CommandError

    if isinstance(error, CommandError):
        return error.code
    config_error = getattr(sys.modules.get("components.typed_config"), "ConfigError", ())
    if config_error and isinstance(error, config_error):
        return 2
    for module, names in EXPECTED_ERRORS.items():
        loaded = sys.modules.get(module)
        if loaded and isinstance(error, tuple(getattr(loaded, n) for n in names)):
            return 1
    return 1 if isinstance(error, OSError) else None


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 600 else text[:600] + " ..."


def _error_lines(error: BaseException) -> list[str]:
    """An expected error as printed: one line, or one per problem of a preflight."""
    from components.cli_args import PreflightError

    if isinstance(error, PreflightError):
        return [one_line(ValueError(problem)) for problem in error.problems]
    return [one_line(error)]


def _save_traceback(error: BaseException) -> str:
    import tempfile
    import time
    import traceback

    folder = os.path.join(tempfile.gettempdir(), "agentrl-tracebacks")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write("".join(traceback.format_exception(error)))
    return path


def boundary(call, prog: str, debug: bool = False) -> int:
    """Run `call()` (an exit status), turning every error into one line and a status.
    In the main thread, where no one else has taken them, SIGINT and SIGTERM stop the
    command as components/shutdown.py says: what it started stopped, what it mounted and
    created removed, its MLflow runs KILLED, exit 130 / 143."""
    from components import shutdown

    restore = shutdown.install(prog)
    try:
        return _boundary(call, prog, debug)
    finally:
        restore()


def _boundary(call, prog: str, debug: bool) -> int:
    try:
        return int(call() or 0)
    except SystemExit as e:  # argparse --help, or a command that exits with a message
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(one_line(e.code), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from components.runtime import begin_stopping, stop_descendants

        begin_stopping()  # worker threads still running start no new sandbox or folder
        stop_descendants()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `agentrl ... | head -1`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - this is the boundary
        code = _expected(e)
        if debug or (code is None and os.environ.get("AGENTRL_DEBUG")):
            raise
        if code is not None:
            for message in _error_lines(e):
                print(message if message.startswith(prog.split()[0]) else f"{prog}: {message}",
                      file=sys.stderr)  # fmt: skip
            return code
        print(f"{prog}: internal error {type(e).__name__}: {one_line(e)} (traceback: "
              f"{_save_traceback(e)}; --debug shows it)", file=sys.stderr)  # fmt: skip
        return 1


def run(argv: list[str] | None = None) -> int:
    """`agentrl ARGS`: `main` behind the error boundary. `--debug` anywhere in ARGS shows
    tracebacks instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    words = [a for a in argv[:2] if not a.startswith("-")]
    prog = " ".join(["agentrl", *words[:1], *(words[1:] if tuple(words) in COMMANDS else [])])
    return boundary(lambda: main(argv), prog, debug)


if __name__ == "__main__":
    sys.exit(run())
