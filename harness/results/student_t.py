"""Student-t critical values without scipy.

Why: the stability verdict needs one two-sided Student-t quantile per run, and importing
``scipy.special`` for it costs ~0.2 s of every ``harness simulate`` / ``replay`` process (its
array-API layer imports numpy's f2py). For the integer degrees of freedom the trend uses, the
t distribution's central probability has closed forms (Abramowitz & Stegun 26.7.3, 26.7.4),
monotone in ``θ = atan(q / √ν)``; bisection on ``θ`` inverts it to the last bit.
"""

from __future__ import annotations

import math

import numpy as np


def central_t_probability(theta: float, df: int) -> float:
    """``P(|T_ν| <= √ν·tan θ)`` for integer ``ν >= 1`` (A&S 26.7.3-4), θ in [0, π/2]."""
    s, c = math.sin(theta), math.cos(theta)
    odd = df % 2 == 1
    m = (df - 3) // 2 if odd else (df - 2) // 2  # the series' terms after the first
    series = 1.0
    if m > 0:
        k = np.arange(1, m + 1, dtype=float)
        ratio = 2 * k / (2 * k + 1) if odd else (2 * k - 1) / (2 * k)
        series += float(np.cumprod(ratio * (c * c)).sum())
    if not odd:
        return s * series
    if df == 1:
        return 2 * theta / math.pi
    return 2 / math.pi * (theta + s * c * series)


def two_sided_t(df: int, level: float) -> float:
    """The Student-t quantile ``q`` with ``P(|T_df| <= q) = level``: ``stdtrit(df, 0.5 +
    level / 2)`` for integer ``df >= 1``."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    df = int(df)
    lo, hi = 0.0, math.pi / 2
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):  # adjacent floats: θ is exact to the last bit
            break
        if central_t_probability(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan(hi)
