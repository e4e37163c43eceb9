"""The C radix selection (harness/results/_orderstats.c, issue 13) and the percentiles built
on it give numpy's answers bit for bit: order statistics equal a sorted copy's, and
``metrics.percentiles`` equals ``np.percentile``; bad input raises, and the cases it declines
(a NaN, too many equal values) fall back to numpy."""

from __future__ import annotations

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
    (few distinct values), both signs, a wide range, a tie-heavy spread."""
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
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["gaps", "rounded", "signed", "wide", "integers"])
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
    v = np.round(rng.normal(0.0, 3.0, 64), 0)  # many ties
    got = _orderstats.select_ranks(v, np.arange(64, dtype=np.int64), 64)
    assert list(got) == np.sort(v).tolist()


@pytest.mark.parametrize("kind", ["gaps", "rounded", "signed", "wide", "integers"])
@pytest.mark.parametrize("n", [65536, 65537, 300_001])
@pytest.mark.parametrize("pcts", [_ALL, (0, 100), (12.5, 33.3, 66.6), (99.99,)])
def test_percentiles_are_numpys_bit_for_bit(kind, n, pcts):
    v = _samples(kind, n, np.random.default_rng(n + len(pcts)))
    assert _bits(percentiles(v, pcts)).tolist() == _bits(np.percentile(v, pcts)).tolist()


@pytest.mark.parametrize("n", [1, 2, 5, 99, 1000])
def test_percentiles_of_small_arrays_through_the_selection(monkeypatch, n):
    monkeypatch.setattr(metrics, "_SELECT_MIN", 1)  # the C path for every size
    v = _samples("rounded", n, np.random.default_rng(n))
    for pcts in (_ALL, (0, 100), (99.99,)):
        assert _bits(percentiles(v, pcts)).tolist() == _bits(np.percentile(v, pcts)).tolist()


def test_latency_stats_reads_its_percentiles_from_the_selection(monkeypatch):
    """The summary's statistics are numpy's; with overwrite, the C path leaves them as they
    were (numpy's partition would have reordered them)."""
    v = _samples("gaps", 200_000, np.random.default_rng(3))
    calls = []
    real = _orderstats.select_ranks

    def spy(*args):
        got = real(*args)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(_orderstats, "select_ranks", spy)
    ref = {
        "median_itl_ms": float(np.percentile(v, 50) * 1000.0),
        **{
            metrics.percentile_key(p, "itl"): float(np.percentile(v, p) * 1000.0)
            for p in PERCENTILES
        },
    }
    v0 = v.copy()
    out = latency_stats(v, "itl", overwrite=True)
    assert calls == [True]
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


def test_both_zeros_are_one_value():
    v = np.array([0.0, -0.0, 1.0, -1.0, -0.0] * 20)
    got = _orderstats.select_ranks(v, np.array([0, 30, 99], dtype=np.int64), 100)
    assert got == (-1.0, 0.0, 1.0)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((np.zeros(4), np.array([0], dtype=np.int64)), TypeError),  # two arguments
        ((np.zeros(4, np.float32), np.array([0], dtype=np.int64), 4), TypeError),
        ((np.zeros(4), np.array([0], dtype=np.int32), 4), TypeError),
        ((np.zeros(4), np.array([], dtype=np.int64), 4), ValueError),
        ((np.zeros(4), np.array([4], dtype=np.int64), 4), ValueError),
        ((np.zeros(4), np.array([-1], dtype=np.int64), 4), ValueError),
        ((np.zeros(4), np.array([2, 1], dtype=np.int64), 4), ValueError),
        ((np.zeros(4), np.array([1, 1], dtype=np.int64), 4), ValueError),
        ((np.zeros(100), np.arange(65, dtype=np.int64), 100), ValueError),
        ((np.zeros(8)[::2], np.array([0], dtype=np.int64), 4), ValueError),  # not contiguous
    ],
)
def test_bad_input_raises(args, error):
    with pytest.raises((error, BufferError)):
        _orderstats.select_ranks(*args)
