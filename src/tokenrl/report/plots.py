"""PNG figures of a sweep: training curves per group (mean over seeds, min–max band) and pass@k bars (95% CI)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from tokenrl.report.runs import Run, final_validation  # noqa: E402
from tokenrl.report.stats import mean_ci  # noqa: E402

CURVES = (("train/reward", "training reward"), ("train/entropy", "mean token entropy (nats)"),
          ("train/renyi2", "mean Rényi-2 entropy (nats)"), ("select/fraction", "fraction of tokens updated"))


def plot_curves(groups: dict[str, list[Run]], path: Path) -> Path:
    """2×2 grid: each metric of CURVES against rollout step, one line per group."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (key, title) in zip(axes.flat, CURVES):
        for index, (label, runs) in enumerate(groups.items()):
            steps = sorted({s for run in runs for s in run.steps})
            per_step = [[run.steps[s][key] for run in runs if key in run.steps.get(s, {})] for s in steps]
            keep = [(s, v) for s, v in zip(steps, per_step) if v]
            if not keep:
                continue
            xs = [s for s, _ in keep]
            # 20 distinct colours, then a second line style: a sweep of many methods stays readable
            line, = ax.plot(xs, [sum(v) / len(v) for _, v in keep], label=f"{label} (n={len(runs)})",
                            color=plt.get_cmap("tab20")(index % 20), linestyle=("-", "--", ":")[index // 10 % 3])
            ax.fill_between(xs, [min(v) for _, v in keep], [max(v) for _, v in keep], alpha=0.15,
                            color=line.get_color(), linewidth=0)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("rollout step")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("mean over seeds; band = min–max over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_passk(groups: dict[str, list[Run]], ks: list[str], before: dict[str, float], path: Path) -> Path:
    """Grouped bars of held-out pass@k after training per group (95% CI whiskers); dashed: before training."""
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups), 4.2))
    width = 0.8 / max(len(ks), 1)
    labels = list(groups)
    for index, k in enumerate(ks):
        intervals = [mean_ci([final_validation(run).get(f"val/{k}", math.nan) for run in groups[label]])
                     for label in labels]
        xs = [i + (index - (len(ks) - 1) / 2) * width for i in range(len(labels))]
        errors = [0.0 if math.isnan(iv.half_width) else iv.half_width for iv in intervals]
        bars = ax.bar(xs, [iv.mean for iv in intervals], width, yerr=errors, capsize=3, label=f"{k} after training")
        if k in before and not math.isnan(before[k]):
            ax.axhline(before[k], color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1,
                       label=f"{k} before training")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("held-out score")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

