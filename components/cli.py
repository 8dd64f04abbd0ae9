"""`agentrl` command line. Subcommands import their component lazily so startup stays fast."""

from __future__ import annotations

import importlib
import os
import sys

# (group, command) -> "module:function"; each function takes the remaining argv.
COMMANDS: dict[tuple[str, str], tuple[str, str]] = {
    ("tasks", "generate"): ("components.tasks.__main__:main_generate", "generate a task suite"),
    ("tasks", "check"): ("components.env.__main__:main_tasks_check", "gate tasks (sandboxed)"),
    ("tasks", "import"): ("components.env.__main__:main_tasks_import", "load, gate, copy tasks"),
    ("tasks", "prepare"): (
        "components.tasks.__main__:main_prepare",
        "build task environments once",
    ),
    ("tasks", "mine"): ("components.tasks.__main__:main_mine", "mine tasks from a repository"),
    ("env", "eval"): ("components.evaluate.__main__:main_env_eval", "run a policy over tasks"),
    ("env", "isolation"): ("components.env.__main__:main_isolation", "show sandbox protections"),
    ("data", "ingest"): ("components.data.__main__:main_ingest", "ingest trajectory logs"),
    ("data", "validate"): ("components.data.__main__:main_validate", "validate (GX) + quarantine"),
    ("data", "snapshot"): ("components.data.__main__:main_snapshot", "DVC add + push data/"),
    ("data", "versions"): ("components.data.__main__:main_versions", "list data versions"),
    ("data", "rollback"): ("components.data.__main__:main_rollback", "restore a data version"),
    ("policy", "init"): ("components.train.__main__:main_policy_init", "build the tiny policy"),
    ("policy", "fetch"): ("components.policy.__main__:main_fetch", "registry checkpoint -> HF"),
    ("policy", "merge"): ("components.train.__main__:main_policy_merge", "fold LoRA into base"),
    ("train", "sft"): ("components.train.__main__:main_sft", "supervised fine-tuning"),
    ("rollout", "sample"): ("components.train.__main__:main_sample", "sample + verify episodes"),
    ("train", "rs"): ("components.train.__main__:main_rejection_sampling", "rejection sampling"),
    ("train", "dpo"): ("components.train.__main__:main_dpo", "DPO on success/failure pairs"),
    ("train", "grpo"): ("components.train.__main__:main_grpo", "multi-turn GRPO"),
    ("evaluate", "run"): ("components.evaluate.__main__:main_evaluate", "metrics + report"),
    ("evaluate", "safety"): ("components.evaluate.__main__:main_safety", "reward-hacking suite"),
    ("promote", "approve"): ("components.promote.__main__:main_approve", "approve a challenger"),
    ("promote", "reject"): ("components.promote.__main__:main_reject", "reject a challenger"),
    ("promote", "rollback"): ("components.promote.__main__:main_rollback", "restore champion"),
    ("promote", "request"): ("components.promote.request:main_request", "gates + challenger"),
    ("promote", "status"): ("components.promote.__main__:main_status", "aliases + pending"),
    ("promote", "history"): ("components.promote.__main__:main_history", "audit log"),
    ("serve", ""): ("components.serve.__main__:main_serve", "OpenAI-compatible model server"),
    ("reproduce", ""): ("flows.reproduce:main", "rerun a registered version, compare"),
    ("demo", ""): ("components.evaluate.__main__:main_demo", "environment demo (make demo)"),
}


def cpu_accelerator_default() -> None:
    """Library defaults for a command line's output (a value already set wins): DeepSpeed
    (which transformers imports when it saves a model) warns in every process that finds
    no GPU, so where the machine has no NVIDIA device say CPU up front; transformers draws
    a progress bar for every shard it writes or loads, noise in a pipeline's log."""
    if not os.path.exists("/dev/nvidiactl"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def usage() -> str:
    lines = ["usage: agentrl GROUP COMMAND [options]   (COMMAND --help for its options)", ""]
    for (group, cmd), (_, text) in COMMANDS.items():
        lines.append(f"  {(group + ' ' + cmd).strip():<18} {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cpu_accelerator_default()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    group = argv.pop(0)
    key = (group, "") if (group, "") in COMMANDS else (group, argv.pop(0) if argv else "")
    if key not in COMMANDS:
        print(f"agentrl: unknown command {' '.join(key).strip()!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[key][0].split(":")
    return int(getattr(importlib.import_module(module), func)(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
