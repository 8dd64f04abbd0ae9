"""The sandbox: the ground floor `tasks`, the verifier and `env` stand on. A task
repository is copied into a workspace the agent works in, and every command that the agent,
the verifier or the task gate starts runs under hard limits, isolated from the host.

Which module holds what:
  * config.py: `SandboxConfig` (limits, allowed programs, isolation mode), `SandboxError`;
  * workspace.py: `Workspace`, the per-episode copy of a task repository, its path
    confinement (`Workspace.resolve`) and `read_regular`;
  * process.py: `run_sandboxed`, which runs one command and returns a `CommandResult`;
  * isolation.py: which isolation this machine gives (`resolve_isolation`,
    `isolation_report`), and what each mode protects against and what it does not;
  * bubblewrap.py: the bwrap command line (what a command sees of the host);
  * limits.py: rlimits and cgroups, and which limit stopped a command;
  * kernel.py: namespaces, mounts and the seccomp filter, through libc;
  * network.py: counting network attempts from the namespace's own counters;
  * environ.py: the environment variables a command sees (`sandbox_env`, `HARNESS_PLUGINS`);
  * output.py: capping output and observations (`OutputBuffer`, `cap_text`);
  * harness_plugins/: the per-test limits of every sandboxed pytest run, stand-alone
    modules on the sandbox's PYTHONPATH.

Nothing here imports a package above it (tasks, verifier, env).
"""
