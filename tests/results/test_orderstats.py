"""The C radix selection (harness/results/_orderstats.c, issue 13) and the percentiles built
on it give numpy's answers bit for bit: order statistics equal a sorted copy's, and
``metrics.percentiles`` equals ``np.percentile``; bad input raises, and the cases it declines
(a NaN, too many equal values) fall back to numpy."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from harness.results import metrics
from harness.results.metrics import PERCENTILES, latency_stats, percentiles

_orderstats = pytest.importorskip("harness.results._orderstats")

_ALL = (50, *PERCENTILES)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


def _samples(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Shapes the summary meets: ITL-like gaps (one octave, repeated step times), integers
    (few distinct values), both signs, a wide range, a tie-heavy spread; and the float
    line's edges (infinities, subnormals, the largest finite values, zeros)."""
    if kind == "gaps":
        return np.repeat(rng.gamma(4.0, 0.006, n // 50 + 1), 50)[:n]
    if kind == "rounded":
        return np.round(rng.gamma(2.0, 0.01, n), 4)
    if kind == "signed":
        return rng.normal(0.0, 1.0, n)
    if kind == "wide":
        return np.exp(rng.uniform(-700.0, 700.0, n))
    if kind == "integers":
        return rng.integers(0, 5000, n).astype(np.float64)
    if kind == "edges":
        edge = [np.inf, -np.inf, 5e-324, -5e-324, 2e-310, 1.7e308, -1.7e308, 0.0]
        return np.concatenate([rng.normal(0.0, 1.0, n), edge])[rng.permutation(n + len(edge))][:n]
    raise AssertionError(kind)


_KINDS = ["gaps", "rounded", "signed", "wide", "integers", "edges"]


@pytest.fixture
def selections(monkeypatch):
    """What each select_ranks call answered (True: the C path gave the statistics)."""
    calls: list[bool] = []
    real = _orderstats.select_ranks

    def spy(*args):
        got = real(*args)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(_orderstats, "select_ranks", spy)
    return calls


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("n", [1, 2, 3, 33, 34, 1000, 70001])
def test_select_ranks_is_a_sorted_copy(kind, n):
    rng = np.random.default_rng(n)
    v = _samples(kind, n, rng)
    s = np.sort(v)
    picks = {0, n - 1, n // 2, (n - 1) // 3, n * 9 // 10}
    ranks = np.array(sorted(picks), dtype=np.int64)
    got = _orderstats.select_ranks(v, ranks, n)
    assert got is not None
    assert _bits(got).tolist() == _bits(s[ranks]).tolist()
    v0 = v.copy()
    _orderstats.select_ranks(v, ranks, n)
    assert _bits(v).tolist() == _bits(v0).tolist()  # only read


def test_select_ranks_every_rank_of_a_small_array():
    rng = np.random.default_rng(7)
    v = np.round(rng.normal(0.0, 3.0, 64), 0) + 0.0  # many ties (no negative zero)
    got = _orderstats.select_ranks(v, np.arange(64, dtype=np.int64), 64)
    assert list(got) == np.sort(v).tolist()


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("n", [65536, 65537, 300_001])
@pytest.mark.parametrize("pcts", [_ALL, (0, 100), (12.5, 33.3, 66.6), (99.99,)])
def test_percentiles_are_numpys_bit_for_bit(selections, kind, n, pcts):
    v = _samples(kind, n, np.random.default_rng(n + len(pcts)))
    with np.errstate(invalid="ignore"):  # inf - inf in numpy's lerp, as in ours
        want = np.percentile(v, pcts)
        got = percentiles(v, pcts)
    assert _bits(got).tolist() == _bits(want).tolist()
    assert selections == [True]  # from the selection, not numpy's fallback


@pytest.mark.parametrize("n", [1, 2, 5, 99, 1000])
def test_percentiles_of_small_arrays_through_the_selection(monkeypatch, selections, n):
    monkeypatch.setattr(metrics, "_SELECT_MIN", 1)  # the C path for every size
    v = _samples("rounded", n, np.random.default_rng(n))
    for pcts in (_ALL, (0, 100), (99.99,)):
        assert _bits(percentiles(v, pcts)).tolist() == _bits(np.percentile(v, pcts)).tolist()
    assert selections == [True] * 3


def test_percentiles_fall_back_to_numpy_where_the_selection_does_not_apply(selections):
    """Other dtypes and shapes, views it cannot read as plain doubles, too many or invalid
    percentiles: numpy's own answer (or error), the selection never asked."""
    v = _samples("rounded", 200_001, np.random.default_rng(11))
    raw = np.zeros(v.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(np.float64)
    unaligned[:] = v
    cases = [
        v.astype(np.float32),
        v.reshape(1, -1),
        v[::2],
        unaligned,
        v.astype(">f8"),
    ]
    for x in cases:
        assert _bits(percentiles(x, _ALL)).tolist() == _bits(np.percentile(x, _ALL)).tolist()
    many = tuple(np.linspace(0, 100, 33))
    assert _bits(percentiles(v, many)).tolist() == _bits(np.percentile(v, many)).tolist()
    for bad in ((50, 101), (-1,)):
        with pytest.raises(ValueError, match="Percentiles must be in the range"):
            percentiles(v, bad)
    assert selections == []


def test_the_environment_selects_numpy():
    code = "from harness.results import metrics as m; print(m._orderstats is None)"
    for value, none in (("1", "True"), ("0", "False")):
        env = {**os.environ, "HARNESS_PURE_SELECT": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == none


def test_latency_stats_reads_its_percentiles_from_the_selection(selections):
    """The summary's statistics are numpy's; with overwrite, the C path leaves them as they
    were (numpy's partition would have reordered them)."""
    v = _samples("gaps", 200_000, np.random.default_rng(3))
    ref = {
        "median_itl_ms": float(np.percentile(v, 50) * 1000.0),
        **{
            metrics.percentile_key(p, "itl"): float(np.percentile(v, p) * 1000.0)
            for p in PERCENTILES
        },
    }
    v0 = v.copy()
    out = latency_stats(v, "itl", overwrite=True)
    assert selections == [True]
    assert {k: out[k] for k in ref} == ref
    assert np.array_equal(v, v0)


def test_declined_cases_are_numpys():
    """A NaN (numpy's percentile is NaN) and more equal values than the copy may hold (the
    cap): select_ranks says None, and percentiles gives numpy's answer."""
    n = 100_000
    v = _samples("rounded", n, np.random.default_rng(1))
    v[123] = np.nan
    assert _orderstats.select_ranks(v, np.array([0, n // 2], dtype=np.int64), n) is None
    assert np.isnan(percentiles(v, _ALL)).all()
    flat = np.full(n, 0.025)
    flat[::9] = 0.5
    assert _orderstats.select_ranks(flat, np.array([n // 2], dtype=np.int64), n // 8) is None
    assert _orderstats.select_ranks(flat, np.array([n // 2], dtype=np.int64), n) == (0.025,)
    assert _bits(percentiles(flat, _ALL)).tolist() == _bits(np.percentile(flat, _ALL)).tolist()


def test_a_negative_zero_is_numpys_to_place(selections):
    """Which zero numpy's partition leaves at a rank depends on its arrangement of equal
    values, so a negative zero declines; without one, zeros are selected as any value."""
    v = np.concatenate([-np.ones(49_000), np.full(2_000, -0.0), np.ones(49_000)])
    got = percentiles(v, (50,))
    assert _bits(got).tolist() == _bits(np.percentile(v, (50,))).tolist()
    assert selections == [False]
    v = np.concatenate([-np.ones(49_000), np.zeros(2_000), np.ones(49_000)])
    assert _orderstats.select_ranks(v, np.array([0, 50_000, 99_999], dtype=np.int64), v.size) == (
        -1.0,
        0.0,
        1.0,
    )


def test_the_cap_bounds_the_copy():
    """The copy holds the samples of the ranks' narrow buckets: exactly the cap is allowed,
    one fewer declines."""
    v = np.concatenate([np.full(1000, 0.25), np.arange(1, 99_001) * 1e-3 + 1.0])
    rank = np.array([500], dtype=np.int64)
    assert _orderstats.select_ranks(v, rank, 1000) == (0.25,)
    assert _orderstats.select_ranks(v, rank, 999) is None


def test_two_levels_when_the_wide_buckets_overflow_the_cap():
    """Samples crowded into one bucket of the top 20 bits (more than the cap: the one-level
    pass gives up) but spread over the 32-bit ones: the two-level selection answers, the
    order statistics of a sorted copy."""
    rng = np.random.default_rng(12)
    v = 1.0 + rng.random(100_000) * 3e-3
    ranks = np.array([0, 5_000, 50_000, 99_000, 99_999], dtype=np.int64)
    assert _orderstats.select_ranks(v, ranks, 1000) == tuple(np.sort(v)[ranks])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((np.zeros(4), np.array([0], dtype=np.int64)), TypeError, "takes 3"),
        ((np.zeros(4, np.float32), np.array([0], dtype=np.int64), 4), TypeError, "float64"),
        ((np.zeros(4), np.array([0], dtype=np.int32), 4), TypeError, "int64"),
        ((np.zeros(4), np.array([], dtype=np.int64), 4), ValueError, "1 to 64"),
        ((np.zeros(4), np.array([4], dtype=np.int64), 4), ValueError, "ascend"),
        ((np.zeros(4), np.array([-1], dtype=np.int64), 4), ValueError, "ascend"),
        ((np.zeros(4), np.array([2, 1], dtype=np.int64), 4), ValueError, "ascend"),
        ((np.zeros(4), np.array([1, 1], dtype=np.int64), 4), ValueError, "ascend"),
        ((np.zeros(100), np.arange(65, dtype=np.int64), 100), ValueError, "1 to 64"),
        ((np.zeros(8)[::2], np.array([0], dtype=np.int64), 4), ValueError, "contiguous"),
        ((np.zeros(4), np.array([0], dtype=np.int64), "4"), TypeError, "integer"),
    ],
)
def test_bad_input_raises(args, error, match):
    with pytest.raises(error, match=match):
        _orderstats.select_ranks(*args)
