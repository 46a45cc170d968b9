"""Reports over a Hydra multirun folder: markdown tables (mean ± 95% CI over seeds, paired differences against a
baseline), PNG curves and pass@k bars, and an HTML page of sample rollouts (`python scripts/report.py`).

runs.py reads the folder, stats.py has the intervals, tests and power, contrasts.py the pre-registered contrasts,
tables.py the markdown tables, plots.py the figures, html.py the samples page, and build.py puts them together; this
file only re-exports.
"""

from __future__ import annotations

from tokenrl.report.build import build_report, reproduce_command
from tokenrl.report.contrasts import Spec, contrasts_section
from tokenrl.report.runs import Run, load_sweep, rollout_step_index
from tokenrl.report.stats import Interval, mean_ci, paired_difference
from tokenrl.report.tables import glance_table, group_runs, metric_table, metrics, passk_names, runs_section

__all__ = [
    "Interval",
    "Run",
    "Spec",
    "build_report",
    "contrasts_section",
    "glance_table",
    "group_runs",
    "load_sweep",
    "mean_ci",
    "metric_table",
    "metrics",
    "paired_difference",
    "passk_names",
    "reproduce_command",
    "rollout_step_index",
    "runs_section",
]
