"""The bootstrap intervals against distributions whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.results.confidence import (
    Samples,
    bootstrap_ci,
    difference,
    interval,
    resample_weights,
)


def test_weights_are_resamples() -> None:
    rng = np.random.default_rng(0)
    w = resample_weights([5, 7], 200, rng)
    assert w.shape == (200, 12)
    # each resample draws as many units as there are (seeds drawn k times, units within)
    assert (w.sum(axis=1) == 12).sum() > 0
    assert set(w[:, :5].sum(axis=1)) <= {0, 5, 10}  # stratum 1 drawn 0, 1 or 2 times
    single = resample_weights([5, 7], 50, rng, two_stage=False)
    assert (single[:, :5].sum(axis=1) == 5).all() and (single[:, 5:].sum(axis=1) == 7).all()


def test_weighted_quantile_equals_materialised_resample() -> None:
    rng = np.random.default_rng(1)
    v = rng.lognormal(0, 1, 3000)
    s = Samples.per_unit_values(v)
    w = resample_weights([v.size], 20, rng)
    for q in (0.5, 0.9, 0.99, 0.01):
        got = s.boot_quantile(w, q)
        for b in range(w.shape[0]):  # the same order statistic, up to float rounding of q·n
            r = np.sort(np.repeat(v, w[b]))
            first = int(np.searchsorted(r, got[b], side="left"))
            last = int(np.searchsorted(r, got[b], side="right")) - 1
            target = math.ceil(q * r.size) - 1
            assert r[first] == got[b] and first - 1 <= target <= last + 1
    np.testing.assert_allclose(s.boot_mean(w), [np.repeat(v, w[b]).mean() for b in range(20)])


def test_mean_interval_covers_normal_mean_95pct() -> None:
    """Normal(10, 2), n = 400: the 95% interval covers 10 in about 95% of 200 experiments
    (binomial sd 1.5%: accept 89-99%), and its width matches 2·1.96·σ/√n."""
    rng = np.random.default_rng(2)
    hits, widths = 0, []
    for k in range(200):
        x = rng.normal(10.0, 2.0, 400)
        est, lo, hi = bootstrap_ci(x, "mean", n_boot=400, seed=k)
        hits += lo <= 10.0 <= hi
        widths.append(hi - lo)
    assert 0.89 <= hits / 200 <= 0.99
    assert np.mean(widths) == pytest.approx(2 * 1.96 * 2.0 / math.sqrt(400), rel=0.1)


def test_quantile_interval_covers_exponential_p90() -> None:
    """Exp(1): the 90th percentile is ln 10; n = 1000."""
    rng = np.random.default_rng(3)
    truth = math.log(10.0)
    hits = 0
    for k in range(100):
        _, lo, hi = bootstrap_ci(rng.exponential(1.0, 1000), "p90", n_boot=400, seed=k)
        hits += lo <= truth <= hi
    assert 0.86 <= hits / 100 <= 1.0


def _clustered(rng: np.random.Generator, units: int, per: int, effect: float) -> Samples:
    u = np.repeat(np.arange(units), per)
    v = rng.normal(0.0, effect, units)[u] + rng.normal(0.0, 1.0, u.size)
    return Samples(v, u, units)


def test_cluster_bootstrap_covers_where_gap_resampling_would_not() -> None:
    """Gaps of one request share a request effect: resampling requests covers the true mean
    (0) ~95%; treating the gaps as independent would be ~3x too narrow."""
    rng = np.random.default_rng(4)
    hits, naive_hits = 0, 0
    for k in range(60):
        s = _clustered(rng, 150, 20, effect=2.0)
        iv = interval([s], "mean", n_boot=200, seed=k)
        hits += iv.lo <= 0.0 <= iv.hi
        _, lo, hi = bootstrap_ci(s.values, "mean", n_boot=200, seed=k)
        naive_hits += lo <= 0.0 <= hi
    assert hits / 60 >= 0.85
    assert naive_hits / 60 < 0.6


def test_two_stage_interval_includes_seed_spread() -> None:
    """Five seeds whose levels differ: the two-stage interval is wider than one that only
    resamples requests, and covers the mean of the seed levels' distribution."""
    rng = np.random.default_rng(5)
    parts = []
    for level in rng.normal(0.0, 1.0, 5):
        parts.append(Samples.per_unit_values(level + rng.normal(0.0, 1.0, 500)))
    two = interval(parts, "mean", n_boot=500)
    from harness.results.confidence import percentile_interval, pooled, stat_boot

    s, sizes = pooled(parts)
    w = resample_weights(sizes, 500, np.random.default_rng(0), two_stage=False)
    lo, hi = percentile_interval(stat_boot(s, "mean", w))
    assert (two.hi - two.lo) > 3 * (hi - lo)
    assert two.strata == 5 and two.units == 2500


def test_paired_difference_sees_a_small_shift_unpaired_does_not() -> None:
    """B = A's requests + 0.1: paired, the interval excludes 0 (B is worse: higher);
    unpaired, the request-to-request spread (sd 5) hides it."""
    rng = np.random.default_rng(6)
    base = rng.normal(50.0, 5.0, 800)
    a = Samples.per_unit_values(base)
    b = Samples.per_unit_values(base + 0.1 + rng.normal(0, 0.01, base.size))
    d = difference([a], [b], "mean", paired=True, n_boot=500)
    assert d.paired and d.verdict == "worse" and d.lo > 0
    assert d.diff == pytest.approx(0.1, abs=0.01)
    u = difference([a], [b], "mean", paired=False, n_boot=500)
    assert u.verdict == "inconclusive" and u.lo < 0 < u.hi
    need = u.runs_needed()
    assert need is not None and need > 10  # far more data would be needed
    # higher is better (attainment): the same shift is "better"
    h = difference([a], [b], "mean", paired=True, higher_is_better=True, n_boot=300)
    assert h.verdict == "better"


def test_p99_difference_verdict() -> None:
    rng = np.random.default_rng(7)
    a = Samples.per_unit_values(rng.exponential(100.0, 2000))
    b = Samples.per_unit_values(rng.exponential(60.0, 2000))
    d = difference([a], [b], "p99", paired=False, n_boot=300)
    assert d.verdict == "better" and d.hi < 0
    assert d.a == pytest.approx(100 * math.log(100), rel=0.15)
