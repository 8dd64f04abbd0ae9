"""What bench/learning.py (and bench/learning_pretrained.py) read off episodes and how they
show it: pass@k, well-formed turns, why episodes fail, the paired pass@1 difference of two
methods with its bootstrap interval, table cells, the stage table and the success plot."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from components.env.episode import EpisodeResult
from components.tasks.task import Task


def pass_at_k(results: list[EpisodeResult], task_ids: list[str]) -> tuple[int, int]:
    """(tasks with any verified success, tasks with at least one verified episode)."""
    by_task: dict[str, list[bool]] = {}
    for r in results:
        if r.status == "ok":
            by_task.setdefault(r.task_id, []).append(r.success)
    return sum(any(by_task[t]) for t in task_ids if t in by_task), len(by_task)


def well_formed(results: list[EpisodeResult]) -> tuple[int, int]:
    steps = sum(r.steps for r in results if r.status == "ok")
    invalid = sum(r.invalid_calls for r in results if r.status == "ok")
    return steps - invalid, steps


def diagnose(results: list[EpisodeResult], tasks: dict[str, Task]) -> dict:
    """Why episodes fail: end reasons, invalid-call reasons, what edits did."""
    reasons: Counter = Counter()
    invalid: Counter = Counter()
    edits = Counter()
    tokens = []
    for r in results:
        reasons[r.end_reason] += 1
        tokens.append(r.record.get("metadata", {}).get("num_tokens") or 0)
        module = tasks[r.task_id].metadata.extra.get("module", "")
        bug_line = tasks[r.task_id].metadata.extra.get("mutation_line")
        events = r.record.get("trajectory", [])
        for a, env in zip(events[1::2], events[2::2], strict=False):
            obs = env.get("observation", "")
            if a.get("action") is None:
                why = re.sub(r"\d+", "N", obs.removeprefix("error: invalid tool call: "))
                invalid[why[:60]] += 1
                continue
            if a["action"] in ("edit_file", "edit_lines", "apply_patch"):
                edits["attempted"] += 1
                args = a.get("arguments", {})
                if a["action"] != "apply_patch" and args.get("path") != module:
                    edits["wrong_path"] += 1
                if obs.startswith(("edited", "applied")):
                    edits["applied"] += 1
                    m = re.search(r"now lines (\d+)-(\d+)", obs)
                    if m and bug_line and int(m.group(1)) <= bug_line <= int(m.group(2)):
                        edits["applied_on_bug_line"] += 1
                elif "not found" in obs:
                    edits["old_text_not_found"] += 1
                elif "no longer parse" in obs:
                    edits["refused_unparseable"] += 1
    return {
        "end_reasons": dict(reasons),
        "invalid_call_reasons": dict(invalid.most_common(5)),
        "edits": dict(edits),
        "mean_tokens": round(sum(tokens) / len(tokens), 1) if tokens else 0,
    }


def paired_difference(
    a: dict[str, bool], b: dict[str, bool], n_boot: int = 10_000, seed: int = 0
) -> tuple[float, tuple[float, float]] | None:
    """pass@1 of a minus pass@1 of b on the tasks both verified, with a 95% paired
    bootstrap interval (tasks resampled; the same task's two outcomes stay together)."""
    import numpy as np

    common = sorted(set(a) & set(b))
    if not common:
        return None
    diff = np.array([float(a[t]) - float(b[t]) for t in common])
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    return float(diff.mean()), (float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975)))


def _pct(x: float, ci) -> str:
    return f"{x:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def _delta(row: dict) -> str:
    d = row.get("delta_vs_sft")
    if d is None:
        return ""
    return f"{d[0] * 100:+.1f} pts [{d[1][0] * 100:+.1f}, {d[1][1] * 100:+.1f}]"


def stage_table(clock) -> str:
    """Wall and CPU seconds per stage of a `Clock` (bench/learning.py), and their total."""
    lines = ["| stage | wall s | CPU s (process + children) |", "|---|---|---|"]
    for name in clock.wall:
        lines.append(f"| {name} | {clock.wall[name]:.0f} | {clock.cpu[name]:.0f} |")
    lines.append(f"| total | {sum(clock.wall.values()):.0f} | {sum(clock.cpu.values()):.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    labels = {
        "val": "val (unseen bugs)",
        "test": "test (unseen families)",
        "quixbugs": "QuixBugs (real bugs)",
    }
    for j, split in enumerate(labels):  # val, test, quixbugs
        xs, ys, lo, hi = [], [], [], []
        for i, m in enumerate(methods):
            row = next((r for r in rows if r["method"] == m and r["split"] == split), None)
            if row is None:
                continue
            xs.append(i + (j - 1) * width)
            ys.append(row["pass1"])
            lo.append(row["pass1"] - row["pass1_ci"][0])
            hi.append(row["pass1_ci"][1] - row["pass1"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=labels[split])
    ax.set_xticks(range(len(methods)), methods, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (greedy), 95% Wilson CI")
    ax.set_title("Task success by training method")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
