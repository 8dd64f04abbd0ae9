"""bench/grpo_vs_trl.py's comparison: the ratio of the final rewards with its paired
bootstrap interval, the reward curves' plot, the same-batch gradient check's line and the
report."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.grpo_vs_trl_task import Run


def bootstrap_ratio(ours: list[float], theirs: list[float], seed: int, n_boot: int = 10_000):
    """mean(ours) / mean(theirs) with a 95% paired bootstrap interval over the prompts
    (None where TRL's mean is 0)."""
    import numpy as np

    a, b = np.array(ours), np.array(theirs)
    if b.mean() == 0:
        return None
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(a), size=(n_boot, len(a)))
    num, den = a[index].mean(axis=1), b[index].mean(axis=1)
    ratios = num[den > 0] / den[den > 0]
    return float(a.mean() / b.mean()), (
        float(np.quantile(ratios, 0.025)),
        float(np.quantile(ratios, 0.975)),
    )


def curve(run: Run) -> list[float]:
    return [statistics.mean(r) for r in run.rewards]


def plot(runs: dict[str, Run], screen_pass1: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, run in runs.items():
        ys = curve(run)
        ax.plot(range(1, len(ys) + 1), ys, marker=".", alpha=0.5, label=f"{name}, per step")
        window = [statistics.mean(ys[max(0, i - 4) : i + 1]) for i in range(len(ys))]
        ax.plot(range(1, len(ys) + 1), window, linewidth=2, label=f"{name}, mean of last 5")
    ax.axhline(screen_pass1, color="grey", linestyle=":", label="start, held-out pass@1")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(
    args, start_label: str, screened: dict, runs: dict[str, Run], ratios: dict, check: dict | None
) -> str:
    ours, trl = runs["ours"], runs["trl"]
    settings = ", ".join(f"{k}={v}" for k, v in vars(args).items() if k != "out")
    k = args.eval_samples
    lines = [
        "# bench/grpo_vs_trl.py: our GRPO vs TRL's GRPOTrainer",
        "",
        f"settings: {settings}",
        f"start: {start_label}",
        "",
        f"## Screen of the start (held-out prompts, T={args.temperature}, {k} samples each)",
        "",
        f"| prompts | pass@1 | pass@{k} | in 10-70% |",
        "|---|---|---|---|",
        f"| {args.eval_prompts} | {screened['pass@1']:.3f} | {screened[f'pass@{k}']:.3f} | "
        f"{'yes' if 0.1 <= screened[f'pass@{k}'] <= 0.7 else 'no'} |",
        "",
        "## Final policies (held-out prompts, same random streams for both)",
        "",
        "| trainer | held-out mean reward | mean reward, last "
        f"{min(args.last_k, args.steps)} steps | wall s / step (mean, median) | train wall s |",
        "|---|---|---|---|---|",
    ]
    for name, run in (("start", None), ("ours", ours), ("trl", trl)):
        if run is None:
            lines.append(f"| start | {screened['pass@1']:.3f} | | | |")
            continue
        tail = [x for r in run.rewards[-args.last_k :] for x in r]
        lines.append(
            f"| {name} | {statistics.mean(run.evaluation):.3f} | "
            f"{statistics.mean(tail):.3f} | {statistics.mean(run.step_wall):.1f}, "
            f"{statistics.median(run.step_wall):.1f} | {run.train_wall:.0f} |"
        )
    lines += [
        "",
        "## Ratios (ours / TRL's)",
        "",
        *ratio_lines(ratios),
        "",
        "## The same batch through both updates",
        "",
        gradient_line(check),
        "",
        "## Mean reward per step",
        "",
        "| step | ours | trl |",
        "|---|---|---|",
    ]
    for step, (a, b) in enumerate(zip(curve(ours), curve(trl), strict=True), 1):
        lines.append(f"| {step} | {a:.3f} | {b:.3f} |")
    return "\n".join(lines) + "\n"


def ratio_lines(ratios: dict) -> list[str]:
    final = ratios["final_reward"]
    text = (
        "undefined (TRL's held-out mean reward is 0)"
        if final is None
        else f"{final[0]:.3f} [95% bootstrap {final[1][0]:.3f}, {final[1][1]:.3f}]"
    )
    return [
        f"- final held-out mean reward, ours / TRL's: {text}",
        f"- training mean reward of the last steps, ours / TRL's: {ratios['last_k']}",
        f"- wall per step, ours / TRL's: {ratios['wall_per_step']:.3f}",
    ]


def _ratio(a: float, b: float) -> str:
    return "undefined (TRL's is 0)" if b == 0 else f"{a / b:.3f}"


def gradient_line(check: dict | None) -> str:
    if check is None:
        return "- same batch, one update: not checked (beta > 0)"
    return (
        f"- same batch, one update: gradient cosine {check['cosine']:.6f}, relative L2 "
        f"difference {check['relative_difference']:.1e} (norms {check['grad_norm_ours']:.4g} "
        f"ours, {check['grad_norm_trl']:.4g} TRL's)"
    )
