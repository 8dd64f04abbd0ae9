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
    ("tasks", "export"): ("components.tasks.__main__:main_export", "tasks as Harbor tasks"),
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
    ("data", "repair"): ("components.data.__main__:main_repair", "rebuild a damaged data.dvc"),
    ("policy", "init"): ("components.train.__main__:main_policy_init", "build the tiny policy"),
    ("policy", "fetch"): ("components.policy.__main__:main_fetch", "registry checkpoint -> HF"),
    ("policy", "merge"): ("components.train.__main__:main_policy_merge", "fold LoRA into base"),
    ("train", "sft"): ("components.train.__main__:main_sft", "supervised fine-tuning"),
    ("rollout", "sample"): ("components.train.__main__:main_sample", "sample + verify episodes"),
    ("rollout", "export"): ("components.data.__main__:main_export", "episodes as ATIF"),
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
    """Library defaults for a command line (a value already set wins): DeepSpeed
    (which transformers imports when it saves a model) warns in every process that finds
    no GPU, so where the machine has no NVIDIA device say CPU up front; transformers draws
    a progress bar for every shard it writes or loads, noise in a pipeline's log."""
    if not os.path.exists("/dev/nvidiactl"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # OpenMP threads that wait by sleeping, not spinning (read when torch loads): on a
    # loaded machine, or with more threads than free cores, spinning made a training step
    # ~3x slower than one thread (bench/results/threads-*.md); the work is split the same.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usage() -> str:
    lines = ["usage: agentrl GROUP COMMAND [options]   (COMMAND --help for its options)", ""]
    for (group, cmd), (_, text) in COMMANDS.items():
        lines.append(f"  {(group + ' ' + cmd).strip():<18} {text}")
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


def main(argv: list[str] | None = None) -> int:
    cpu_accelerator_default()
    stage_threads()
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
