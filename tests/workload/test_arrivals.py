"""Arrival processes (anchors-harness.md §6.3) and rate schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.workload.arrivals import (
    arrival_times,
    arrivals_until,
    parse_rate_schedule,
    schedule_arrivals,
    trace_arrivals,
)
from harness.workload.trace import TraceError


def test_poisson_rate_within_confidence_interval() -> None:
    n, rate = 20_000, 50.0
    t = arrival_times(n, rate, "poisson", seed=7)
    est = n / t[-1]
    # The estimate's relative s.d. is 1/sqrt(n); allow 4 sigma.
    assert abs(est - rate) / rate < 4 / math.sqrt(n)
    gaps = np.diff(np.concatenate([[0.0], t]))
    cv2 = gaps.var() / gaps.mean() ** 2
    assert abs(cv2 - 1.0) < 0.05  # exponential gaps: CV^2 = 1


@pytest.mark.parametrize("b", [0.25, 0.5, 2.0, 8.0])
def test_gamma_cv2_is_one_over_burstiness(b: float) -> None:
    n, rate = 100_000, 10.0
    t = arrival_times(n, rate, "gamma", burstiness=b, seed=1)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert abs(gaps.mean() - 1 / rate) / (1 / rate) < 0.02  # mean gap stays 1/rate
    cv2 = gaps.var() / gaps.mean() ** 2
    assert abs(cv2 - 1 / b) / (1 / b) < 0.06


def test_constant_gaps_exact_and_inf_burstiness_is_constant() -> None:
    t = arrival_times(1000, 8.0, "constant")
    assert np.array_equal(np.diff(t), np.full(999, 0.125))
    assert t[0] == 0.125
    assert np.array_equal(arrival_times(1000, 8.0, "gamma", burstiness=math.inf), t)


def test_rate_inf_sends_all_at_zero() -> None:
    assert np.array_equal(arrival_times(5, math.inf), np.zeros(5))


def test_vllm_rescale_pins_last_arrival() -> None:
    t = arrival_times(100, 4.0, "poisson", seed=3, rescale=True)
    assert t[-1] == pytest.approx(100 / 4.0, rel=1e-12)
    plain = arrival_times(100, 4.0, "poisson", seed=3)
    assert t[-1] != pytest.approx(plain[-1])
    # same gaps up to a common factor: the seed still decides the shape
    assert np.allclose(t / t[-1], plain / plain[-1])


def test_seed_none_is_random_and_zero_is_a_seed() -> None:
    a = arrival_times(50, 1.0, seed=0)
    assert np.array_equal(a, arrival_times(50, 1.0, seed=0))
    assert not np.array_equal(arrival_times(50, 1.0, seed=None), arrival_times(50, 1.0, seed=None))


def test_arrivals_until_duration() -> None:
    t = arrivals_until(100.0, 20.0, seed=2)
    assert t.max() <= 100.0
    assert abs(len(t) - 2000) < 4 * math.sqrt(2000)
    # the same arrival stream as the count-based generator
    assert np.allclose(t[:10], arrival_times(10, 20.0, seed=2))


def test_trace_timestamps_shift_and_scale() -> None:
    t = trace_arrivals(np.array([100.0, 101.0, 103.0]), time_scale=0.5)
    assert np.array_equal(t, [0.0, 0.5, 1.5])
    with pytest.raises(TraceError, match="time_scale"):
        trace_arrivals(np.array([1.0]), time_scale=0)


def test_step_schedule_counts_per_window() -> None:
    s = parse_rate_schedule("0:10,60:50")
    t = schedule_arrivals(s, seed=4, duration_s=120.0)
    first = int((t <= 60).sum())
    second = int((t > 60).sum())
    assert abs(first - 600) < 4 * math.sqrt(600)
    assert abs(second - 3000) < 4 * math.sqrt(3000)
    assert s.cumulative(120.0) == pytest.approx(600 + 3000)


def test_ramp_and_sine_cumulative_match_numeric_integral() -> None:
    for spec in ("ramp:10:50:120", "ramp:0:5,30:20,60:0", "sine:20:15:60:0.3"):
        s = parse_rate_schedule(spec)
        grid = np.linspace(0, 100, 200_001)
        numeric = np.trapezoid(s.rate(grid), grid)
        assert float(s.cumulative(100.0)) == pytest.approx(numeric, rel=1e-6), spec


def test_ramp_arrival_density_follows_rate() -> None:
    s = parse_rate_schedule("ramp:10:50:100")
    t = schedule_arrivals(s, seed=5, duration_s=100.0)
    early, late = int((t < 20).sum()), int((t > 80).sum())
    exp_early = float(s.cumulative(20.0))  # 10..18 req/s -> 280
    exp_late = float(s.cumulative(100.0) - s.cumulative(80.0))  # 42..50 -> 920
    assert abs(early - exp_early) < 4 * math.sqrt(exp_early)
    assert abs(late - exp_late) < 4 * math.sqrt(exp_late)


def test_schedule_with_count_is_inverse_of_cumulative() -> None:
    s = parse_rate_schedule("sine:10:5:30")
    t = schedule_arrivals(s, "constant", seed=0, n=100)
    # constant unit gaps: the k-th arrival is where Lambda(t) = k
    assert np.allclose(s.cumulative(t), np.arange(1, 101), atol=1e-9)


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("", "empty"),
        ("5:10", "first knot"),
        ("0:10,0:20", "increase"),
        ("0:-1", ">= 0"),
        ("sine:10:20:60", "AMP <= MEAN"),
        ("0:0", "0 everywhere"),
        ("ramp:0:1,x", "TIME:RATE"),
    ],
)
def test_bad_schedules(spec: str, msg: str) -> None:
    with pytest.raises(TraceError, match=msg):
        parse_rate_schedule(spec)


def test_bad_process_and_rate() -> None:
    with pytest.raises(TraceError, match="unknown arrival process"):
        arrival_times(3, 1.0, "weibull")
    with pytest.raises(TraceError, match="rate must be > 0"):
        arrival_times(3, 0.0)
    with pytest.raises(TraceError, match="burstiness"):
        arrival_times(3, 1.0, "gamma", burstiness=0.0)
