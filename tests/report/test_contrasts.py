"""Pre-registered contrasts, Holm, censored metrics and power (report/stats.py, report/contrasts.py) on synthetic
sweeps: known numbers in, known decisions out; the statistics against brute-force and reference implementations."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import subprocess
import sys

import pytest
import yaml

import tests.report.test_report as fabricate
from tests.conftest import ROOT
from tokenrl.report.contrasts import Spec, contrasts_section, family, parse_contrast, validation_auc
from tokenrl.report.runs import load_sweep
from tokenrl.report.stats import (
    T975,
    Censored,
    censored_summary,
    format_censored,
    holm,
    min_detectable_effect,
    paired_t_power,
    paired_t_test,
    t_quantile,
    t_sf,
)
from tokenrl.report.tables import group_runs, steps_to_reward

# --- Holm ------------------------------------------------------------------------------------------------------------


def holm_brute_force(pvalues: list[float]) -> list[float]:
    """The smallest α at which Holm's step-down procedure (p_(j) ≤ α / (m − j + 1) in ascending order, stop at the
    first that is not) rejects each hypothesis; every candidate α is one of the (m − j + 1)·p_(j), or 1."""
    m = len(pvalues)

    def rejected(alpha: float) -> set[int]:
        out = set()
        for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
            if min(1.0, pvalues[i] * (m - rank)) > alpha:
                break
            out.add(i)
        return out

    candidates = sorted({min(1.0, (m - r) * p) for r, p in enumerate(sorted(pvalues))} | {1.0})
    return [min(a for a in candidates if i in rejected(a)) for i in range(m)]


def test_holm_matches_the_brute_force_step_down_procedure():
    rng = random.Random(0)
    for _ in range(300):
        m = rng.randint(1, 8)
        pvalues = [round(rng.random() ** 3, 2) for _ in range(m)]  # rounding makes ties
        assert holm(pvalues) == pytest.approx(holm_brute_force(pvalues), abs=1e-12), pvalues
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])  # sorted 0.005·4, 0.01·3, 0.03·2, max(0.04·1, 0.06)
    for pvalues in (holm([0.2, 0.01, 0.5]),):
        order = sorted(range(3), key=lambda i: [0.2, 0.01, 0.5][i])
        assert all(pvalues[a] <= pvalues[b] for a, b in itertools.pairwise(order))  # monotone in the raw p


def test_holm_counts_an_untestable_contrast_in_the_family():
    adjusted = holm([0.01, math.nan, 0.02])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.03) and adjusted[2] == pytest.approx(0.04)


# --- Student t and the paired test ----------------------------------------------------------------------------------


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_reproduces_the_printed_table(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=5e-4)


def test_t_distribution_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 11, 30, 200):
        for t in (0.0, 0.05, 0.7, 1.96, 3.1, 8.0, 40.0):
            assert t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-10, abs=1e-300)
        for p in (0.6, 0.9, 0.975, 0.995, 0.9995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)


def test_t_distribution_closed_forms():
    """Without SciPy: df = 1 is Cauchy, P(T > t) = ½ − atan(t)/π; df = 2: P(T > t) = ½ − t / (2√(2 + t²))."""
    for t in (0.0, 0.3, 1.0, 2.5, 10.0):
        assert t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-12)
        assert t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), rel=1e-12)


def test_paired_test_against_scipy_and_only_over_seeds_both_completed():
    a = {0: 0.61, 1: 0.72, 2: 0.55, 3: 0.80, 4: 0.66, 5: math.nan, 7: 0.9}
    b = {0: 0.50, 1: 0.70, 2: 0.41, 3: 0.62, 4: 0.66, 5: 0.3, 6: 0.2}
    test = paired_t_test(a, b)
    assert test.seeds == (0, 1, 2, 3, 4) and test.n == 5
    diffs = [a[s] - b[s] for s in test.seeds]
    assert test.mean == pytest.approx(sum(diffs) / 5)
    stats = pytest.importorskip("scipy.stats")
    reference = stats.ttest_rel([a[s] for s in test.seeds], [b[s] for s in test.seeds])
    assert test.t == pytest.approx(reference.statistic, rel=1e-10)
    assert test.p == pytest.approx(reference.pvalue, rel=1e-9)


def test_paired_test_ties_and_too_few_pairs():
    same = paired_t_test({0: 0.5, 1: 0.5}, {0: 0.5, 1: 0.5})
    assert (same.mean, same.sd, same.p) == (0.0, 0.0, 1.0)
    shifted = paired_t_test({0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.6})  # every difference 0.1: no variance, p 0
    assert shifted.sd == pytest.approx(0.0, abs=1e-15) or shifted.p < 1e-6
    one = paired_t_test({0: 0.6, 1: 0.7}, {0: 0.5})
    assert one.n == 1 and math.isnan(one.p) and math.isnan(one.half_width)


# --- power -----------------------------------------------------------------------------------------------------------


def test_power_against_a_known_table_value_and_scipy():
    # one-sample / paired t, n = 10, d = 1, α = 0.05 two-sided: power 0.8031 (Cohen 1988; G*Power)
    assert paired_t_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.8031, abs=1e-4)
    assert min_detectable_effect(1.0, 10, 0.05) == pytest.approx(0.996, abs=1e-3)
    stats = pytest.importorskip("scipy.stats")
    for n, d, alpha in ((12, 0.9, 0.01), (3, 2.0, 0.05), (20, 0.4, 0.01)):
        crit = stats.t.ppf(1 - alpha / 2, n - 1)
        ncp = d * math.sqrt(n)
        reference = stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp)
        assert paired_t_power(d, 1.0, n, alpha) == pytest.approx(reference, abs=1e-8)


def test_minimum_detectable_effect_has_80_percent_power_by_simulation():
    """12 pairs at α = 0.05/5: simulate paired t-tests with the true Δ at the MDE; about 80% reject."""
    np = pytest.importorskip("numpy")
    n, sd, alpha = 12, 0.07, 0.05 / 5
    mde = min_detectable_effect(sd, n, alpha)
    assert paired_t_power(mde, sd, n, alpha) == pytest.approx(0.8, abs=1e-6)
    normal_approximation = (3.0 + 0.8416) * sd / math.sqrt(n)  # z_{0.995}·… would understate it at n = 12
    assert mde > normal_approximation * 0.99
    rng = np.random.default_rng(0)
    trials = 40_000
    diffs = rng.normal(mde, sd, size=(trials, n))
    t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / math.sqrt(n))
    power = float((np.abs(t) > t_quantile(1 - alpha / 2, n - 1)).mean())
    assert power == pytest.approx(0.8, abs=0.01)  # MC standard error 0.002


# --- censoring -------------------------------------------------------------------------------------------------------


def test_censored_summary_reports_counts_and_the_median_only_where_determined():
    values = [30.0, 41.0, Censored(200), 52.0, Censored(200)]
    summary = censored_summary(values)
    assert (summary["n"], summary["censored"], summary["bound"], summary["median"]) == (5, 2, 200, 52.0)
    assert format_censored(summary) == "> 200 in 2 of 5 runs (censored); median 52.0"
    most = censored_summary([30.0, Censored(200), Censored(200)])
    assert most["median_censored"] and format_censored(most) == "> 200 in 2 of 3 runs (censored); median > 200"
    even = censored_summary([10.0, 20.0, Censored(100), Censored(100)])  # the median straddles a censored value
    assert even["median_censored"] and format_censored(even).endswith("median > 100")


def test_steps_to_reward_is_censored_where_never_reached(tmp_path):
    fabricate.write_job(tmp_path, 0, "uniform", 0)  # rewards 0, 0.1, 0.2, 0.3 (seed 0): never 0.6
    fabricate.write_job(tmp_path, 1, "uniform", 1)  # 1.0 … 1.3: reaches it at the first full window
    runs = load_sweep(tmp_path)
    never, reached = (steps_to_reward(run, 0.6, window=2) for run in runs)
    assert isinstance(never, Censored) and never == 4.0
    assert not isinstance(reached, Censored) and reached == 2.0


# --- synthetic sweeps through scripts/report.py ----------------------------------------------------------------------

N_SEEDS = 12
ARMS = ("uniform", "oracle", "random")
REPORT_BLOCK = {
    "contrasts": ["oracle-random", "uniform-random"],
    "primary": "pass@1",
    "secondary": ["pass@4", "reward_auc", "pass@1_auc"],
}


def planted_pass1() -> dict[tuple[str, int], float]:
    """Per graph a shared level; oracle = random + 0.2 (planted), uniform and random the same distribution (null)."""
    rng = random.Random(7)
    table = {}
    for seed in range(N_SEEDS):
        level = rng.uniform(0.3, 0.5)
        table[("random", seed)] = level + rng.gauss(0, 0.04)
        table[("uniform", seed)] = level + rng.gauss(0, 0.04)
        table[("oracle", seed)] = level + 0.2 + rng.gauss(0, 0.04)
    return table


@pytest.fixture
def planted(tmp_path, monkeypatch):
    monkeypatch.setattr(fabricate, "PASS1", planted_pass1())
    folder = tmp_path / "multirun"
    job = 0
    for arm in ARMS:
        for seed in range(N_SEEDS):
            if (arm, seed) == ("oracle", 11):  # never ran: oracle's contrasts pair 11 graphs
                continue
            fabricate.write_job(folder, job, arm, seed)
            config = folder / str(job) / ".hydra" / "config.yaml"
            config.write_text(yaml.safe_dump(yaml.safe_load(config.read_text()) | {"report": REPORT_BLOCK}))
            job += 1
    return folder


def test_planted_effect_is_decided_and_the_null_is_not(planted):
    groups = group_runs(load_sweep(planted))
    rows = family(groups, ("oracle-random", "uniform-random"), ("pass@1",))
    oracle, null = rows
    pass1 = planted_pass1()
    seeds = list(range(11))
    assert oracle["test"].seeds == tuple(seeds) and oracle["only_b"] == [11] and null["test"].n == 12
    assert oracle["test"].mean == pytest.approx(sum(pass1["oracle", s] - pass1["random", s] for s in seeds) / 11)
    assert oracle["decided"] and oracle["holm"] == pytest.approx(min(1.0, 2 * oracle["test"].p))
    assert not null["decided"] and null["holm"] > 0.05


def test_contrasts_section_renders_from_the_sweep_config(planted, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(planted), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.md").read_text()
    section = report.split("## Pre-registered contrasts")[1].split("## Runs")[0]
    primary = section.split("### Primary: held-out pass@1 after training (a family of 2, Holm)")[1].split("###")[0]
    assert "| oracle − random | 11 (seeds 11 only in random) |" in primary
    assert "MDE (80% power, α/m = 0.025)" in primary
    oracle_row = next(line for line in primary.splitlines() if line.startswith("| oracle − random"))
    null_row = next(line for line in primary.splitlines() if line.startswith("| uniform − random"))
    assert oracle_row.split("|")[7].strip() == "**yes**" and null_row.split("|")[7].strip() == "no"
    assert "Power: with n = 11, 12 pairs" in primary
    secondary = section.split("### Secondary (a separate family of 6, Holm within it; not confirmatory)")[1]
    assert "| held-out pass@4 after training | oracle − random | 11 (seeds 11 only in random) |" in secondary
    assert "| training reward, curve AUC (mean over rollout steps) | uniform − random |" in secondary
    payload = json.loads((out / "report.json").read_text())["contrasts"]
    assert [row["contrast"] for row in payload["primary"]] == ["oracle − random", "uniform − random"]
    assert payload["primary"][0]["decided"] is True and payload["primary"][1]["decided"] is False
    mde = payload["primary"][1]["mde"]
    assert mde == pytest.approx(min_detectable_effect(payload["primary"][1]["sd"], 12, 0.025))


def test_command_line_contrasts_replace_the_config_and_a_bad_metric_is_one_error_line(planted, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "scripts/report.py", str(planted), "--out", str(out), "--contrasts", "oracle-uniform"]
    done = subprocess.run(command + ["--primary", "pass@4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert "### Primary: held-out pass@4 after training (a family of 1, Holm)" in report
    assert "Named before the runs, in the command line (--contrasts)" in report and "Secondary" not in report
    assert "--contrasts oracle-uniform --primary pass@4" in report  # the reproduce line
    bad = subprocess.run(command + ["--primary", "pass4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: contrast metric 'pass4'")


def test_censored_steps_to_reward_in_the_report_table(tmp_path, monkeypatch):
    """A forks sweep of 6 steps: uniform reaches a 5-step reward of 0.6 at step 5 on seeds 1 and 2 and never on seed
    3, ict never: "> 6 in k of n runs" with the median where it is known, no mean ± CI, no Δ."""
    monkeypatch.setattr(fabricate, "TOTAL_STEPS", 6)
    folder = tmp_path / "multirun"
    for job, (arm, seed) in enumerate(itertools.product(("uniform", "ict"), (1, 2, 3))):
        fabricate.write_job(folder, job, arm, seed, steps=6)
        path = folder / str(job) / "csv" / "metrics.csv"
        rows = list(csv.DictReader(path.open()))
        for row in rows:
            row["forks/rate"] = 0.3
            row["train/reward"] = 0.0 if arm == "ict" or seed == 3 else 1.0
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(folder), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    table = report.split("### steps to a training reward of 0.6 (5-step mean; censored if never)")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| uniform") or line.startswith("| ict")]
    assert rows == [
        "| uniform | 3 | > 6 in 1 of 3 runs (censored); median 5.0 | — | s1: 5.000, s2: 5.000, s3: > 6.000 |",
        "| ict | 3 | > 6 in 3 of 3 runs (censored); median > 6 | censored: no Δ | s1: > 6.000, s2: > 6.000, "
        "s3: > 6.000 |",
    ]
    record = json.loads((tmp_path / "out" / "report.json").read_text())["metrics"]
    steps = next(v for k, v in record.items() if k.startswith("steps to a training reward"))
    assert steps["ict"]["interval"] is None and steps["ict"]["censored"]["censored"] == 3


def test_parse_contrast_and_the_auc():
    assert parse_contrast("oracle-matched_random", ["oracle", "matched_random"]) == ("oracle", "matched_random")
    assert parse_contrast("lr=1e-3 - lr=2e-3", ["lr=1e-3", "lr=2e-3"]) == ("lr=1e-3", "lr=2e-3")
    with pytest.raises(ValueError, match="expected arm_a-arm_b"):
        parse_contrast("oracle", ["oracle"])

    class FakeRun:
        validation = {0: {"val/pass@1": 0.2}, 50: {"val/pass@1": 0.6}, 100: {"val/pass@1": 0.6}}

    assert validation_auc(FakeRun, "val/pass@1") == pytest.approx((50 * 0.4 + 50 * 0.6) / 100)


def test_section_with_an_absent_arm_keeps_it_in_the_family(planted):
    groups = group_runs(load_sweep(planted))
    text, record = contrasts_section(groups, Spec(("oracle-random", "ict-random"), "pass@1", (), "a test"))
    assert "| ict − random | 0 (ict: no complete run) |" in text
    assert record["primary"][0]["holm"] == pytest.approx(min(1.0, 2 * record["primary"][0]["p"]))  # m = 2
