"""Stability verdicts on runs with known answers (synthetic FCFS queue; seed-stability.md §4)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.report.synthetic import synthetic_capacity_rps, write_synthetic_run
from harness.results.rundir import read_run
from harness.results.stability import (
    analyze_stability,
    backlog_series,
    departure_times,
    hac_trend,
    mser_cut,
    token_backlog,
)

CAP = synthetic_capacity_rps(8, 200, 100, 2e-4, 0.02)  # ≈ 3.96 req/s for the defaults


def _run(tmp_path: Path, load: float, seed: int, n: int = 1500):
    rd = write_synthetic_run(
        tmp_path / f"r{load}-{seed}", num_requests=n, rate=load * CAP, seed=seed
    )
    return read_run(rd)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_below_capacity_is_stable(tmp_path: Path, seed: int) -> None:
    run = _run(tmp_path, 0.6, seed)
    s = analyze_stability(run, capacity_rps=run.meta["synthetic"]["capacity_rps"])
    assert s["verdict"] == "stable", s["reason"]
    lo, hi = s["backlog_slope_ci"]
    assert lo <= s["backlog_slope_rps"] <= hi
    assert s["fluid_slope_rps"] == 0.0 and s["rho"] < 0.7
    # steady state: Little's law holds from the client view and from the engine's gauges
    assert s["little_law_ratio"] == pytest.approx(1.0, abs=0.05)
    assert s["little_law_ratio_server"] == pytest.approx(1.0, abs=0.05)
    # arrivals are completed at the rate they come
    assert s["completion_rate_rps"] == pytest.approx(s["arrival_rate_rps"], rel=0.1)
    # the token backlog (the paper's |X|) has no trend either, and its conditional drift is
    # Foster-like: up at low backlog, down at high backlog (seed-stability.md §4.3)
    tokens = float((run.requests["prompt_len"] + run.requests["output_len"]).mean())
    assert abs(s["token_backlog_slope_tps"]) < 0.02 * s["arrival_rate_rps"] * tokens
    drift = s["conditional_drift"]
    assert len(drift) == 4 and drift[0]["drift_per_s"] > 0 > drift[-1]["drift_per_s"]


@pytest.mark.parametrize("seed", [0, 1])
def test_above_capacity_is_unstable_with_fluid_growth_rate(tmp_path: Path, seed: int) -> None:
    run = _run(tmp_path, 1.6, seed)
    mu = run.meta["synthetic"]["capacity_rps"]
    s = analyze_stability(run, capacity_rps=mu)
    assert s["verdict"] == "unstable", s["reason"]
    # fluid prediction for a work-conserving FCFS queue: backlog grows at λ − μ (§4.3)
    assert s["fluid_slope_rps"] == pytest.approx(s["arrival_rate_rps"] - mu, rel=1e-3)
    assert s["backlog_slope_rps"] == pytest.approx(s["fluid_slope_rps"], rel=0.25)
    assert s["growth_rate_rps"] == s["backlog_slope_rps"] > 0
    assert s["ttft_slope_ms_per_s"] > 0  # waiting time grows with arrival time
    assert s["completion_rate_rps"] < s["arrival_rate_rps"]
    assert s["queue_slope_rps"] > 0  # the engine's waiting gauge grows too
    # the token backlog grows at the request rate times the tokens each request brings, and
    # drifts up at every backlog level
    tokens = float((run.requests["prompt_len"] + run.requests["output_len"]).mean())
    assert s["token_backlog_slope_tps"] == pytest.approx(s["backlog_slope_rps"] * tokens, rel=0.2)
    assert all(d["drift_per_s"] > 0 for d in s["conditional_drift"])


def test_critical_band_is_inconclusive(tmp_path: Path) -> None:
    run = _run(tmp_path, 1.0, 0, n=600)
    lam = analyze_stability(run)["arrival_rate_rps"]
    s2 = analyze_stability(run, capacity_rps=lam * 1.01)
    assert s2["verdict"] == "inconclusive" and "critical" in s2["reason"]


def _noisy_flat_requests(seed: int, lam: float = 10.0, horizon: float = 600.0) -> pd.DataFrame:
    """Poisson arrivals whose sojourn swings slowly (period 60 s) between 1 and 9 s: the backlog
    λ·W(t) oscillates between ~10 and ~90 with no trend; flat but very noisy."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / lam, int(lam * horizon)))
    phase = rng.uniform(0, 2 * np.pi)
    w = 5 + 4 * np.sin(2 * np.pi * t / 60 + phase) + rng.exponential(0.5, len(t))
    return pd.DataFrame(
        {
            "target_s": t,
            "send_s": t,
            "first_chunk_s": t + 0.2 * w,
            "last_chunk_s": t + w,
            "success": True,
            "error_kind": None,
        }
    )


def test_flat_noisy_backlog_is_never_unstable() -> None:
    verdicts = []
    for seed in range(12):
        run = SimpleNamespace(requests=_noisy_flat_requests(seed), samples=None)
        s = analyze_stability(run)
        verdicts.append(s["verdict"])
        # the CI never claims growth beyond the tolerance ε·λ̂ (2% of 10 req/s)
        assert s["backlog_slope_ci"][0] <= 0.02 * s["arrival_rate_rps"]
    assert "unstable" not in verdicts, verdicts


def test_departure_rules_and_backlog_counts() -> None:
    req = pd.DataFrame(
        {
            "target_s": [0.0, 1.0, 2.0, 3.0],
            "send_s": [0.0, 1.0, 2.0, 3.0],
            "first_chunk_s": [0.5, np.nan, np.nan, 3.5],
            "last_chunk_s": [1.5, np.nan, np.nan, np.nan],
            "success": [True, False, False, False],
            "error_kind": [None, "connect", "cancelled", "stream_cut"],
        }
    )
    dep = departure_times(req)
    # success: last chunk; failure: last time seen (send, first chunk); cancelled: never leaves
    assert dep[0] == 1.5 and dep[1] == 1.0 and np.isnan(dep[2]) and dep[3] == 3.5
    bs = backlog_series(req, grid_points=7)  # grid 0, .5, ..., 3.0 (last arrival)
    assert list(bs.t) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    # arrivals ≤ t minus departures ≤ t
    assert list(bs.backlog) == [1, 1, 1, 0, 1, 1, 2]


def test_hac_trend_recovers_slope_and_covers_truth() -> None:
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(40):
        t = np.linspace(0, 100, 500)
        e = np.zeros(500)
        for i in range(1, 500):  # AR(1) noise, rho = 0.9
            e[i] = 0.9 * e[i - 1] + rng.normal()
        tr = hac_trend(t, 0.3 * t + e)
        assert tr is not None
        covered += tr.ci[0] <= 0.3 <= tr.ci[1]
    assert covered >= 34  # ~95% nominal; a naive iid CI covers far less under rho=0.9


@pytest.mark.parametrize("n, lag", [(3000, 700), (20000, 150), (5001, 5000), (2, 1)])
@pytest.mark.parametrize("rho", [0.95, -0.9])
def test_the_long_run_variance_by_fft_is_the_lag_by_lag_sum(
    n: int, lag: int, rho: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hac_trend's Newey-West variance from one FFT (long series) equals the dot product a
    lag that short series take, to rounding of each lag's sum (rounding of the lag-0 sum
    each: the variance can be far smaller with negatively correlated scores): trending AR(1)
    scores, the last lag n - 1."""
    from harness.results import stability

    rng = np.random.default_rng(n)
    u = np.zeros(n)
    for i in range(1, n):
        u[i] = rho * u[i - 1] + rng.normal()
    u += np.linspace(0, 3, n)
    lag = min(lag, n - 1)
    monkeypatch.setattr(stability, "_FFT_WORK", -1)
    by_fft = stability._bartlett_long_run_variance(u, lag)
    monkeypatch.setattr(stability, "_FFT_WORK", 1 << 62)
    by_lag = stability._bartlett_long_run_variance(u, lag)
    assert abs(by_fft - by_lag) <= 1e-13 * float(u @ u) * (lag + 1)  # each lag: ~eps * u @ u


def test_mser_cut_finds_transient() -> None:
    x = np.concatenate([np.linspace(100, 10, 100), np.full(400, 10.0)])
    x[100:] += np.random.default_rng(1).normal(0, 1, 400)
    cut = mser_cut(x)
    assert 80 <= cut <= 130


def test_empty_and_tiny_runs() -> None:
    empty = SimpleNamespace(requests=pd.DataFrame(), samples=None)
    assert analyze_stability(empty)["verdict"] == "inconclusive"
    tiny = SimpleNamespace(requests=_noisy_flat_requests(0).head(20), samples=None)
    s = analyze_stability(tiny)
    assert s["verdict"] == "inconclusive"


@pytest.mark.parametrize(("rate", "expected"), [(2.0, "stable"), (60.0, "unstable")])
def test_engine_simulator_runs_below_and_above_capacity(
    tmp_path: Path, rate: float, expected: str
) -> None:
    """Engineer E's simulator (vLLM policy, a100 preset): far below the fluid critical rate
    (~30 req/s for the synthetic mix) the backlog is flat; at twice it the backlog grows."""
    sim = pytest.importorskip("harness.engine.simulate")
    cfg = sim.SimulateConfig(
        trace="synthetic",
        rate=rate,
        num_requests=1200,
        policies=["vllm"],
        out_dir=tmp_path,
        kv_tokens=100_000,
        cost_model="a100-llama2-7b",
    )
    (run_dir,) = sim.run_simulation(cfg)
    s = analyze_stability(read_run(run_dir))
    assert s["verdict"] == expected, s["reason"]
    assert s["fluid_capacity_rps"] and s["fluid_capacity_rps"] > 0  # from run.json cost_model
    if expected == "unstable":
        assert s["rho"] > 1.5 and s["backlog_slope_rps"] >= s["fluid_slope_rps"] > 0
    else:
        assert s["rho"] < 0.2 and s["fluid_slope_rps"] == 0.0


def test_token_backlog_by_hand() -> None:
    """W(t) from events: arrival +prompt+output, first chunk -prompt, each chunk -tokens, a
    departure -the rest; a cancelled request keeps its remainder."""
    requests = pd.DataFrame(
        {
            "req": [0, 1, 2],
            "target_s": [0.0, 0.5, 3.5],
            "prompt_len": [10, 5, 7],
            "output_len": [4, 3, 2],
            "first_chunk_s": [1.0, 2.5, np.nan],
            "last_chunk_s": [4.0, 2.5, np.nan],
            "success": [True, False, False],
            "error_kind": [None, "stream_cut", "cancelled"],
        }
    )
    chunks = pd.DataFrame(
        {"req": [0, 0, 0, 0, 1], "t_s": [1.0, 2.0, 3.0, 4.0, 2.5], "tokens": [1, 1, 1, 1, 1]}
    )
    t = np.array([0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 3.6, 4.0])
    w = token_backlog(requests, chunks, t)
    # r0: 14 -> 3 at its first chunk, then -1 per chunk; r1: 8 until 2.5, where its prompt
    # and one token are done and the cut stream takes the other 2 away; r2 (cancelled): 9.
    assert w.tolist() == [14, 22, 11, 10, 2, 1, 10, 9]


def test_token_backlog_needs_the_chunk_log(tmp_path: Path) -> None:
    """A run read without its chunks (read_run(chunks=False)) gets no token backlog rather
    than one that only drops at departures; the request verdict is the same."""
    rd = write_synthetic_run(tmp_path / "r", num_requests=400, rate=0.6 * CAP, seed=0)
    full = analyze_stability(read_run(rd))
    bare = analyze_stability(read_run(rd, chunks=False))
    assert full["token_backlog_slope_tps"] is not None and full["conditional_drift"]
    assert bare["token_backlog_slope_tps"] is None and bare["conditional_drift"] is None
    assert bare["verdict"] == full["verdict"]


def test_lag1_correlation_of_a_constant_side_is_nan_not_an_error() -> None:
    # corrcoef's answer (NaN, which hac_trend reads as rho = 0) when u[1:] or u[:-1] is flat
    from harness.results.stability import _lag1_corr

    assert np.isnan(_lag1_corr(np.array([1.0, 2.0, 2.0, 2.0, 2.0])))
    assert np.isnan(_lag1_corr(np.array([2.0, 2.0, 2.0, 2.0, 1.0])))
    u = np.array([1.0, 3.0, 2.0, 5.0, 4.0, 6.0])
    assert _lag1_corr(u) == pytest.approx(np.corrcoef(u[1:], u[:-1])[0, 1])
