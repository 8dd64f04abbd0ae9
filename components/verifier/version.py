"""Which verifier judged a verdict: a content hash of everything a verdict depends on.

A fix to the verifier changes verdicts; a reward, dataset or evaluation computed before the
fix is then stale (`agentrl rescore` judges it again). `verifier_version()` is the hash of
the files in VERIFIER_SOURCES (each chosen below for what it decides) and the versions of
the harness's own packages (pytest, its timeout plugin, ruff for the lint and security
findings). Any change to one of them is a new version; a change anywhere else (a policy,
a trainer, a tool the agent calls) is not. It is recorded on every episode record and
result, each evaluation's results.json, each data version's log entry, each model
version's lineage tags and the pipeline's MLflow run, and shown by `agentrl promote status`.

The hash is of source text, not behaviour: a comment edited in one of these files is a new
version too (a false "stale", never a missed one).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from functools import lru_cache
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]

# Repository-relative paths of the code a verdict depends on, and why each is here.
VERIFIER_SOURCES = (
    "components/verifier/verdict.py",  # the order of the checks, the control, what is kept
    "components/verifier/verification.py",  # the verdict's fields
    "components/verifier/snapshot.py",  # the copy of the final tree and the fresh trees
    "components/verifier/tampering.py",  # which changes never enter verification
    "components/verifier/checks.py",  # each check's sandbox and how its verdict line is read
    "components/verifier/hidden_tests.py",  # the hidden tests' run and judgement
    "components/verifier/harness.py",  # the program the hidden tests run under
    "components/verifier/hidden_cases.py",  # the hidden cases and their comparison
    "components/verifier/case_runner.py",  # the program the hidden cases run under
    "components/verifier/lint.py",  # the lint and security findings
    "components/verifier/cache.py",  # which verdicts are reused
    "components/verifier/gate_runner.py",  # the task gate's verdicts
    "components/sandbox/config.py",  # the limits and programs a verification process has
    "components/sandbox/process.py",  # how it is run, stopped and its outcome read
    "components/sandbox/isolation.py",  # which isolation it gets on this machine
    "components/sandbox/bubblewrap.py",  # what of the host it sees
    "components/sandbox/limits.py",  # its rlimits and cgroups, and which limit stopped it
    "components/sandbox/kernel.py",  # its namespaces and seccomp filter
    "components/sandbox/network.py",  # how its network attempts are counted
    "components/sandbox/environ.py",  # its environment variables and pytest plugins
    "components/sandbox/output.py",  # how its output is capped
    "components/sandbox/harness_plugins/agentrl_cpu_timeout.py",  # per-test limits in CPU time
    "components/sandbox/harness_plugins/agentrl_limits.py",  # and in unstarved wall time
    "components/env/rewards.py",  # how a verification becomes reward terms and success
    "components/env/rubric.py",  # the term arithmetic those terms share
    "components/tasks/task.py",  # what a task protects and hides (tests, cases, patterns)
    "components/tasks/environments.py",  # the interpreter and limits a task is verified with
    "components/tasks/harbor.py",  # Harbor tasks' test.sh verifier and reward-file rules
    "components/tasks/gate.py",  # task-gate rules: which tasks may be judged at all
)
# Distributions whose code runs in (or judges for) the harness.
HARNESS_PACKAGES = ("pytest", "pytest-timeout", "ruff")


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def compute_verifier_version(root: Path, sources: tuple[str, ...] = VERIFIER_SOURCES) -> str:
    """`vv-` + 16 hex digits of sha256 over each source's path and bytes (length-prefixed)
    under `root`, and the harness packages' versions. A missing source is an error: a
    version must never silently cover less than it says."""
    h = hashlib.sha256()
    for rel in sources:
        data = (root / rel).read_bytes()
        for part in (rel.encode(), data):
            h.update(len(part).to_bytes(8, "big") + part)
    for name in HARNESS_PACKAGES:
        h.update(f"{name}=={_package_version(name)}\n".encode())
    return "vv-" + h.hexdigest()[:16]


@lru_cache(maxsize=1)
def verifier_version() -> str:
    """This process's verifier version (computed once: the code does not change under it)."""
    return compute_verifier_version(PACKAGE_ROOT)
