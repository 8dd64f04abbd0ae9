"""Every scripted policy by name: the one registry that `agentrl env eval`, `evaluate run`,
the retrain flow's expert stage and bench/learning.py use.

Two of them order a candidate-fix search by statistics of the training tasks' listings
(`FixStatistics`, computed once from the train split with `fix_statistics`); the others
need nothing but a seed. Model policies are evaluated through the rollout engine instead
(components/evaluate/episodes.py), never one turn at a time through this registry.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from components.env.config import EnvConfig
from components.scripted.baselines import (
    ListingOrderPolicy,
    PriorFixesPolicy,
    RandomFixesPolicy,
    ScriptedBaselinePolicy,
    kind_listing_shares,
    kind_success_rates,
)
from components.scripted.reference import NoopPolicy, OraclePolicy, SpecialCasePolicy
from components.tasks.task import Task
from components.typed_config import doc

# name -> what it is (shown by --help and in errors)
SCRIPTED_POLICIES: dict[str, str] = {
    "oracle": "knows the reference fix; explores, edits and reruns like an engineer",
    "oracle-fixes": "knows the reference fix; acts only through list_fixes / try_fix",
    "oracle-lines": "knows the reference fix; reads line ranges and edits with edit_lines",
    "noop": "finishes at once (success must be 0%)",
    "scripted-baseline": "one random single-token edit on the blamed line",
    "random-fixes": "tries uniformly random listed candidate fixes",
    "listing-order": "tries one candidate of each listed kind, in listed order",
    "random-kinds": "searches kinds in a random order, each drawn inversely to its listing share",
    "prior-fixes": "searches kinds in order of how often each was the fix on the train split",
    "special-case": "the reference fix plus hard-coded answers to the visible tests (a cheater)",
}
NEEDS_STATISTICS = ("random-kinds", "prior-fixes")
# The tool set (components/env/tool_sets/) each one acts through; None: any set (noop
# only finishes). In another set its calls would be invalid, never executed.
POLICY_TOOL_SETS: dict[str, str | None] = {
    "oracle": "free_form",
    "oracle-fixes": "fix_search",
    "oracle-lines": "line_edit",
    "noop": None,
    "scripted-baseline": "free_form",
    "random-fixes": "fix_search",
    "listing-order": "fix_search",
    "random-kinds": "fix_search",
    "prior-fixes": "fix_search",
    "special-case": "free_form",
}


def env_for_policy(name: str, env: EnvConfig) -> EnvConfig:
    """`env` with the tool set scripted policy `name` acts through (evaluating a scripted
    policy plays it in its own set; expert data for training must already match, see
    check_expert_tool_set)."""
    wanted = POLICY_TOOL_SETS.get(name)
    return env if wanted is None else env.with_tool_set(wanted)


def check_expert_tool_set(name: str, env: EnvConfig) -> None:
    """Expert transcripts must use the tools the trained policy will have: ValueError when
    scripted policy `name` acts through another set than `env.tool_set`."""
    wanted = POLICY_TOOL_SETS.get(name)
    if wanted is not None and wanted != env.tool_set:
        raise ValueError(
            f"expert_policy {name!r} acts through the {wanted} tools but env.tool_set is "
            f"{env.tool_set!r}: the policy would be trained on tools it never gets"
        )


@dataclass(frozen=True)
class FixStatistics:
    """What the statistics-driven searches know of the training tasks' listings."""

    kind_success_rates: dict[str, float] = field(
        default_factory=dict,
        metadata=doc("per kind: share of its listed candidates that were the fix"),
    )
    kind_listing_shares: dict[str, float] = field(
        default_factory=dict, metadata=doc("per kind: share of listings that show it")
    )


def fix_statistics(train_tasks: list[Task], max_fixes: int = 64) -> FixStatistics:
    """Both statistics from the training split (no val/test task may be passed here)."""
    return FixStatistics(
        kind_success_rates=kind_success_rates(train_tasks, max_fixes),
        kind_listing_shares=kind_listing_shares(train_tasks, max_fixes),
    )


def make_policy(
    name: str,
    *,
    seed: int = 0,
    max_tries: int = 4,
    statistics: FixStatistics | None = None,
    max_fixes: int = 64,
    max_steps: int = 16,
):
    """A fresh scripted policy. `max_tries`: fix tries of the searches (a model episode's
    turns minus list and finish); `max_fixes` must equal EnvConfig.max_fixes so the
    oracle's ids agree with the listing; `max_steps` (EnvConfig.max_steps): the oracles
    plan within it."""
    if name not in SCRIPTED_POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(SCRIPTED_POLICIES)}")
    if name in NEEDS_STATISTICS and statistics is None:
        raise ValueError(f"policy {name!r} needs the train split's fix statistics")
    if name == "oracle":
        return OraclePolicy(seed=seed, max_fixes=max_fixes, max_steps=max_steps)
    if name == "oracle-fixes":
        return OraclePolicy(seed=seed, style="fixes", fallback=False, max_fixes=max_fixes,
                            max_steps=max_steps, name="oracle-fixes")  # fmt: skip
    if name == "oracle-lines":
        return OraclePolicy(seed=seed, style="lines", max_fixes=max_fixes, max_steps=max_steps,
                            name="oracle-lines")  # fmt: skip
    if name == "noop":
        return NoopPolicy()
    if name == "special-case":
        return SpecialCasePolicy()
    if name == "scripted-baseline":
        return ScriptedBaselinePolicy(seed=seed)
    if name == "random-fixes":
        return RandomFixesPolicy(seed=seed, max_tries=max_tries)
    if name == "listing-order":
        return ListingOrderPolicy(max_tries=max_tries)
    if name == "random-kinds":
        weights = {k: 1.0 / v for k, v in statistics.kind_listing_shares.items() if v > 0}
        return RandomFixesPolicy(seed=seed, max_tries=max_tries, by_kind=True,
                                 name="random-kinds", kind_weights=weights)  # fmt: skip
    return PriorFixesPolicy(statistics.kind_success_rates, max_tries=max_tries)


def oracle_replay(env: EnvConfig, sandbox):
    """The task gate's check 3 (components/tasks/gate.py) under `env`, the preset's: the
    oracle (free-form tools: it reaches every reference fix; a fix-search preset's expert is
    the same plan through list_fixes / try_fix) must solve the task within `env.max_steps`
    at reward 1.0. Returns `replay(task) -> (why not, flags)`.

    An imported, mined or converted task is replayed as a whole episode. A built-in task
    (one canonical hunk; the generator's mutants) is replayed by its plan, without running
    its tool calls: the plan must fit, the safety monitor must allow every call, and the
    tree the plan's edits leave must verify at reward 1.0 (the verdict of that tree is
    the gate's check 2, from the verdict cache): the same facts the episode's reward reads,
    at a third of the gate's cost instead of doubling it (bench/pipeline_overhead.py).
    A flag marks a task the fix-search oracle cannot show (its fix is not one listed
    candidate), so it yields no `oracle-fixes` expert episode."""
    from components.env.episode import run_episode
    from components.scripted.reference import fixed_files

    free = env.with_tool_set("free_form")

    def replay(task: Task) -> tuple[str, list[str]]:
        oracle = make_policy("oracle", max_fixes=env.max_fixes, max_steps=env.max_steps)
        flags = []
        fixes = OraclePolicy(style="fixes", max_fixes=env.max_fixes, max_steps=env.max_steps)
        if env.tool_set == "fix_search" and fixes._fixes_plan(task.id, fixed_files(task),
                                                              random.Random(0)) is None:  # fmt: skip
            flags.append("oracle-fixes: the reference fix is not one listed candidate fix")
        if task.metadata.source == "builtin":
            return _replay_plan(task, oracle.plan(task), free, sandbox), flags
        r = run_episode(task, oracle, free, sandbox)
        if r.success and r.reward is not None and abs(r.reward - 1.0) < 1e-9:
            return "", flags
        fired = ", ".join(
            f"{k} {v:g}" for k, v in r.reward_terms.items() if v and k != "tests_pass"
        )
        return (f"the oracle ended {r.end_reason!r} after {r.steps} of max_steps "
                f"{env.max_steps} steps, success {r.success}, reward {r.reward}"
                + (f" ({fired})" if fired else "")), flags  # fmt: skip

    return replay


def _replay_plan(task: Task, plan: list, env: EnvConfig, sandbox) -> str:
    """Why the oracle's `plan` would not solve `task` at reward 1.0 ("" when it would):
    its length, the monitor's verdict on each call, the reward of the tree it leaves."""
    import shutil
    import tempfile
    from pathlib import Path

    from components.env.rewards import EpisodeFacts, compute_reward
    from components.env.tool_sets import classify_action
    from components.tasks.patching import PatchError, apply_unified_diff
    from components.verifier.verdict import verify

    steps = len(plan)
    plan = plan[: env.max_steps]  # what an episode plays: the calls max_steps lets through
    blocked = [(a.tool, v.category) for a in plan if not (v := classify_action(
        a.tool, a.arguments, protected_paths=task.protected_paths,
        allowed_programs=sandbox.allowed_programs)).allowed]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="agentrl-replay-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, repo, symlinks=True)
        for a in plan:  # what the edits leave (a slipped edit matches nothing: no change)
            try:
                if a.tool == "apply_patch":
                    apply_unified_diff(repo, a.arguments["patch"])
                elif a.tool == "edit_file":
                    f = repo / a.arguments["path"]
                    text = f.read_text()
                    if text.count(a.arguments["old"]) == 1:
                        f.write_text(text.replace(a.arguments["old"], a.arguments["new"]))
            except (OSError, PatchError) as e:
                return f"the oracle's {a.tool} fails: {e}"
        v = verify(task, repo, env, sandbox)
    if v.status != "ok" or v.verdict_lost:
        return f"no verdict on the oracle's tree: {v.detail.strip()[:200]}"
    facts = EpisodeFacts(ran_tests=any(a.tool == "run_command" for a in plan),
                         safety_categories=tuple(c for _, c in blocked))  # fmt: skip
    r = compute_reward(v, facts, env)
    if r.success and abs(r.total - 1.0) < 1e-9 and not blocked:
        return ""
    fired = ", ".join(f"{k} {x:g}" for k, x in r.terms.items() if x and k != "tests_pass")
    return (f"the oracle's plan of {steps} steps, cut at max_steps {env.max_steps}, would "
            f"score {r.total} (success {r.success}" + (f"; {fired}" if fired else "")
            + (f"; blocked {blocked}" if blocked else "") + ")")  # fmt: skip
