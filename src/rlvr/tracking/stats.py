"""Small statistics for comparing runs across seeds: Student-t confidence intervals, curve areas.

No scipy: the t quantile is found by bisection on the CDF, which is written with the regularised
incomplete beta function (continued fraction, Numerical Recipes §6.4). Accurate to ~1e-10.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

# Metrics that are shares of something (accuracies, rates, fractions): their values lie in [0, 1].
_UNIT_METRIC = re.compile(r"(accuracy|_rate|_frac|success|pass@\d+)(_|$)")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse of `t_cdf`: t_quantile(0.975, 1) = 12.7062..., t_quantile(0.975, 4) = 2.7764..."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half-width) of the Student-t interval; half-width is nan for fewer than 2 values.

    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> round(m, 6), round(h, 4)   # 2 ± t(0.975, 2) · 1/√3 = 2 ± 4.3027 · 0.5774
    (2.0, 2.4841)
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)


def metric_bounds(metric: str) -> tuple[float, float] | None:
    """(0, 1) for a metric that is a share (an accuracy, a rate, a fraction), else None.

    >>> metric_bounds("eval/heldout_accuracy"), metric_bounds("reward/mean")
    ((0.0, 1.0), None)
    """
    return (0.0, 1.0) if _UNIT_METRIC.search(metric) else None


def clipped_interval(mean: float, half_width: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """(low, high) of mean ± half_width, clipped to the metric's `bounds`: with two or three seeds the
    Student-t interval of an accuracy near 0 or 1 reaches past it, where no accuracy can be.
    Clipping keeps the interval's coverage (the values it drops are impossible); it is not a
    Wilson interval, which would need the per-question counts the runs do not log.

    >>> clipped_interval(0.05, 0.2, (0.0, 1.0)), clipped_interval(0.05, 0.2, None)
    ((0.0, 0.25), (-0.15000000000000002, 0.25))
    """
    low, high = mean - half_width, mean + half_width
    if bounds is None or math.isnan(half_width):
        return low, high
    return max(low, bounds[0]), min(high, bounds[1])


def normalized_auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under a curve divided by its step range: the curve's average height.

    In the metric's own units, so runs of the same length compare directly; a single point
    returns its value.

    >>> normalized_auc([0, 10, 20], [0.0, 1.0, 1.0])   # (5 + 10) / 20
    0.75
    """
    if not steps:
        return math.nan
    if len(steps) == 1:
        return float(values[0])
    area = sum((steps[i + 1] - steps[i]) * (values[i] + values[i + 1]) / 2.0 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])
