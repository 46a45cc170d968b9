"""The forks report's time series (report/tables.py, issue #48): a rate's mean over the first, middle and last 50 steps
of each run, so a drift over the run shows, where the all-steps mean hides it."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tokenrl.report.contrasts import contrast_metric, family
from tokenrl.report.runs import WINDOW, Run, window_mean
from tokenrl.report.tables import TIME_SERIES, metric_table, metrics

KEY = TIME_SERIES["sampled invalid letter at non-fork positions"]
STEPS = 170  # not a multiple of the window: the middle window is centred, the last one ends at the last step


def planted(label: str, seed: int, slope: float) -> Run:
    """A run whose rate rises by `slope` per step from 0.01 (0 with slope 0), with noise that averages out per window
    only approximately, and one step that did not log it."""
    noise = random.Random(seed)
    run = Run(job=f"{label}-{seed}", folder=Path("."), overrides={}, seed=seed, total_steps=STEPS, label=label)
    run.steps = {step: {KEY: 0.01 + slope * step + noise.uniform(-1e-3, 1e-3)} for step in range(STEPS)}
    run.steps[7] = {"train/reward": 0.0}  # a step without the metric is not counted in any window
    return run


def brute_force(run: Run, window: str) -> float:
    """The window's mean by hand: the steps that logged the rate, in order, the first / centred / last 50."""
    logged = [step for step in range(STEPS) if KEY in run.steps[step]]
    first = {"first": 0, "middle": (len(logged) - WINDOW) // 2, "last": len(logged) - WINDOW}[window]
    chosen = logged[first : first + WINDOW]
    return sum(run.steps[step][KEY] for step in chosen) / WINDOW


@pytest.mark.parametrize("window", ["first", "middle", "last"])
def test_a_window_mean_is_the_mean_of_its_steps(window):
    run = planted("oracle", 0, 4e-4)
    assert window_mean(run, KEY, window) == pytest.approx(brute_force(run, window), abs=1e-12)


def test_a_short_run_averages_every_step_and_one_without_the_rate_is_nan():
    run = planted("oracle", 0, 0.0)
    run.steps = {step: values for step, values in run.steps.items() if step < 20}
    every = sum(values[KEY] for values in run.steps.values() if KEY in values) / 19
    assert all(window_mean(run, KEY, window) == pytest.approx(every) for window in ("first", "middle", "last"))
    assert math.isnan(window_mean(Run("never", Path("."), {}, 0, 4), KEY, "last"))


def test_the_tables_show_a_planted_rise_and_a_flat_arm_as_flat():
    """Three seeds of an arm whose rate rises (4e-4 per step) and of one that stays flat: the report's three tables
    show the rise window by window (and the paired Δ against the flat arm growing), the flat arm the same in each."""
    groups = {
        "uniform": [planted("uniform", seed, 0.0) for seed in range(3)],
        "oracle": [planted("oracle", seed, 4e-4) for seed in range(3)],
    }
    tables = {
        title: metric
        for title, metric in metrics(["pass@1"], forks=True).items()
        if title.startswith("sampled invalid letter at non-fork positions, mean over the")
    }
    assert list(tables) == [
        f"sampled invalid letter at non-fork positions, mean over the {window} 50 steps"
        for window in ("first", "middle", "last")
    ]
    means = {}
    for title, metric in tables.items():
        _, record = metric_table(title, metric, groups, ["uniform"])
        means[title] = {label: record[label]["interval"]["mean"] for label in groups}
        deltas = record["oracle"]["delta"]["mean"]
        assert deltas == pytest.approx(means[title]["oracle"] - means[title]["uniform"], abs=1e-9)
    rising = [means[title]["oracle"] for title in tables]
    flat = [means[title]["uniform"] for title in tables]
    # the planted rate at the windows' centres: steps 25.4, 84.5 and 144.5 (of those that logged it), ± the noise
    assert rising == pytest.approx([0.01 + 4e-4 * 25.36, 0.01 + 4e-4 * 84.5, 0.01 + 4e-4 * 144.5], abs=1e-3)
    assert rising[0] < rising[1] < rising[2] and max(flat) - min(flat) < 1e-3


def test_a_step_window_contrast_pairs_the_arms_window_means():
    """`last:<key>` as a contrast metric (report/contrasts.py): per seed, the arms' last-window means, paired by hand;
    `all:<key>` is the mean over every step that logged it."""
    groups = {
        "uniform": [planted("uniform", seed, 0.0) for seed in range(4)],
        "oracle": [planted("oracle", seed, 4e-4 * (1 + seed)) for seed in range(4)],
    }
    (row,) = family(groups, ("oracle-uniform",), (f"last:{KEY}",))
    by_hand = [brute_force(a, "last") - brute_force(b, "last") for a, b in zip(groups["oracle"], groups["uniform"])]
    assert row["test"].mean == pytest.approx(sum(by_hand) / 4, abs=1e-12)
    run = groups["oracle"][2]
    every = [values[KEY] for values in run.steps.values() if KEY in values]
    assert contrast_metric(f"all:{KEY}")[1](run) == pytest.approx(sum(every) / len(every), abs=1e-12)
    with pytest.raises(ValueError, match="<all|first|middle|last>:<logged key>"):
        contrast_metric("latest:forks/rate")
