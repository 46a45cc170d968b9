"""PNG figures of a sweep: training curves per group (mean over seeds, 95% CI band) and pass@k bars (95% CI).

Read at a glance: each group has its own hue from a 20-colour qualitative palette (line styles change beyond 20),
legends sit outside the axes, and the step axis shows integer rollout steps counted as the console counts them
(1 … N; the report's tables index steps from 0 internally, `runs.rollout_step_index`).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from tokenrl.report.runs import Run, final_validation  # noqa: E402
from tokenrl.report.stats import mean_ci  # noqa: E402

# (metric, title, the range its values can take: a CI band is clipped to it, so 3 seeds' wide t-intervals do not
# draw a negative entropy or a reward above 1)
CURVES = (
    ("train/reward", "training reward", (0.0, 1.0)),
    ("train/entropy", "mean token entropy (nats)", (0.0, None)),
    ("train/renyi2", "mean Rényi-2 entropy (nats)", (0.0, None)),
    ("select/fraction", "fraction of tokens updated", (0.0, 1.0)),
)

# Trubetskoy's "20 simple, distinct colours" (the four palest swapped for darker ones that read on white), ordered so
# that the first ten are ten different hues (or grey and black): small sweeps never get two shades of one hue, as
# tab20's dark/light pairs gave them.
PALETTE = (
    "#4363d8",
    "#e6194b",
    "#3cb44b",
    "#f58231",
    "#911eb4",
    "#42d4f4",
    "#f032e6",
    "#808000",
    "#a9a9a9",
    "#000000",
    "#9a6324",
    "#469990",
    "#000075",
    "#800000",
    "#bfef45",
    "#d4a000",
    "#fabed4",
    "#6a5acd",
    "#2f4f4f",
    "#ff7f50",
)
LINE_STYLES = ("-", "--", ":", "-.")


def group_style(index: int) -> dict[str, str]:
    """Colour and line style of the index-th group: 20 hues, then the next line style."""
    return {"color": PALETTE[index % len(PALETTE)], "linestyle": LINE_STYLES[index // len(PALETTE) % len(LINE_STYLES)]}


def curves_figure(groups: dict[str, list[Run]]) -> plt.Figure:
    """2×2 grid: each metric of CURVES against rollout step (1 … N), one line per group, 95% CI band over seeds
    (clipped to the metric's range)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (key, title, (low, high)) in zip(axes.flat, CURVES):
        for index, (label, runs) in enumerate(groups.items()):
            steps = sorted({s for run in runs for s in run.steps})
            per_step = [[run.steps[s][key] for run in runs if key in run.steps.get(s, {})] for s in steps]
            keep = [(s + 1, mean_ci(v)) for s, v in zip(steps, per_step) if v]
            if not keep:
                continue
            xs = [s for s, _ in keep]
            ax.plot(xs, [iv.mean for _, iv in keep], label=f"{label} (n={len(runs)})", **group_style(index))
            if len(runs) > 1:
                ax.fill_between(
                    xs,
                    [_clip(iv.mean - _finite(iv.half_width), low, high) for _, iv in keep],
                    [_clip(iv.mean + _finite(iv.half_width), low, high) for _, iv in keep],
                    alpha=0.15,
                    color=group_style(index)["color"],
                    linewidth=0,
                )
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[1]:
        ax.set_xlabel("rollout step")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.suptitle("mean over seeds; band = 95% CI over seeds (Student t)")
    fig.tight_layout()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    return fig


def plot_curves(groups: dict[str, list[Run]], path: Path) -> Path:
    """`curves_figure` written to `path` (the legend right of the axes included)."""
    return _save(curves_figure(groups), path)


def passk_figure(groups: dict[str, list[Run]], ks: list[str], before: dict[str, float]) -> plt.Figure:
    """Grouped bars of held-out pass@k after training per group (95% CI whiskers); dashed: before training."""
    fig, ax = plt.subplots(figsize=(min(1.6 + 1.4 * len(groups), 16.0), 4.2))  # at most a screen wide
    width = 0.8 / max(len(ks), 1)
    labels = list(groups)
    for index, k in enumerate(ks):
        intervals = [
            mean_ci([final_validation(run).get(f"val/{k}", math.nan) for run in groups[label]]) for label in labels
        ]
        xs = [i + (index - (len(ks) - 1) / 2) * width for i in range(len(labels))]
        colour = PALETTE[index % len(PALETTE)]
        ax.bar(
            xs,
            [iv.mean for iv in intervals],
            width,
            yerr=[_finite(iv.half_width) for iv in intervals],
            capsize=3,
            color=colour,
            label=f"{k} after training",
        )
        if k in before and not math.isnan(before[k]):
            ax.axhline(before[k], color=colour, linestyle="--", linewidth=1, label=f"{k} before training")
    ax.set_xticks(
        range(len(labels)), labels, rotation=30 if len(labels) > 8 else 0, ha="right" if len(labels) > 8 else "center"
    )
    ax.set_ylabel("held-out score")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=2 * max(len(ks), 1), frameon=False)
    fig.tight_layout()
    return fig


def plot_passk(groups: dict[str, list[Run]], ks: list[str], before: dict[str, float], path: Path) -> Path:
    """`passk_figure` written to `path` (the legend above the axes)."""
    return _save(passk_figure(groups, ks, before), path)


def _clip(value: float, low: float | None, high: float | None) -> float:
    if low is not None:
        value = max(value, low)
    return value if high is None else min(value, high)


def _finite(half_width: float) -> float:
    return 0.0 if math.isnan(half_width) else half_width


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
