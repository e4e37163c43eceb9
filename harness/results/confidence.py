"""Bootstrap confidence intervals for headline metrics, single runs or repeated seeds.

Why a bootstrap: the headline numbers (P99 TBT, P99 TTFT, SLO attainment) are quantiles and
shares with no usable closed-form variance, and a user asking "does A beat B on P99?" needs
to know whether the gap is larger than the run-to-run noise (issue 20). Percentile
bootstrap (Efron & Tibshirani 1993, ch. 13), resampling *requests*, never single gaps: the
gaps of one request are correlated (one slow step delays all of its next token), so a
request with its gaps is the unit (cluster bootstrap, Davison & Hinkley 1997 §3.8).

Repeated runs (``--repeats K``) add a level: seeds are resampled with replacement, then
requests within each drawn seed (two-stage bootstrap, Davison & Hinkley §3.8 "strategy 1"),
so the interval covers seed-to-seed spread as well as within-run noise. With one run only
the requests are resampled.

A vs B: when both ran the same frozen trace for each seed, the same seeds and the same
request ids are drawn for both (paired), so the interval of B − A excludes the variance the
two runs share. Otherwise A and B are resampled independently.

A resample is a vector of non-negative integer weights, one per request: drawing seed ``s``
``m`` times and then ``m·n_s`` requests of it uniformly gives ``Multinomial(m·n_s, 1/n_s)``
counts (exactly the sum of ``m`` independent request resamples). Statistics are computed from the
weights without materialising the resampled data, which keeps 1000 resamples of 500k gaps to
seconds: quantiles only look at the top/bottom few percent of the sorted samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 1000


def resample_weights(
    strata_sizes: Sequence[int], n_boot: int, rng: np.random.Generator, *, two_stage: bool = True
) -> np.ndarray:
    """(n_boot, sum(strata_sizes)) integer weights: per resample, strata (seeds) drawn with
    replacement (when ``two_stage`` and there is more than one), then units within each."""
    sizes = np.asarray(strata_sizes, dtype=np.int64)
    k = sizes.size
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    w = np.zeros((n_boot, int(offsets[-1])), dtype=np.int32)
    if two_stage and k > 1:
        mult = rng.multinomial(k, np.full(k, 1.0 / k), size=n_boot)
    else:
        mult = np.ones((n_boot, k), dtype=np.int64)
    for s in range(k):
        n = int(sizes[s])
        if n == 0:
            continue
        lo, hi = offsets[s], offsets[s + 1]
        for m in np.unique(mult[:, s]):  # one vectorised draw per multiplicity
            if m == 0:
                continue
            rows = np.flatnonzero(mult[:, s] == m)
            # m·n uniform draws per row, counted per unit: Multinomial(m·n, 1/n)
            draws = rng.integers(0, n, size=(rows.size, int(m) * n))
            draws += (np.arange(rows.size) * n)[:, None]
            counts = np.bincount(draws.ravel(), minlength=rows.size * n)
            w[rows, lo:hi] = counts.reshape(rows.size, n)
    return w


@dataclass
class Samples:
    """Samples grouped by unit: ``values[i]`` belongs to unit ``unit[i]`` (0..n_units-1).

    Per-request metrics (TTFT) have one sample per unit; TBT has one per gap. NaN samples
    (a failed request's TTFT) are dropped here, their unit keeps weight but adds nothing."""

    values: np.ndarray
    unit: np.ndarray
    n_units: int

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=float)
        u = np.asarray(self.unit, dtype=np.int64)
        ok = np.isfinite(v)
        if not ok.all():
            v, u = v[ok], u[ok]
        if v.size > 1 and not bool(np.all(v[1:] >= v[:-1])):  # callers may pass sorted data
            order = np.argsort(v, kind="stable")
            v, u = v[order], u[order]
        self.values = v
        self.unit = u
        self.per_unit = np.bincount(self.unit, minlength=self.n_units).astype(float)
        self.sum_per_unit = np.bincount(self.unit, weights=self.values, minlength=self.n_units)

    @classmethod
    def per_unit_values(cls, values: np.ndarray) -> Samples:
        v = np.asarray(values, dtype=float)
        return cls(v, np.arange(v.size), v.size)

    def quantile(self, q: float) -> float:
        """The plain estimate, linear interpolation (numpy's default, vLLM's percentiles)."""
        return float(np.quantile(self.values, q)) if self.values.size else math.nan

    def mean(self) -> float:
        return float(self.values.mean()) if self.values.size else math.nan

    def boot_mean(self, w: np.ndarray) -> np.ndarray:
        num = w @ self.sum_per_unit
        den = w @ self.per_unit
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)

    def boot_quantile(self, w: np.ndarray, q: float) -> np.ndarray:
        """Weighted (inverted-CDF) ``q``-quantile of the samples under each weight row."""
        n = self.values.size
        out = np.full(w.shape[0], np.nan)
        if n == 0:
            return out
        totals = w @ self.per_unit
        # a tail quantile only needs the samples near that tail: take a window 5x wider than
        # the tail (plus a margin) and fall back to all samples if a resample needs more
        tail = min(q, 1.0 - q)
        # 3x the tail: a resample's tail count has sd ~ sqrt(tail·n), far inside that margin
        k = n if tail > 0.1 else min(n, int(3 * tail * n) + 200)
        top = q > 0.5
        # top tail: walk down from the largest sample until the weight above exceeds 1 - q;
        # otherwise walk up until the weight reaches q (inverted CDF)
        window = np.arange(n - 1, n - k - 1, -1) if top else np.arange(k)
        full = np.arange(n - 1, -1, -1) if top else np.arange(n)
        targets = (1.0 - q) * totals if top else q * totals
        chunk = max(1, 4_000_000 // max(k, 1))
        for a in range(0, w.shape[0], chunk):  # vectorised over resamples, in blocks
            rows = np.arange(a, min(a + chunk, w.shape[0]))
            cum = np.cumsum(w[np.ix_(rows, self.unit[window])], axis=1, dtype=np.int64)
            tgt = targets[rows][:, None]
            hit = cum > tgt if top else cum >= tgt
            found = hit.any(axis=1) & (totals[rows] > 0)
            j = np.argmax(hit, axis=1)
            out[rows[found]] = self.values[window[j[found]]]
            for b in rows[~found & (totals[rows] > 0)]:  # rare: the window was too narrow
                c = np.cumsum(w[b, self.unit[full]])
                jj = int(np.searchsorted(c, targets[b], side="right" if top else "left"))
                out[b] = self.values[full[min(jj, n - 1)]]
        return out


def stat_value(s: Samples, stat: str) -> float:
    """``mean`` or ``pNN`` (e.g. p99, p50) of the samples."""
    return s.mean() if stat == "mean" else s.quantile(_q(stat))


def stat_boot(s: Samples, stat: str, w: np.ndarray) -> np.ndarray:
    return s.boot_mean(w) if stat == "mean" else s.boot_quantile(w, _q(stat))


def _q(stat: str) -> float:
    if not stat.startswith("p"):
        raise ValueError(f"unknown statistic {stat!r}: use mean or pNN")
    return float(stat[1:]) / 100.0


def percentile_interval(boot: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    b = boot[np.isfinite(boot)]
    if b.size == 0:
        return (math.nan, math.nan)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(b, [a, 1.0 - a])
    return (float(lo), float(hi))


def bootstrap_ci(
    values: np.ndarray,
    stat: str = "mean",
    *,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(estimate, low, high) of ``stat`` over i.i.d. ``values`` (percentile bootstrap)."""
    s = Samples.per_unit_values(values)
    w = resample_weights([s.n_units], n_boot, np.random.default_rng(seed))
    lo, hi = percentile_interval(stat_boot(s, stat, w), level)
    return stat_value(s, stat), lo, hi


@dataclass
class Interval:
    """A headline metric with its interval (``level``), over ``units`` requests in ``strata``
    seeds."""

    value: float
    lo: float
    hi: float
    level: float
    units: int
    strata: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "value": self.value,
            "lo": self.lo,
            "hi": self.hi,
            "level": self.level,
            "requests": self.units,
            "seeds": self.strata,
        }


def pooled(parts: Sequence[Samples]) -> tuple[Samples, list[int]]:
    """One Samples over several strata (seeds), unit ids offset per stratum."""
    if len(parts) == 1:
        return parts[0], [parts[0].n_units]
    off = 0
    vals, units, sizes = [], [], []
    for p in parts:
        vals.append(p.values)
        units.append(p.unit + off)
        sizes.append(p.n_units)
        off += p.n_units
    if not parts:
        return Samples(np.zeros(0), np.zeros(0, dtype=np.int64), 0), []
    return Samples(np.concatenate(vals), np.concatenate(units), off), sizes


def interval(
    parts: Sequence[Samples],
    stat: str,
    *,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    weights: np.ndarray | None = None,
) -> Interval:
    """``stat`` over the pooled samples of every stratum, with its two-stage interval.
    ``weights``: resamples to reuse (:func:`resample_weights` of the same strata sizes), so
    that every metric of a run is judged on the same resamples, drawn once."""
    s, sizes = pooled(parts)
    w = (
        weights
        if weights is not None
        else resample_weights(sizes, n_boot, np.random.default_rng(seed))
    )
    lo, hi = percentile_interval(stat_boot(s, stat, w), level)
    return Interval(stat_value(s, stat), lo, hi, level, s.n_units, len(sizes))


@dataclass
class Difference:
    """B − A for one metric: estimate, interval, whether paired, and the verdict."""

    a: float
    b: float
    diff: float
    lo: float
    hi: float
    level: float
    paired: bool
    higher_is_better: bool
    units: int
    strata: int

    @property
    def verdict(self) -> str:
        """``better`` / ``worse`` (B relative to A) when the interval excludes 0, else
        ``inconclusive``."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return "inconclusive"
        if self.hi < 0:
            return "worse" if self.higher_is_better else "better"
        if self.lo > 0:
            return "better" if self.higher_is_better else "worse"
        return "inconclusive"

    def runs_needed(self) -> float | None:
        """How many times the data (requests per run, or seeds) would decide an inconclusive
        verdict: the interval's half-width shrinks as 1/sqrt(n), so it must shrink by
        |diff| / half-width. None when there is no difference to resolve."""
        half = (self.hi - self.lo) / 2.0
        if not math.isfinite(half) or abs(self.diff) < 1e-12:
            return None
        centre = (self.hi + self.lo) / 2.0
        # the interval excludes 0 once half-width < |centre|
        if abs(centre) < 1e-12:
            return None
        return max(1.0, (half / abs(centre)) ** 2)

    def as_dict(self) -> dict[str, object]:
        return {
            "a": self.a,
            "b": self.b,
            "diff": self.diff,
            "lo": self.lo,
            "hi": self.hi,
            "level": self.level,
            "paired": self.paired,
            "verdict": self.verdict,
            "more_data_factor": self.runs_needed() if self.verdict == "inconclusive" else None,
            "requests": self.units,
            "seeds": self.strata,
        }


def difference(
    parts_a: Sequence[Samples],
    parts_b: Sequence[Samples],
    stat: str,
    *,
    paired: bool,
    higher_is_better: bool = False,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    weights: tuple[np.ndarray, np.ndarray] | None = None,
) -> Difference:
    """B − A of ``stat``. ``paired``: stratum i of A and of B replayed the same trace, unit j
    the same request in both (the same weights are drawn for both)."""
    sa, sizes_a = pooled(parts_a)
    sb, sizes_b = pooled(parts_b)
    rng = np.random.default_rng(seed)
    if paired and sizes_a != sizes_b:
        paired = False
    if weights is not None:  # (A's, B's) resamples, drawn once for every metric
        wa, wb = weights
        wb = wa if paired else wb
    else:
        wa = resample_weights(sizes_a, n_boot, rng)
        wb = wa if paired else resample_weights(sizes_b, n_boot, rng)
    d = stat_boot(sb, stat, wb) - stat_boot(sa, stat, wa)
    lo, hi = percentile_interval(d, level)
    a, b = stat_value(sa, stat), stat_value(sb, stat)
    return Difference(
        a, b, b - a, lo, hi, level, paired, higher_is_better, sa.n_units, len(sizes_a)
    )
