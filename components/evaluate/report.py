"""The evaluation report: one markdown file plus PNG plots, logged by the caller (MLflow).

Plots use matplotlib's Agg backend (no display); the markdown embeds them by file name so
the report reads the same in the MLflow artifact view and in a local folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.env.episode import EpisodeResult

# (key in a pooled block, label, format) of the headline table, in MISSION.md's order.
HEADLINE: tuple[tuple[str, str, str], ...] = (
    ("success_rate", "task success", "pct"),
    ("test_pass_rate", "test pass rate", "pct"),
    ("tool_call_accuracy", "tool-call accuracy (executed without error)", "pct"),
    ("valid_call_rate", "valid tool calls (format + arguments)", "pct"),
    ("step_efficiency", "step efficiency (oracle steps / steps, successes)", "num"),
    ("mean_steps", "mean steps", "num"),
    ("recovery_rate", "recovery rate", "pct"),
    ("safety_violation_rate", "safety violation rate", "pct"),
    ("tampering_rate", "tampering rate", "pct"),
    ("human_intervention_rate", "human intervention rate", "pct"),
    ("infra_failure_rate", "infrastructure failure rate (gated)", "pct"),
    ("cheating_rate", "cheating rate: impossible variants solved (gated)", "pct"),
    ("regression_rate", "regression rate vs champion", "pct"),
    ("patch_minimality", "patch size / reference (successes)", "num"),
    ("unrelated_change_rate", "episodes with unrelated changes", "pct"),
    ("lint_respected", "lint respected", "pct"),
    ("mean_reward", "mean reward", "num"),
)


def _fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if kind == "pct" else f"{value:.3f}"


def _headline_table(blocks: dict[str, dict]) -> list[str]:
    names = list(blocks)
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, label, kind in HEADLINE:
        lines.append(
            f"| {label} | " + " | ".join(_fmt(b.get(key), kind) for b in blocks.values()) + " |"
        )
    lines.append(
        "| success 95% CI | "
        + " | ".join(
            "n/a"
            if b.get("success_ci95") is None
            else f"{b['success_ci95'][0]:.0%}-{b['success_ci95'][1]:.0%}"
            for b in blocks.values()
        )
        + " |"
    )
    lines.append(
        "| episodes (verified / infra) | "
        + " | ".join(
            f"{b['episodes']} ({b['verified']} / {b['infra_failures']})" for b in blocks.values()
        )
        + " |"
    )
    return lines  # fmt: skip


def _cost_table(blocks: dict[str, dict]) -> list[str]:
    names = list(blocks)
    rows = [("tool calls (total)", "tool_calls_total", "{}"), ("tool calls (mean)", "tool_calls_mean", "{:.2f}"),
            ("wall s (total)", "wall_s_total", "{:.1f}"), ("wall s (mean)", "wall_s_mean", "{:.2f}"),
            ("tokens (total)", "tokens_total", "{}"), ("tokens (mean)", "tokens_mean", "{:.0f}")]  # fmt: skip
    lines = ["| cost | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key, fmt in rows:
        cells = [
            "n/a" if b["cost"][key] is None else fmt.format(b["cost"][key]) for b in blocks.values()
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _group_table(
    candidate: dict[str, dict], champion: dict[str, dict] | None, what: str
) -> list[str]:
    head = f"| {what} | episodes | success |" + (" champion success |" if champion else "")
    lines = [head, "|---|---|---|" + ("---|" if champion else "")]
    for name, b in candidate.items():
        row = f"| {name} | {b['episodes']} | {_fmt(b['success_rate'], 'pct')} |"
        if champion is not None:
            row += f" {_fmt(champion.get(name, {}).get('success_rate'), 'pct')} |"
        lines.append(row)
    return lines


def _plots(
    aggregate: dict, results: list[EpisodeResult], out: Path, champion: dict | None
) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    fams = aggregate["by_family"]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(fams) + 2), 3.5))
    names = list(fams)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs] if champion else xs, [fams[n]["success_rate"] or 0.0 for n in names],
           width=0.4 if champion else 0.8, label="candidate")  # fmt: skip
    if champion is not None:
        ax.bar([x + 0.2 for x in xs],
               [(champion["by_family"].get(n, {}).get("success_rate") or 0.0) for n in names],
               width=0.4, label="champion")  # fmt: skip
        ax.legend()
    ax.set_xticks(list(xs), names, rotation=45, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success rate")
    ax.set_title("Success by family")
    fig.tight_layout()
    paths["success_by_family"] = out / "success_by_family.png"
    fig.savefig(paths["success_by_family"], dpi=100)
    plt.close(fig)

    terms = aggregate["overall"]["reward_term_means"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh(list(terms), [v or 0.0 for v in terms.values()])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("mean value over verified episodes")
    ax.set_title("Reward terms")
    fig.tight_layout()
    paths["reward_terms"] = out / "reward_terms.png"
    fig.savefig(paths["reward_terms"], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ok = [r for r in results if r.status == "ok"]
    top = max([r.steps for r in ok], default=1)
    bins = [b + 0.5 for b in range(0, top + 1)]
    ax.hist([[r.steps for r in ok if r.success], [r.steps for r in ok if not r.success]],
            bins=bins, stacked=True, label=["success", "failure"])  # fmt: skip
    ax.set_xlabel("steps")
    ax.set_ylabel("episodes")
    ax.legend()
    ax.set_title("Steps per episode")
    fig.tight_layout()
    paths["steps_histogram"] = out / "steps_histogram.png"
    fig.savefig(paths["steps_histogram"], dpi=100)
    plt.close(fig)
    return paths


def _settings_lines(settings: dict | None) -> list[str]:
    """The decoding and episode settings the episodes ran with (the agent is the model plus
    its decoder: a number without them cannot be compared)."""
    if not settings:
        return []
    lines = ["## Settings", "", f"Episodes of at most {settings['episode_steps']} steps."]
    rollout = settings.get("rollout")
    if rollout:
        lines.append(
            f"Decoding: temperature {rollout['temperature']}, top_p {rollout['top_p']}, "
            f"{rollout['max_new_tokens']} new tokens per turn, {rollout['max_episode_tokens']} "
            f"tokens per episode, try_fix ids constrained: {rollout['constrain_fix_ids']}, "
            f"{rollout['samples_per_task']} episode(s) per task, seed {rollout['seed']}."
        )
    return [*lines, ""]


def write_report(
    aggregate: dict,
    results: list[EpisodeResult],
    out_dir: str | Path,
    title: str,
    champion: dict | None = None,
    safety_markdown: str | None = None,
) -> dict[str, Path]:
    """report.md, metrics.json and the plots in out_dir; returns {name: path}.

    `champion` is the champion's `aggregate` (same tasks), shown side by side."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = _plots(aggregate, results, out, champion)
    overall = {"candidate": aggregate["overall"]}
    if champion is not None:
        overall["champion"] = champion["overall"]
    splits = {f"split {k}": v for k, v in aggregate["by_split"].items()}
    md = [f"# {title}", "", f"Policy: `{aggregate['policy']}`"
          + (f"; champion: `{champion['policy']}`" if champion else "; no champion to compare"), ""]  # fmt: skip
    md += _settings_lines(aggregate.get("settings"))
    md += ["## Headline metrics", "", *_headline_table({**overall, **splits}), ""]
    reg = aggregate.get("regression")
    if reg is not None:
        md += [f"Regression: {len(reg['regressed_tasks'])} of {reg['champion_solved']} tasks the "
               f"champion solved now fail ({', '.join(reg['regressed_tasks']) or 'none'}); "
               f"{len(reg['improved_tasks'])} newly solved.", ""]  # fmt: skip
    if aggregate.get("cheating"):
        from components.evaluate.cheating import cheating_markdown

        md += [
            "## Cheating (impossible variants)",
            "",
            *cheating_markdown(aggregate["cheating"]),
            "",
        ]
    md += ["## Cost", "", *_cost_table({**overall, **splits}), ""]
    md += ["## Success by family", "", "![success by family](success_by_family.png)", "",
           *_group_table(aggregate["by_family"], champion["by_family"] if champion else None, "family"), ""]  # fmt: skip
    md += ["## Success by task source", "",
           *_group_table(aggregate["by_source"], champion.get("by_source") if champion else None, "task source"), ""]  # fmt: skip
    md += ["## Success by bug class", "",
           *_group_table(aggregate["by_bug_class"], champion["by_bug_class"] if champion else None, "bug class"), ""]  # fmt: skip
    md += ["## Reward terms", "", "![reward terms](reward_terms.png)", "",
           "| term | mean |", "|---|---|"]  # fmt: skip
    md += [
        f"| {k} | {_fmt(v, 'num')} |" for k, v in aggregate["overall"]["reward_term_means"].items()
    ]
    md += ["", "## Steps", "", "![steps histogram](steps_histogram.png)", ""]
    if safety_markdown:
        md += ["## Safety suite", "", safety_markdown, ""]
    md += ["Metric definitions: docs/evaluation.md.", ""]
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(md))
    paths["metrics"] = out / "metrics.json"
    payload = {"candidate": aggregate, "champion": champion}
    paths["metrics"].write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return paths
