"""Network stability analysis (harness.results.network): W(t) from the balance equations, loads,
window maxima and the verdict on hand-made series."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.results.network import (
    RS_FLAG,
    agent_loads,
    call_work,
    network_verdict,
    rs_flag,
    token_backlog,
    window_maxima,
)


def _samples(rows):
    return pd.DataFrame(
        rows,
        columns=[
            "engine",
            "t_s",
            "num_steps",
            "step_duration_s",
            "prefill_tokens",
            "decode_tokens",
        ],
    )


def test_backlog_is_released_work_minus_served_tokens() -> None:
    # a1: a call of prompt 10, output 3 (work 12) released at 0; served 10 then 1 then 1
    # a2: work 5 released at 2, served by one fast-forwarded row of 5 one-token steps [3, 8]
    calls = pd.DataFrame(
        {"agent": ["a1", "a2"], "release_s": [0.0, 2.0], "work": call_work([10, 1], [3, 5])}
    )
    samples = _samples(
        [
            ("a1", 1.0, 1, 1.0, 10, 0),
            ("a1", 2.0, 1, 1.0, 0, 1),
            ("a1", 3.0, 1, 1.0, 0, 1),
            ("a2", 8.0, 5, 5.0, 0, 5),
        ]
    )
    grid = np.arange(0.0, 9.0)
    wb = token_backlog(calls, samples, grid)
    np.testing.assert_allclose(wb.per_agent["a1"], [12, 2, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(wb.per_agent["a2"], [0, 0, 5, 5, 4, 3, 2, 1, 0])
    np.testing.assert_allclose(wb.total, wb.per_agent["a1"] + wb.per_agent["a2"])


def test_loads_count_offered_work_when_the_session_arrives() -> None:
    calls = pd.DataFrame(
        {
            "agent": ["a", "a"],
            "release_s": [0.0, np.nan],  # the second hop never got released
            "offered_s": [0.0, 0.0],
            "work": [50, 30],
        }
    )
    samples = _samples([("a", 1.0, 1, 1.0, 50, 0)])
    got = agent_loads(calls, samples, {"a": 10.0}, 0.0, 10.0)["a"]
    assert got["rho"] == 0.8 and got["utilisation"] == 0.5


def test_window_maxima_join_the_last_edge_point() -> None:
    t = np.arange(0.0, 19.0)  # 0..18 with windows of 9: two windows, 18 joins the second
    assert window_maxima(t, t * 2, 9.0) == [16.0, 36.0]


def test_verdicts_on_growing_and_bounded_series() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 5000.0)
    grow = 200.0 * t + rng.normal(0, 5000, len(t))
    v = network_verdict(t, grow, offered_rate=1000.0)
    assert v["verdict"] == "unstable" and 190 < v["slope"] < 210
    ar = np.zeros(len(t))
    for i in range(1, len(t)):  # a mean-reverting backlog around 10k tokens
        ar[i] = 0.9 * ar[i - 1] + rng.normal(0, 1000)
    v = network_verdict(t, 10_000 + ar, offered_rate=1000.0, mean_sojourn=20.0)
    assert v["verdict"] == "stable", v
    v = network_verdict(t, 10_000 + ar, offered_rate=1000.0, mean_sojourn=1000.0)
    assert v["verdict"] == "inconclusive" and "mean sojourns" in v["reason"]


def test_peak_test_catches_growth_in_cycles() -> None:
    """Sawtooth cycles whose peaks quadruple (the RS shape): the CI is wide, the peaks grow."""
    t = np.arange(0.0, 9000.0)
    w = np.zeros(len(t))
    start, peak, length = 0, 100_000.0, 900
    while start < len(t):  # rise to the peak, drain to a third of it, next cycle 4x larger
        n = min(length, len(t) - start)
        up = n // 3
        w[start : start + up] = np.linspace(peak / 12, peak, up)
        w[start + up : start + n] = np.linspace(peak, peak / 3, n - up)
        start, peak, length = start + n, peak * 4, int(length * 1.6)
    v = network_verdict(t, w, offered_rate=1000.0)
    assert v["verdict"] == "unstable" and v["peak_ratio"] >= 2, v
    # one late spike on a flat backlog doubles the peak but has no trend: not unstable
    flat = np.full(len(t), 10_000.0) + 1000 * np.sin(t / 50)
    flat[8000:8010] = 40_000.0
    v = network_verdict(t, flat, offered_rate=1000.0)
    assert v["peak_ratio"] >= 2 and v["verdict"] != "unstable", v


def test_rs_flag_only_for_underloaded_divergence() -> None:
    assert rs_flag({"a": 0.9, "b": 0.9}, "unstable") == RS_FLAG
    assert rs_flag({"a": 0.9, "b": 1.1}, "unstable") is None
    assert rs_flag({"a": 0.9}, "stable") is None
