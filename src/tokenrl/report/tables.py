"""The report's tables: which per-run numbers it shows (`metrics`), one markdown table per metric (mean ± 95% CI over
seeds, paired Δ against a baseline, per-seed values), the "at a glance" headline and the list of runs."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from tokenrl.report.runs import WINDOW, Run, final_validation, last_mean, window_mean
from tokenrl.report.stats import Censored, Interval, censored_summary, format_censored, mean_ci, paired_difference

Metric = Callable[[Run], float]


def held_out(run: Run, key: str, before: bool = False) -> float:
    """The run's validation value of `key` after training (`before`: at step 0), nan where the run did not log it."""
    return (run.validation.get(0, {}) if before else final_validation(run)).get(key, math.nan)


def metrics(ks: list[str], forks: bool = False) -> dict[str, Metric]:
    """Title → per-run value; `ks` are the pass@k names found in the runs (e.g. pass@1, pass@4); `forks`: the runs
    logged their selections against the true forks (task=forks), whose tables follow."""
    table: dict[str, Metric] = {}
    for k in ks:
        table[f"held-out {k} after training"] = partial(held_out, key=f"val/{k}")
    for k in ks:
        table[f"held-out {k} before training"] = partial(held_out, key=f"val/{k}", before=True)
    table.update(
        {
            "training reward, last 3 steps": lambda run: last_mean(run, "train/reward"),
            "token entropy, last 3 steps (nats)": lambda run: last_mean(run, "train/entropy"),
            "Rényi-2 entropy, last 3 steps (nats)": lambda run: last_mean(run, "train/renyi2"),
            "fraction of tokens updated, last 3 steps": lambda run: last_mean(run, "select/fraction"),
            "mean π of updated tokens, last 3 steps": lambda run: last_mean(run, "select/p_selected"),
            "seconds per rollout step": lambda run: last_mean(run, "time/step", last=10**9),
        }
    )
    if forks:
        table.update(
            {
                f"steps to a training reward of {REWARD_THRESHOLD} (5-step mean; censored if never)": lambda run: (
                    steps_to_reward(run, REWARD_THRESHOLD)
                ),
                **{
                    f"{title}{ALL_STEPS}": partial(last_mean, key=key, last=10**9)
                    for title, key in FORK_METRICS.items()
                },
                f"precision above the fork rate (per step: precision − rate){ALL_STEPS}": lambda run: step_mean(
                    run, lambda values: values["forks/precision"] - values["forks/rate"]
                ),
                **{
                    f"precision of {name}'s picks on this run's rollouts{ALL_STEPS}": partial(
                        last_mean, key=f"forks/precision_{name}", last=10**9
                    )
                    for name in ("ict", "entropy20", "stapo")
                },
                **{
                    f"{title}, mean over the {window} {WINDOW} steps": partial(window_mean, key=key, window=window)
                    for title, key in TIME_SERIES.items()
                    for window in WINDOWS
                },
            }
        )
    return table


REWARD_THRESHOLD = 0.6
ALL_STEPS = ", mean over all steps"  # the forks/* tables' window: each step's value, averaged over the run
FORK_METRICS = {  # observe/diagnostics.py: the update's weights against the task's true forks, mean over every step
    "precision of updated tokens on true forks": "forks/precision",
    "recall of true forks": "forks/recall",
    "share of the update's weight on true forks": "forks/weight_on_forks",
    "fork rate (a random selection's expected precision)": "forks/rate",
    "entropy at true forks (nats)": "forks/entropy_forks",
    "entropy elsewhere (nats)": "forks/entropy_other",
    # among decisions (positions with two or more valid options): the null a score must beat (issue #36 §2)
    "decision rate (share of response tokens that are decisions)": "forks/decision_rate",
    "fork rate among decisions (the decision-level null)": "forks/rate_in_decisions",
    "precision of updated tokens among decisions": "forks/precision_in_decisions",
    "lift of updated tokens among decisions (precision − null)": "forks/lift_in_decisions",
    "AUROC of JS, forks vs other decisions": "forks/auroc_js",
    "AUROC of entropy, forks vs other decisions": "forks/auroc_entropy",
    "AUROC of Rényi-2, forks vs other decisions": "forks/auroc_renyi2",
    "AUROC of −log π, forks vs other decisions": "forks/auroc_surprisal",
    "sampled invalid letter at non-fork positions (≈ their invalid mass)": "forks/invalid_nonfork",
    "sampled invalid letter at forks": "forks/invalid_at_forks",
    # failure anatomy: shares of the responses that fail, then absolute rates over every response
    "failed responses: an invalid letter": "forks/fail_invalid_letter",
    "failed responses: an invalid letter at a forced step (no fork, no decision)": "forks/fail_invalid_letter_forced",
    "failed responses: an invalid letter at a non-fork decision": "forks/fail_invalid_letter_decision",
    "failed responses: an early stop": "forks/fail_early_stop",
    "failed responses: a wrong branch": "forks/fail_wrong_branch",
    "failed responses: out of tokens": "forks/fail_out_of_tokens",
    "failed responses whose deciding token is a fork": "forks/fail_at_fork",
    "deciding-token reach: decided failures whose deciding token was updated": "forks/fail_decided_updated",
    "responses that fail (absolute)": "forks/fail_rate",
    "responses failing by an invalid letter (absolute)": "forks/fail_invalid_letter_of_all",
    "responses failing by an invalid letter at a forced step (absolute)": "forks/fail_invalid_letter_forced_of_all",
    "responses failing by a wrong branch (absolute)": "forks/fail_wrong_branch_of_all",
    "responses failing by an early stop (absolute)": "forks/fail_early_stop_of_all",
}


# as a time series: the mean over the run's first, middle and last WINDOW steps (issue #48: "drifts up" is measured)
TIME_SERIES = {"sampled invalid letter at non-fork positions": "forks/invalid_nonfork"}
WINDOWS = ("first", "middle", "last")


def step_mean(run: Run, value: Callable[[dict[str, float]], float]) -> float:
    """Mean of `value(step's metrics)` over the steps where it is defined (nan if none)."""
    values = []
    for metrics_of_step in run.steps.values():
        try:
            values.append(value(metrics_of_step))
        except KeyError:
            continue
    return sum(values) / len(values) if values else math.nan


def steps_to_reward(run: Run, threshold: float, window: int = 5) -> float:
    """The first rollout step (counted from 1) at which the mean training reward of the last `window` steps reaches
    `threshold`; where it never does, `Censored(the run's step count)`: the true number is larger and unknown, so the
    tables report how many runs are censored and the median, never a mean ± CI (`stats.censored_summary`)."""
    rewards = [run.steps[s]["train/reward"] for s in sorted(run.steps) if "train/reward" in run.steps[s]]
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window : end]) / window >= threshold:
            return float(end)
    return Censored(len(rewards))


def logs_forks(runs: list[Run]) -> bool:
    """Whether the runs' task named its forks (task=forks logs `forks/*`)."""
    return any("forks/rate" in values for run in runs for values in run.steps.values())


PASSK_KEY = re.compile(r"val/((?:[^/]+/)?pass@\d+)")  # val/pass@k (the task) or val/<benchmark>/pass@k


def passk_names(runs: list[Run]) -> list[str]:
    """The pass@k names the runs validated: the task's (pass@1, pass@4) first, then each extra benchmark's."""
    names = {
        match.group(1)
        for run in runs
        for values in run.validation.values()
        for key in values
        if (match := PASSK_KEY.fullmatch(key))
    }
    return sorted(names, key=lambda name: ("/" in name, name.rsplit("pass@", 1)[0], int(name.rsplit("@", 1)[1])))


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Complete runs by label, in the order the sweep listed them."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.complete:
            groups.setdefault(run.label, []).append(run)
    return groups


def metric_table(title: str, metric: Metric, groups: dict[str, list[Run]], baselines: list[str]) -> tuple[str, dict]:
    """A markdown table of one metric: per group n, mean ± 95% CI, the paired Δ against each baseline group present,
    per-seed values. The record keeps each Δ under `deltas` and the first baseline's also as `delta`. A right-censored
    value (`stats.Censored`: a run that never reached a threshold) makes its group's cell "> bound in k of n runs"
    with the median where it is determined, and no mean ± CI; a Δ involving a censored seed is not taken."""
    bases = {name: {run.seed: metric(run) for run in groups[name]} for name in baselines if name in groups}
    header = (
        "| group | n | mean ± 95% CI | "
        + "".join(f"Δ vs {name} (paired over seeds) | " for name in bases)
        + "per seed |"
    )
    lines = [f"### {title}", "", header, "|" + "---|" * (header.count("|") - 1)]
    record: dict[str, dict[str, Any]] = {}
    for label, members in groups.items():
        values = {run.seed: metric(run) for run in members}
        censored = any(isinstance(v, Censored) for v in values.values())
        interval = mean_ci(list(values.values()))
        seeds = ", ".join(
            f"s{seed}: {'> ' if isinstance(value, Censored) else ''}{value:.3f}"
            for seed, value in sorted(values.items())
            if not math.isnan(value)
        )
        deltas: dict[str, Interval | str] = {}  # a Δ, or why none: the baseline itself; a censored value
        for name, base in bases.items():
            if label == name:
                deltas[name] = "—"
            elif censored or _any_censored(base):
                deltas[name] = "censored: no Δ"
            else:
                deltas[name] = paired_difference(values, base)
        record[label] = {
            "interval": None if censored else asdict(interval),
            "per_seed": values,
            "deltas": {name: asdict(d) if isinstance(d, Interval) else None for name, d in deltas.items()},
        }
        if censored:
            record[label]["censored"] = censored_summary(list(values.values()))
        if bases:
            record[label]["delta"] = record[label]["deltas"][next(iter(bases))]
        shown = "".join(f"{d.format()} (n={d.n}) | " if isinstance(d, Interval) else f"{d} | " for d in deltas.values())
        cell = format_censored(record[label]["censored"]) if censored else interval.format()
        lines.append(f"| {label} | {interval.n} | {cell} | {shown}{seeds} |")
    return "\n".join(lines), record


def _any_censored(values: dict[int, float]) -> bool:
    return any(isinstance(v, Censored) for v in values.values())


def glance_table(records: dict[str, dict], groups: dict[str, list[Run]], ks: list[str], baseline: str | None) -> str:
    """One row per group: held-out pass@k after training (with the paired Δ against the baseline), final entropy
    and updated fraction — the headline of the per-metric tables below, from the same numbers."""

    def cell(record: dict | None) -> str:
        return "–" if not record else Interval(**record).format()

    columns = [(f"held-out {k} after training", True) for k in ks] + [
        ("token entropy, last 3 steps (nats)", False),
        ("fraction of tokens updated, last 3 steps", False),
    ]
    header = ["group", "n"]
    for title, paired in columns:
        header.append(title.replace("held-out ", ""))
        if paired and baseline:
            header.append(f"Δ vs {baseline}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, members in groups.items():
        row = [label, str(len(members))]
        for title, paired in columns:
            record = records[title][label]
            row.append(cell(record["interval"]))
            if paired and baseline:
                row.append("—" if label == baseline else cell(record.get("delta")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def runs_section(runs: list[Run], missing: list[dict[str, str]]) -> str:
    counts = {status: sum(run.status == status for run in runs) for status in ("complete", "failed", "incomplete")}
    lines = [
        "## Runs",
        "",
        f"{counts['complete']} complete, {counts['failed']} failed, {counts['incomplete']} incomplete, "
        f"{len(missing)} never started. **Only complete runs enter the tables and plots.**",
        "",
    ]
    bad = [run for run in runs if not run.complete]
    if bad or missing:
        lines.append(
            "⚠ Left out: "
            + "; ".join(
                [f"job {run.job} ({run.label}, seed {run.seed}) {run.status}: {run.reason}" for run in bad]
                + [f"{', '.join(f'{k}={v}' for k, v in combo.items())} never started" for combo in missing]
            )
        )
        lines.append("")
    lines += [
        "lr: `algorithm.optimizer.lr` as resolved in the run's own config; updated: the share of response tokens its "
        "selection updated (`select/fraction`), mean over all its steps.",
        "",
        "| job | group | seed | lr | updated | status | steps logged | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.job} | {run.label} | {run.seed} | {run.lr:.3g} | {run.updated_share:.3f} | {run.status} | "
            f"{len(run.steps)}/{run.total_steps} | {run.reason} |"
        )
    return "\n".join(lines)
