"""Plot a metric against rollout step for one or more runs (their csv/metrics.csv), and print first/last-5 means.

    python scripts/plot_curves.py logs/train/runs/<a> logs/train/runs/<b> --metric train/reward --out curve.png

`read_metric` indexes rollout steps from 0, as scripts/report.py does (`tokenrl.report.runs.rollout_step_index`); the
figure counts them as the console does, 1 … N, on an integer axis, with the legend outside the axes.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tokenrl.report.runs import ROLLOUT_STEP, rollout_step_index  # noqa: E402


def read_metric(run_dir: Path, metric: str) -> tuple[list[int], list[float]]:
    """(0-based rollout steps, values) of `metric` from run_dir/csv/metrics.csv; rows without it are skipped."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a tokenrl run folder (logger=csv or default)?")
    steps, values = [], []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row.get(metric) and row.get(ROLLOUT_STEP):
                steps.append(rollout_step_index(row[ROLLOUT_STEP]))
                values.append(float(row[metric]))
    return steps, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--metric", default="train/reward")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default=None)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    print(f"{'run':<40}{'steps':>6}{'first 5':>9}{'last 5':>9}")
    for run in args.runs:
        steps, values = read_metric(run, args.metric)
        ax.plot([step + 1 for step in steps], values, marker=".", label=run.name)
        first, last = values[:5], values[-5:]
        print(f"{str(run):<40}{len(values):>6}{sum(first) / len(first):>9.3f}{sum(last) / len(last):>9.3f}")
    ax.set_xlabel("rollout step")
    ax.set_ylabel(args.metric)
    ax.set_title(args.title or args.metric)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
