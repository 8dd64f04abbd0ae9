"""Run a policy over a batch of tasks (one episode each, in threads) and summarise the
batch: the episode runner behind `agentrl env eval` and every evaluation."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from components.env.config import EnvConfig
from components.env.episode import EpisodeResult, Policy, run_episode
from components.sandbox.config import SandboxConfig
from components.tasks.task import Task
from components.typed_config import doc
from components.verifier.version import verifier_version


@dataclass(frozen=True)
class EvalConfig:
    workers: int = field(default=2, metadata=doc("episodes run concurrently (threads)"))
    seed: int = field(default=0, metadata=doc("seed for policies that sample"))

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("EvalConfig.workers must be >= 1")


def evaluate_policy(
    tasks: list[Task],
    make_policy: Callable[[], Policy],
    env: EnvConfig,
    sandbox: SandboxConfig,
    config: EvalConfig,
    on_result: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """One episode per task; results in task order. Each episode gets a fresh policy."""

    def one(task: Task) -> EpisodeResult:
        result = run_episode(task, make_policy(), env, sandbox, seed=config.seed)
        if on_result is not None:
            on_result(result)
        return result

    if config.workers == 1:
        return [one(t) for t in tasks]
    pool = ThreadPoolExecutor(max_workers=config.workers)
    try:  # a failure (a full disk under on_result) cancels the episodes not yet started
        return list(pool.map(one, tasks))
    finally:
        pool.shutdown(cancel_futures=True)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate (well-behaved at 0% and 100%)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(results: list[EpisodeResult]) -> dict:
    """Aggregate metrics; infra failures are counted and excluded from every rate."""
    ok = [r for r in results if r.status == "ok"]
    n = len(ok)
    successes = sum(r.success for r in ok)
    lo, hi = wilson_interval(successes, n)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    terms = sorted({k for r in ok for k in r.reward_terms})
    return {
        "policy": results[0].policy if results else "",
        "tasks": len(results),
        "infra_failures": len(results) - n,
        "success_rate": successes / n if n else 0.0,
        "success_ci95": [lo, hi],
        "mean_reward": mean([r.reward for r in ok]),
        "mean_steps": mean([r.steps for r in ok]),
        "mean_tool_calls": mean([r.tool_calls for r in ok]),
        "invalid_calls": sum(r.invalid_calls for r in ok),
        "safety_flags": sum(len(r.safety_flags) for r in ok),
        "ran_tests_rate": mean([float(r.ran_tests) for r in ok]),
        "mean_reward_terms": {t: mean([r.reward_terms.get(t, 0.0) for r in ok]) for t in terms},
        "wall_s_total": round(sum(r.wall_s for r in results), 2),
    }


def format_table(summaries: list[dict]) -> str:
    """A plain-text comparison table, one row per policy."""
    header = ["policy", "tasks", "success", "95% CI", "reward", "steps", "tool calls"]
    header += ["invalid", "safety", "infra", "wall s"]
    formats = ["{}", "{}", "{:.1%}", "{}", "{:+.3f}", "{:.1f}", "{:.1f}", "{}", "{}", "{}"]
    formats += ["{:.1f}"]  # one per column of `header`
    rows = []
    for s in summaries:
        lo, hi = s["success_ci95"]
        values = [s["policy"], s["tasks"], s["success_rate"], f"{lo:.0%}-{hi:.0%}",
                  s["mean_reward"], s["mean_steps"], s["mean_tool_calls"], s["invalid_calls"],
                  s["safety_flags"], s["infra_failures"], s["wall_s_total"]]  # fmt: skip
        rows.append([fmt.format(v) for fmt, v in zip(formats, values, strict=True)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def write_results(path: Path, results: list[EpisodeResult], trajectories: Path | None) -> None:
    """Per-task results (+ summary) as JSON; canonical trajectories as JSONL if asked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # The verifier that judged these episodes (promotion can require the current one).
        "verifier_version": verifier_version(),
        "summary": summarize(results),
        "results": [r.summary() for r in results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    if trajectories is not None:
        trajectories.parent.mkdir(parents=True, exist_ok=True)
        with trajectories.open("w") as f:
            for r in results:
                f.write(json.dumps(r.record) + "\n")
