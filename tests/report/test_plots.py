"""The sweep figures read at a glance: distinct hues per group, legends off the data, integer steps from 1, CI bands."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
from matplotlib.ticker import MaxNLocator

from tokenrl.report.plots import PALETTE, curves_figure, group_style, passk_figure, plot_curves
from tokenrl.report.runs import Run
from tokenrl.report.stats import mean_ci

STEPS = 6


def make_run(label: str, seed: int, offset: float) -> Run:
    run = Run(job=f"{label}-{seed}", folder=Path("."), overrides={}, seed=seed, total_steps=STEPS, label=label)
    run.steps = {
        s: {
            "train/reward": offset + 0.1 * s + 0.01 * seed,
            "train/entropy": 1.0,
            "train/renyi2": 0.5,
            "select/fraction": 0.1,
        }
        for s in range(STEPS)
    }
    run.validation = {STEPS: {"val/pass@1": 0.3 + 0.1 * seed, "val/pass@4": 0.6}}
    return run


def hue_gap(a: str, b: str) -> float:
    """Circular hue distance of two colours; 1 when either is achromatic (saturation or value < 0.2)."""
    (ha, sa, va), (hb, sb, vb) = (mcolors.rgb_to_hsv(mcolors.to_rgb(c)) for c in (a, b))
    if min(sa, sb, va, vb) < 0.2:
        return 1.0
    return min(abs(ha - hb), 1 - abs(ha - hb))


def groups_of(count: int, seeds: int = 3) -> dict[str, list[Run]]:
    return {f"m{g}": [make_run(f"m{g}", seed, 0.02 * g) for seed in range(seeds)] for g in range(count)}


def test_the_first_twenty_groups_have_twenty_distinct_hues_and_later_ones_another_line_style():
    assert len(set(PALETTE)) == 20
    # any two of the first ten differ in hue (or one is grey / black), unlike tab20's dark/light pairs of one hue
    for a, b in itertools.combinations(PALETTE[:10], 2):
        assert hue_gap(a, b) >= 0.04, (a, b)
    tab20 = [mcolors.to_hex(plt.get_cmap("tab20")(i)) for i in range(2)]
    assert hue_gap(*tab20) < 0.04  # the check would have caught the old palette's first two groups
    styles = {tuple(group_style(i).items()) for i in range(40)}
    assert len(styles) == 40 and group_style(20)["linestyle"] != group_style(0)["linestyle"]


def test_curves_count_steps_from_one_on_an_integer_axis_with_the_ci_band_over_seeds():
    groups = groups_of(2)
    fig = curves_figure(groups)
    reward_axis = fig.axes[0]
    first = reward_axis.get_lines()[0]
    assert list(first.get_xdata()) == list(range(1, STEPS + 1))  # the console's "step 1/N" … "step N/N"
    expected = [mean_ci([run.steps[s]["train/reward"] for run in groups["m0"]]) for s in range(STEPS)]
    assert list(first.get_ydata()) == pytest.approx([iv.mean for iv in expected])
    band = reward_axis.collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == pytest.approx(max(iv.mean + iv.half_width for iv in expected))
    assert all(isinstance(ax.xaxis.get_major_locator(), MaxNLocator) for ax in fig.axes)
    fraction_band = fig.axes[3].collections[0].get_paths()[0].vertices  # every seed 0.1: the band stays in [0, 1]
    assert 0.0 <= fraction_band[:, 1].min() and fraction_band[:, 1].max() <= 1.0
    assert all(tick.is_integer() for tick in reward_axis.get_xticks())


@pytest.mark.parametrize("make", ["curves", "passk"])
def test_legends_sit_outside_every_axes(make, tmp_path):
    groups = groups_of(12)
    fig = (
        curves_figure(groups)
        if make == "curves"
        else passk_figure(groups, ["pass@1", "pass@4"], {"pass@1": 0.3, "pass@4": 0.6})
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), (make, ax.get_title())


def test_a_wide_interval_is_clipped_to_the_metric_range():
    groups = {"m": [make_run("m", seed, 0.0) for seed in range(2)]}
    groups["m"][0].steps[0]["train/reward"], groups["m"][1].steps[0]["train/reward"] = 0.0, 1.0  # t(1)·σ/√2 ≫ 1
    groups["m"][0].steps[0]["train/entropy"], groups["m"][1].steps[0]["train/entropy"] = 0.0, 2.0
    fig = curves_figure(groups)
    reward = fig.axes[0].collections[0].get_paths()[0].vertices
    assert reward[:, 1].min() == 0.0 and reward[:, 1].max() == 1.0
    entropy = fig.axes[1].collections[0].get_paths()[0].vertices  # bounded below only
    assert entropy[:, 1].min() == 0.0 and entropy[:, 1].max() > 2.0


def test_a_single_seed_draws_no_band_and_the_file_is_a_png(tmp_path):
    fig = curves_figure(groups_of(1, seeds=1))
    assert not fig.axes[0].collections
    path = plot_curves(groups_of(3), tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
