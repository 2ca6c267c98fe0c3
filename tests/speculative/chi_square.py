"""Pearson's chi-square goodness-of-fit p-value without scipy (CI installs none).

p = Q(df / 2, X^2 / 2), the regularised upper incomplete gamma function, by its series for
x < a + 1 and Lentz's continued fraction otherwise (Numerical Recipes 6.2); both converge to
1e-14 relative here. Cells whose expected count is below MIN_EXPECTED are pooled into one cell
(the usual validity condition for the chi-square approximation).
"""
from __future__ import annotations

import math

import numpy as np

MIN_EXPECTED = 5.0


def _gamma_q(a: float, x: float) -> float:
    if x <= 0:
        return 1.0
    if x < a + 1:                                   # series for P, then Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(10000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    tiny = 1e-300                                   # continued fraction for Q
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi_square_p_value(observed, expected, *, statistic: float | None = None, df: int | None = None) -> float:
    """p-value of observed counts against expected counts (same total), or of a given statistic."""
    if statistic is None:
        observed = np.asarray(observed, np.float64)
        expected = np.asarray(expected, np.float64)
        small = expected < MIN_EXPECTED
        if small.any():
            observed = np.append(observed[~small], observed[small].sum())
            expected = np.append(expected[~small], expected[small].sum())
        keep = expected > 0
        if np.any(observed[~keep] > 0):
            return 0.0                              # an impossible outcome was observed
        observed, expected = observed[keep], expected[keep]
        statistic = float(((observed - expected) ** 2 / expected).sum())
        df = len(expected) - 1
    if df <= 0:
        return 1.0
    return _gamma_q(df / 2.0, statistic / 2.0)
