"""Mean ± 95% confidence interval over seeds, and paired differences against a baseline.

Half-width = t_{0.975, n−1} · s / √n with s the sample standard deviation (Student's t; n − 1 degrees of freedom).
Paired difference over the seeds both arms completed: d_s = x_s − b_s, then the same interval on d.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# two-sided 95% Student-t quantiles t_{0.975, df} (standard tables); between entries: linear in 1/df
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
Z975 = 1.960


def t975(df: int) -> float:
    """t_{0.975, df} for df >= 1."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in T975:
        return T975[df]
    known = sorted(T975)
    upper = next((k for k in known if k > df), None)
    lower = max(k for k in known if k < df)
    hi_value = T975[upper] if upper else Z975
    x, x0, x1 = 1 / df, 1 / lower, (1 / upper if upper else 0.0)
    return hi_value + (T975[lower] - hi_value) * (x - x1) / (x0 - x1)


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    half_width: float  # nan when n < 2

    def format(self, digits: int = 3) -> str:
        if self.n == 0:
            return "–"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (n=1, no CI)"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def mean_ci(values: list[float]) -> Interval:
    """Mean and 95% half-width of `values` (NaNs dropped)."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    n = len(xs)
    if n == 0:
        return Interval(0, math.nan, math.nan)
    mean = sum(xs) / n
    if n == 1:
        return Interval(1, mean, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return Interval(n, mean, t975(n - 1) * sd / math.sqrt(n))


def paired_difference(arm: dict[int, float], baseline: dict[int, float]) -> Interval:
    """Mean ± 95% CI of arm − baseline over the seeds present (and not NaN) in both."""
    seeds = sorted(s for s in set(arm) & set(baseline) if not math.isnan(arm[s]) and not math.isnan(baseline[s]))
    return mean_ci([arm[s] - baseline[s] for s in seeds])


class Censored(float):
    """A right-censored value: the true value is larger than this bound (e.g. the steps a run took to reach a reward
    it never reached: at least its step count). A float, so it sorts and prints as its bound; tables that meet one
    report the censoring instead of a mean ± CI (`censored_summary`)."""


def censored_summary(values: list[float]) -> dict:
    """n, the number censored, and the median where it is determined: the censored values are at least their bound,
    so when every bound is ≥ every observed value (a run's length, in a sweep of equal lengths) the median is known
    while fewer than half the runs are censored; otherwise it is reported as `> bound`."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    censored: list[float] = [v for v in xs if isinstance(v, Censored)]
    observed = [v for v in xs if not isinstance(v, Censored)]
    n, k = len(xs), len(censored)
    bound = min(censored) if censored else math.nan
    median, median_censored = math.nan, False
    if n:
        # order statistics: the observed values, then the censored ones (each at least its bound ≥ every observed)
        ordered = observed + censored if all(c >= max(observed, default=-math.inf) for c in censored) else None
        middle = (n - 1) / 2
        if ordered is None:
            median_censored = k > 0
        else:
            lower, upper = ordered[math.floor(middle)], ordered[math.ceil(middle)]
            median = (lower + upper) / 2
            median_censored = isinstance(upper, Censored)
    return {"n": n, "censored": k, "bound": bound, "median": median, "median_censored": median_censored}


def format_censored(summary: dict, digits: int = 1) -> str:
    """'> 200 in 3 of 12 runs; median 61.0' — no mean ± CI, since a censored value has no known size."""
    if summary["n"] == 0:
        return "–"
    head = f"> {summary['bound']:.0f} in {summary['censored']} of {summary['n']} runs (censored)"
    if summary["median_censored"] or math.isnan(summary["median"]):
        return f"{head}; median > {summary['bound']:.0f}"
    return f"{head}; median {summary['median']:.{digits}f}"


# --- Student t, paired tests, Holm and power (float64, no SciPy needed) ------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz; Numerical Recipes §6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom: ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on `t_sf` to float64 precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True)
class PairedTest:
    """The paired t-test of arm − other over the seeds both completed: Δ, its 95% CI, SD of the differences, p."""

    seeds: tuple[int, ...]
    mean: float
    half_width: float  # nan when n < 2
    sd: float  # of the paired differences; nan when n < 2
    t: float
    p: float  # two-sided; nan when n < 2 (and 1.0 when every difference is 0)

    @property
    def n(self) -> int:
        return len(self.seeds)


def paired_t_test(arm: dict[int, float], other: dict[int, float]) -> PairedTest:
    """Two-sided paired t-test of `arm` − `other` over the seeds present (and not NaN) in both. The CI is the same
    as `paired_difference`'s (Student t, n − 1 df). Differences all equal: sd 0, p 0 if their mean is not 0, else 1."""
    seeds = tuple(sorted(s for s in set(arm) & set(other) if not math.isnan(arm[s]) and not math.isnan(other[s])))
    diffs = [arm[s] - other[s] for s in seeds]
    interval = mean_ci(diffs)
    n = len(diffs)
    if n < 2:
        return PairedTest(seeds, interval.mean, math.nan, math.nan, math.nan, math.nan)
    sd = math.sqrt(sum((d - interval.mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0.0:
        t = 0.0 if interval.mean == 0 else math.copysign(math.inf, interval.mean)
        p = 1.0 if interval.mean == 0 else 0.0
    else:
        t = interval.mean / (sd / math.sqrt(n))
        p = min(1.0, 2.0 * t_sf(abs(t), n - 1))
    return PairedTest(seeds, interval.mean, interval.half_width, sd, t, p)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: with p_(1) ≤ … ≤ p_(m) sorted,
    p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)). A NaN p (a pre-registered contrast that could not be tested:
    too few pairs) still counts in m, as p = 1 (conservative: the others are adjusted for it), and stays NaN.
    Rejecting where p̃ < α controls the family-wise error at α."""
    filled = [1.0 if math.isnan(p) else p for p in pvalues]
    order = sorted(range(len(filled)), key=lambda i: filled[i])
    m, running = len(order), 0.0
    adjusted = [math.nan] * len(pvalues)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = math.nan if math.isnan(pvalues[i]) else running
    return adjusted


def _chi_weights(df: int, points: int = 2000) -> tuple[list[float], list[float]]:
    """Nodes u and Simpson weights of ∫ g(u) du over u = √V, V ~ χ²_df, whose density in u is
    2u^(df−1)e^(−u²/2) / (2^(df/2)Γ(df/2))."""
    top = math.sqrt(df) + 12.0
    h = top / points
    log_norm = math.log(2.0) - (df / 2.0) * math.log(2.0) - math.lgamma(df / 2.0)
    nodes, weights = [], []
    for i in range(points + 1):
        u = i * h
        density = 0.0 if u == 0.0 else math.exp(log_norm + (df - 1) * math.log(u) - u * u / 2.0)
        simpson = 1.0 if i in (0, points) else (4.0 if i % 2 else 2.0)
        nodes.append(u)
        weights.append(density * simpson * h / 3.0)
    return nodes, weights


def paired_t_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level `alpha` with n pairs when the differences are N(effect, sd²):
    P(|T'| > t_{1−α/2, n−1}) for the noncentral t T' = (Z + λ)/√(V/ν), λ = effect·√n / sd, ν = n − 1, computed
    exactly (no normal approximation) by integrating P(Z > c·√(V/ν) − λ) + P(Z < −c·√(V/ν) − λ) over V ~ χ²_ν
    (Simpson's rule in √V)."""
    return _power(effect * math.sqrt(n) / sd, n - 1, t_quantile(1.0 - alpha / 2.0, n - 1), _chi_weights(n - 1))


def _power(ncp: float, df: int, crit: float, grid: tuple[list[float], list[float]]) -> float:
    total = 0.0
    for u, w in zip(*grid):
        if w:
            scale = crit * u / math.sqrt(df)
            total += w * (normal_cdf(ncp - scale) + normal_cdf(-scale - ncp))
    return min(1.0, total)


def min_detectable_effect(sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true mean paired difference (in the metric's units) that the two-sided paired t-test at level
    `alpha` detects with probability `power`, for n pairs whose differences have SD `sd`: the root in δ of
    `paired_t_power`(δ, sd, n, alpha) = power (noncentral t, exact; bisection on λ = δ√n/sd). NaN when n < 2 or sd
    is NaN; 0 when sd is 0."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if sd == 0.0:
        return 0.0
    df, grid = n - 1, _chi_weights(n - 1)
    crit = t_quantile(1.0 - alpha / 2.0, df)
    lo, hi = 0.0, 1.0
    while _power(hi, df, crit, grid) < power:
        hi *= 2.0
    for _ in range(50):
        mid = (lo + hi) / 2.0
        if _power(mid, df, crit, grid) < power:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0 * sd / math.sqrt(n)
