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
