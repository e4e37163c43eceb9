"""Stability analysis of one run: is the backlog bounded, or does it grow, and how fast?

Why: a latency percentile from an overloaded run depends on how long the run lasted; only a
queue-growth verdict says whether a rate is sustainable (anchors-harness.md §5 item 3,
seed-stability.md §4). Works on live and simulated runs alike (only the run directory).

Rules (each cites its source; "REC" = the spec's recommendation, "ours" = our choice):

- Backlog ``B(t)`` = arrivals − departures, in requests (anchors §5.3; seed-stability §4.2
  lists requests-in-system as the secondary measure, REC 12). Arrival = ``target_s`` (the
  offered load, not the send time). Departure = ``last_chunk_s`` for a success; for a failure
  the last time seen (``last_chunk_s``, else ``first_chunk_s``, else ``send_s``, else
  ``target_s``: a lower bound); a ``cancelled`` request (in flight when the run stopped) never
  departs. Sampled on a regular grid of ``grid_points`` points.
- Analysis window ends at the last arrival (or the end of observation if earlier): after the
  arrivals stop the backlog can only drain, which would bias the trend down (ours).
- Warm-up cut: MSER-5 (anchors §5.3 suggests MSER) on the backlog grid, clamped to
  [20 %, 50 %] of the window (seed-stability §4.3: "discard a warm-up of ≥ 20–50 % of T").
- Trend: OLS slope of ``B(t)`` on the rest (seed-stability §4.3). Its CI uses a Newey–West
  (Bartlett) HAC variance, because ``B(t)`` on a fine grid is strongly autocorrelated, with
  Andrews' (1991) AR(1) plug-in bandwidth; the critical value is Student-t with
  ``n / (L + 1)`` degrees of freedom (ours: a conservative small-sample correction).
- Verdict (seed-stability §4.6, in request units, ε = ``epsilon``·λ̂):
  ``unstable`` if the CI's lower bound > ε; ``stable`` if its upper bound < ε **and** the
  last-quarter mean backlog is not above the previous quarter's by more than 2 standard
  deviations of ``B`` **and** the window spans ≥ 10 mean sojourn times; else
  ``inconclusive``. Always ``inconclusive`` inside the critical band |1 − ρ̂| < ``delta`` when
  an exact capacity is given (``capacity_rps``), and with fewer than 30 arrivals after the
  cut. The cost-model fluid rate is only a necessary condition (above it no policy is
  stable), so it is reported (``rho``, ``fluid_slope_rps``) but never vetoes a verdict.
- Token backlog ``W(t)`` (seed-stability §4.2, the paper's own measure |X|): unprocessed
  prompt + output tokens of the requests in the system, from the chunk log: an arrival adds
  ``prompt_len + output_len`` (the requested ``max_tokens``), the first chunk removes the
  prompt, each chunk its tokens, a departure the rest. Its OLS/Newey–West trend
  (``token_backlog_slope_tps``) and the **conditional drift** (§4.3: mean dW/dt per backlog
  level, four quantile bins of the window; negative drift in the top bin is Foster-style
  evidence of stability) are reported beside the verdict; they do not change it (ours: the
  request backlog needs no chunk log, so every run gets the same verdict rule).
- Little's law (anchors §5.3): ``little_law_ratio`` = mean B / (λ̂ · mean sojourn) over the
  window (sojourns of requests still in the system are censored at the end of observation);
  ≈ 1 in steady state. ``little_law_ratio_server`` uses the engine's running + waiting
  gauges (samples) for L, an independent measurement.
- Fluid comparison (seed-stability §4.3): with a known capacity μ (req/s), ρ̂ = λ̂/μ and the
  fluid slope is max(0, λ̂ − μ); a work-conserving scheduler above capacity should match it.
  μ is ``capacity_rps`` if given, else WAIT's fluid critical rate for the run's length mix
  (seed-wait.md §2.2) from ``cost_model`` or, for simulated runs, run.json ``cost_model``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from harness.results.student_t import two_sided_t

VERDICT_STABLE = "stable"
VERDICT_UNSTABLE = "unstable"
VERDICT_INCONCLUSIVE = "inconclusive"

MIN_ARRIVALS = 30
MIN_SOJOURNS_IN_WINDOW = 10.0


@dataclass
class BacklogSeries:
    """Backlog on a regular grid (run clock, seconds) plus the per-request times it came from."""

    t: np.ndarray
    backlog: np.ndarray
    arrivals: np.ndarray  # sorted arrival times
    departures: np.ndarray  # departure time per request (NaN: never departed), arrival order
    t_end: float  # end of the analysis window (last arrival / end of observation)
    t_obs: float  # end of observation (last timestamp seen)


def numeric_column(requests: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats (unparseable -> NaN), or all NaN when the run lacks it."""
    if name not in requests:
        return np.full(len(requests), np.nan)
    return pd.to_numeric(requests[name], errors="coerce").to_numpy(dtype=float)


def departure_times(requests: pd.DataFrame) -> np.ndarray:
    """Departure time per row of ``requests`` (NaN: still in the system); see module rules."""
    n = len(requests)
    if n == 0:
        return np.zeros(0)

    col = partial(numeric_column, requests)
    dep = col("last_chunk_s")
    for fallback in ("first_chunk_s", "send_s", "target_s"):
        dep = np.where(np.isnan(dep), col(fallback), dep)
    success = (
        requests["success"].fillna(False).to_numpy(dtype=bool)
        if "success" in requests
        else np.ones(n, dtype=bool)
    )
    last = col("last_chunk_s")
    # A success without a last chunk cannot happen in a valid run; keep its fallback time.
    dep = np.where(success & ~np.isnan(last), last, dep)
    if "error_kind" in requests:
        cancelled = (requests["error_kind"].astype(object) == "cancelled").to_numpy()
        dep = np.where(cancelled & ~success, np.nan, dep)
    return dep


def backlog_series(requests: pd.DataFrame, grid_points: int = 1000) -> BacklogSeries:
    """B(t) = arrivals(≤ t) − departures(≤ t) on a regular grid over [0, t_end]."""
    arr = numeric_column(requests, "target_s")
    dep = departure_times(requests)
    keep = ~np.isnan(arr)
    arr, dep = arr[keep], dep[keep]
    order = np.argsort(arr, kind="stable")
    arr, dep = arr[order], dep[order]
    observed = [x for x in (arr, dep[~np.isnan(dep)]) if len(x)]
    for c in ("send_s", "first_chunk_s", "last_chunk_s"):
        v = numeric_column(requests, c)
        if np.isfinite(v).any():
            observed.append(v[np.isfinite(v)])
    t_obs = float(max(np.max(x) for x in observed)) if observed else 0.0
    t_end = float(min(arr[-1], t_obs)) if len(arr) else 0.0
    if t_end <= 0:
        t_end = t_obs
    t = np.linspace(0.0, t_end, max(int(grid_points), 2))
    dep_sorted = np.sort(dep[~np.isnan(dep)])
    b = np.searchsorted(arr, t, side="right") - np.searchsorted(dep_sorted, t, side="right")
    return BacklogSeries(t, b.astype(float), arr, dep, t_end, t_obs)


@dataclass
class ChunkTotals:
    """The chunk log as W(t) reads it (:func:`token_backlog`): tokens delivered per request
    (rows of the requests frame) and chunk tokens per bin of the grid (entry k: the rows
    with ``searchsorted(grid, t, "left") == k``, k = 0..len(grid)); ``rows``: how many
    chunk rows they sum. Why: W only sums chunk tokens per request and per bin, so a 15M-row
    log reduces to these (:func:`harness.results.chunklog.bin_token_sums`) with the same W.
    Every row counted must belong to a request of the frame with a known arrival."""

    per_request: np.ndarray
    per_bin: np.ndarray
    rows: int

    def __len__(self) -> int:
        return self.rows


def token_backlog(
    requests: pd.DataFrame, chunks: pd.DataFrame | ChunkTotals, t: np.ndarray
) -> np.ndarray:
    """W(t): unprocessed prompt + output tokens in the system at each grid time (module rules).

    Event sums on the sorted grid ``t``, vectorised: arrivals add each request's tokens at
    ``target_s``, the first chunk removes its prompt, every chunk its tokens, the departure
    (``departure_times``) the rest; a request that never departs keeps its remainder.
    ``chunks``: the CHUNKS frame, or its :class:`ChunkTotals` on this grid. Every event is a
    whole number of tokens, so the float sums are exact in any order: the chunk events are
    summed per bin apart from the others with the same W."""
    n = len(requests)

    col = partial(numeric_column, requests)
    arr, first = col("target_s"), col("first_chunk_s")
    prompt = np.nan_to_num(col("prompt_len"))
    total = prompt + np.nan_to_num(col("output_len"))
    dep = departure_times(requests)
    ok = ~np.isnan(arr)
    if isinstance(chunks, ChunkTotals):
        chunk_tok, chunk_bins = chunks.per_request, chunks.per_bin
    else:
        req_ids = requests["req"].to_numpy() if "req" in requests else np.arange(n)
        pos = pd.Index(req_ids).get_indexer(chunks["req"].to_numpy()) if len(chunks) else []
        pos = np.asarray(pos, dtype=np.int64)
        ct = chunks["t_s"].to_numpy(dtype=float) if len(chunks) else np.zeros(0)
        ck = chunks["tokens"].to_numpy(dtype=float) if len(chunks) else np.zeros(0)
        keep = pos >= 0  # chunks of requests in this frame with a known arrival
        keep[keep] = ok[pos[keep]]
        pos, ct, ck = pos[keep], ct[keep], ck[keep]
        chunk_tok = np.bincount(pos, weights=ck, minlength=n)
        # W(t_k) sums the events at times <= t_k: bin each event at the first grid point at
        # or after it, then a running sum over the grid (no sort of the, maybe 10^7, events)
        k = np.searchsorted(t, ct, side="left")
        chunk_bins = np.bincount(k, weights=ck, minlength=len(t) + 1)
    delivered = chunk_tok + np.where(np.isnan(first), 0, prompt)
    has_first = ok & ~np.isnan(first)
    has_dep = ok & ~np.isnan(dep)
    times = np.concatenate([arr[ok], first[has_first], dep[has_dep]])
    deltas = np.concatenate(
        [
            total[ok],
            -prompt[has_first],
            -np.maximum(total[has_dep] - delivered[has_dep], 0.0),
        ]
    )
    k = np.searchsorted(t, times, side="left")
    bins = np.bincount(k, weights=deltas, minlength=len(t) + 1) - chunk_bins
    return np.cumsum(bins[: len(t)])


def conditional_drift(t: np.ndarray, w: np.ndarray, bins: int = 4) -> list[dict[str, Any]]:
    """Mean dW/dt per backlog level (quantile bins of ``w``), seed-stability §4.3."""
    if len(t) < 2 * bins:
        return []
    rate = np.diff(w) / np.diff(t)
    level = w[:-1]
    edges = np.unique(np.quantile(level, np.linspace(0, 1, bins + 1)))
    out = []
    for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        m = (level >= lo) & ((level < hi) if k < len(edges) - 2 else (level <= hi))
        if m.any():
            out.append(
                {
                    "level_lo": _f(float(lo), 1),
                    "level_hi": _f(float(hi), 1),
                    "drift_per_s": _f(float(rate[m].mean()), 3),
                    "points": int(m.sum()),
                }
            )
    return out


def mser_cut(x: np.ndarray, batch: int = 5) -> int:
    """MSER-m truncation index (White 1997): the d ≤ n/2 (in batches of ``batch``) that
    minimises the tail's variance / (n − d)²; returned as an index into ``x``."""
    nb = len(x) // batch
    if nb < 4:
        return 0
    y = x[: nb * batch].reshape(nb, batch).mean(axis=1)
    best_d, best = 0, math.inf
    # suffix sums give every tail's mean and variance in O(n)
    s1 = np.cumsum(y[::-1])[::-1]
    s2 = np.cumsum((y * y)[::-1])[::-1]
    for d in range(0, nb // 2 + 1):
        m = nb - d
        var_sum = s2[d] - s1[d] * s1[d] / m
        stat = var_sum / (m * m)
        if stat < best:
            best, best_d = stat, d
    return best_d * batch


@dataclass
class Trend:
    slope: float
    ci: tuple[float, float]
    se: float
    bandwidth: int
    n: int


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a @ b`` of two vectors without BLAS: OpenBLAS wakes its thread pool for long ones,
    and the first wake-up took 0.4 s of a 1.5 s summary on a loaded 2-core machine."""
    return float(np.einsum("i,i->", a, b))


def _lag1_corr(u: np.ndarray) -> float:
    """``corrcoef(u[1:], u[:-1])`` (NaN when either is constant), by :func:`_dot`."""
    a, b = u[1:] - u[1:].mean(), u[:-1] - u[:-1].mean()
    den = math.sqrt(_dot(a, a) * _dot(b, b))  # Python floats: a zero would raise, not warn
    return _dot(a, b) / den if den > 0 else math.nan


# n * lag past which the autocovariances come from one FFT (O(n log n)) instead of a dot
# product a lag (O(n * lag)): a simulated overload's queue series (~500k samples, a bandwidth
# of ~900) took 0.2 s a summary that way; the two sums agree to ~1e-15 of the lag-0 sum
_FFT_WORK = 2_000_000


def _bartlett_long_run_variance(u: np.ndarray, lag: int) -> float:
    """``sum_{|l| <= lag} (1 - |l| / (lag + 1)) * gamma_l`` of the scores ``u`` (gamma_l:
    their lag-l autocovariance sum): the Newey-West variance of the OLS score."""
    n = len(u)
    if n * lag <= _FFT_WORK:
        s = _dot(u, u)
        for ell in range(1, lag + 1):
            s += 2 * (1 - ell / (lag + 1)) * _dot(u[ell:], u[:-ell])
        return s
    size = 1 << (n + lag).bit_length()  # zero-padded past n + lag: no wrap-around
    f = np.fft.rfft(u, size)
    acf = np.fft.irfft(f.real**2 + f.imag**2, size)[: lag + 1]
    weights = 2 * (1 - np.arange(1, lag + 1) / (lag + 1))
    return float(acf[0]) + _dot(weights, acf[1:])


def hac_trend(t: np.ndarray, y: np.ndarray, level: float = 0.95) -> Trend | None:
    """OLS slope of y on t with a Newey–West CI (Bartlett kernel, Andrews AR(1) bandwidth)."""
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    n = len(t)
    if n < 5 or np.ptp(t) <= 0:
        return None
    c = t - t.mean()
    sxx = _dot(c, c)
    slope = _dot(c, y - y.mean()) / sxx
    e = (y - y.mean()) - slope * c
    u = c * e  # the score of the slope
    if not np.any(u):
        return Trend(slope, (slope, slope), 0.0, 0, n)
    # Andrews (1991) plug-in bandwidth for the Bartlett kernel under AR(1)
    rho = float(np.clip(_lag1_corr(u), -0.97, 0.97)) if n > 3 else 0.0
    if not np.isfinite(rho):
        rho = 0.0
    alpha = 4 * rho**2 / ((1 - rho) ** 2 * (1 + rho) ** 2)
    lag = int(min(n - 1, math.ceil(1.1447 * (alpha * n) ** (1 / 3))))
    s = _bartlett_long_run_variance(u, lag)
    se = math.sqrt(max(s, 0.0)) / sxx
    df = max(2, n // (lag + 1))
    q = two_sided_t(df, level)
    return Trend(slope, (slope - q * se, slope + q * se), se, lag, n)


def _capacity_from_cost_model(cost_model: Any, requests: pd.DataFrame) -> float | None:
    """Fluid capacity μ (req/s) for the run's own length mix: WAIT's critical rate
    (seed-wait.md §2.2, Proposition 1: ``d1·A >= 1`` is unstable for any policy), with
    ``(d0, d1)`` fitted to the cost model (``harness.policies.fluid``). None when unknown."""
    if cost_model is None:
        return None
    try:
        from harness.engine.costmodel import get_cost_model
        from harness.policies.fluid import critical_rate, fit_linear_step

        cm = get_cost_model(cost_model) if isinstance(cost_model, str | dict) else cost_model
        p = pd.to_numeric(requests["prompt_len"], errors="coerce").to_numpy(dtype=float)
        col = "output_len" if "output_len" in requests else "output_tokens"
        o = pd.to_numeric(requests[col], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(p) & np.isfinite(o)
        if not ok.any():
            return None
        mean_ctx = float(np.mean(p[ok] + o[ok] / 2))
        _, d1 = fit_linear_step(cm, mean_context=max(mean_ctx, 1.0))
        mu = float(critical_rate(p[ok], o[ok], d1))
        return mu if mu > 0 and math.isfinite(mu) else None
    except Exception:  # an unknown cost model never breaks the analysis
        return None


def _f(x: float | None, nd: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


def analyze_stability(
    run: Any,
    cost_model: Any = None,
    *,
    capacity_rps: float | None = None,
    epsilon: float = 0.02,
    delta: float = 0.05,
    grid_points: int = 1000,
) -> dict[str, Any]:
    """Stability verdict and diagnostics for a run (``harness.results.rundir.Run`` or anything
    with ``requests``/``samples`` DataFrames). Keys per anchors-harness.md §6.4; rules in the
    module docstring. ``capacity_rps`` overrides the fluid capacity from ``cost_model``."""
    req: pd.DataFrame = run.requests
    samples: pd.DataFrame | None = getattr(run, "samples", None)
    out: dict[str, Any] = {
        "verdict": VERDICT_INCONCLUSIVE,
        "reason": "",
        "backlog_slope_rps": None,
        "backlog_slope_ci": None,
        "growth_rate_rps": None,
        "ttft_slope_ms_per_s": None,
        "ttft_slope_ci": None,
        "warmup_cut_s": None,
        "window_s": None,
        "little_law_ratio": None,
        "little_law_ratio_server": None,
        "arrival_rate_rps": None,
        "completion_rate_rps": None,
        "mean_backlog": None,
        "final_backlog": None,
        "max_backlog": None,
        "mean_sojourn_s": None,
        "token_backlog_slope_tps": None,
        "token_backlog_slope_ci": None,
        "token_backlog_mean": None,
        "token_backlog_final": None,
        "conditional_drift": None,
        "queue_slope_rps": None,
        "queue_mean": None,
        "queue_max": None,
        "rho": None,
        "fluid_capacity_rps": None,
        "fluid_slope_rps": None,
        "epsilon": epsilon,
        "method": "OLS backlog trend, Newey-West CI, MSER-5 warm-up clamped to [20%, 50%]",
    }
    if req is None or len(req) == 0:
        out["reason"] = "no requests"
        return out
    bs = backlog_series(req, grid_points)
    if bs.t_end <= 0:
        out["reason"] = "run has no duration"
        return out
    cut_idx = mser_cut(bs.backlog)
    n = len(bs.t)
    cut_idx = int(np.clip(cut_idx, int(0.2 * (n - 1)), int(0.5 * (n - 1))))
    cut = float(bs.t[cut_idx])
    tw, bw = bs.t[cut_idx:], bs.backlog[cut_idx:]
    span = bs.t_end - cut
    out["warmup_cut_s"] = _f(cut, 4)
    out["window_s"] = [_f(cut, 4), _f(bs.t_end, 4)]
    out["max_backlog"] = int(bs.backlog.max())
    out["final_backlog"] = int(bw[-1])
    out["mean_backlog"] = _f(float(bw.mean()), 4)

    in_win = (bs.arrivals > cut) & (bs.arrivals <= bs.t_end)
    n_arr = int(in_win.sum())
    lam = n_arr / span if span > 0 else float("nan")
    dep_ok = bs.departures[~np.isnan(bs.departures)]
    n_dep = int(((dep_ok > cut) & (dep_ok <= bs.t_end)).sum())
    out["arrival_rate_rps"] = _f(lam, 4)
    out["completion_rate_rps"] = _f(n_dep / span if span > 0 else float("nan"), 4)
    soj = np.where(np.isnan(bs.departures), bs.t_obs, bs.departures) - bs.arrivals
    w_mean = float(soj[in_win].mean()) if n_arr else float("nan")
    out["mean_sojourn_s"] = _f(w_mean, 4)
    if n_arr and w_mean > 0:
        out["little_law_ratio"] = _f(float(bw.mean()) / (lam * w_mean), 4)

    # token backlog W(t) and its conditional drift (needs the chunk log)
    chunks: pd.DataFrame | None = getattr(run, "chunks", None)
    streamed = "first_chunk_s" in req and bool(req["first_chunk_s"].notna().any())
    chunks_loaded = chunks is not None and (len(chunks) > 0 or not streamed)  # not skipped
    if chunks_loaded and {"prompt_len", "output_len"} <= set(req.columns):
        w = token_backlog(req, chunks, bs.t)
        ww = w[cut_idx:]
        out["token_backlog_mean"] = _f(float(ww.mean()), 1)
        out["token_backlog_final"] = _f(float(ww[-1]), 1)
        ttr = hac_trend(tw, ww)
        if ttr is not None:
            out["token_backlog_slope_tps"] = _f(ttr.slope, 3)
            out["token_backlog_slope_ci"] = [_f(ttr.ci[0], 3), _f(ttr.ci[1], 3)]
        out["conditional_drift"] = conditional_drift(tw, ww)

    # engine queue (samples): engine rows first, else Prometheus
    if samples is not None and len(samples) and "num_waiting" in samples:
        # only the columns read here: a filter of the whole frame copies every column
        # (1M+ sample rows of a long simulation: hundreds of MB at the summary's peak)
        cols = [c for c in ("t_s", "num_waiting", "num_running", "source") if c in samples]
        s = samples[cols]
        s = s[s["num_waiting"].notna()]
        for src in ("engine", "prometheus"):
            sub = s[s["source"] == src] if "source" in s else s
            if len(sub):
                s = sub
                break
        s = s[(s["t_s"] > cut) & (s["t_s"] <= bs.t_end)]
        if len(s):
            qt = s["t_s"].to_numpy(dtype=float)
            qw = s["num_waiting"].to_numpy(dtype=float)
            out["queue_mean"] = _f(float(qw.mean()), 4)
            out["queue_max"] = int(qw.max())
            tr = hac_trend(qt, qw)
            out["queue_slope_rps"] = _f(tr.slope) if tr else None
            if "num_running" in s and n_arr and w_mean > 0:
                in_sys = qw + s["num_running"].fillna(0).to_numpy(dtype=float)
                out["little_law_ratio_server"] = _f(float(in_sys.mean()) / (lam * w_mean), 4)

    # TTFT trend over arrival time (vLLM TTFT: first chunk − send)
    if {"first_chunk_s", "send_s", "target_s"} <= set(req.columns):
        tt = req["target_s"].to_numpy(dtype=float)
        ttft = (req["first_chunk_s"] - req["send_s"]).to_numpy(dtype=float) * 1000.0
        m = (tt > cut) & (tt <= bs.t_end) & np.isfinite(ttft)
        if m.sum() >= 5:
            o = np.argsort(tt[m], kind="stable")
            tr = hac_trend(tt[m][o], ttft[m][o])
            if tr:
                out["ttft_slope_ms_per_s"] = _f(tr.slope, 4)
                out["ttft_slope_ci"] = [_f(tr.ci[0], 4), _f(tr.ci[1], 4)]

    if cost_model is None and isinstance(getattr(run, "meta", None), dict):
        cost_model = run.meta.get("cost_model")  # simulated runs record theirs
        if not isinstance(cost_model, dict | str):
            cost_model = None
    mu = capacity_rps if capacity_rps is not None else _capacity_from_cost_model(cost_model, req)
    exact_capacity = capacity_rps is not None
    rho = None
    if mu is not None and mu > 0 and math.isfinite(lam):
        rho = lam / mu
        out["rho"] = _f(rho, 4)
        out["fluid_capacity_rps"] = _f(mu, 4)
        out["fluid_slope_rps"] = _f(max(0.0, lam - mu), 4)

    trend = hac_trend(tw, bw)
    if trend is None:
        out["reason"] = "too few points after the warm-up cut"
        return out
    out["backlog_slope_rps"] = _f(trend.slope)
    out["backlog_slope_ci"] = [_f(trend.ci[0]), _f(trend.ci[1])]
    out["growth_rate_rps"] = _f(max(0.0, trend.slope))
    out["hac_bandwidth"] = trend.bandwidth

    tol = epsilon * lam if math.isfinite(lam) else 0.0
    q = len(bw) // 4
    last_q, prev_q = (bw[-q:], bw[-2 * q : -q]) if q else (bw, bw)
    jump_ok = (last_q.mean() - prev_q.mean()) <= 2.0 * max(float(bw.std()), 1.0)
    if n_arr < MIN_ARRIVALS:
        verdict, reason = VERDICT_INCONCLUSIVE, f"only {n_arr} arrivals after the warm-up cut"
    elif exact_capacity and rho is not None and abs(1.0 - rho) < delta:
        verdict, reason = VERDICT_INCONCLUSIVE, f"critical band: rho={rho:.3f} within {delta}"
    elif trend.ci[0] > tol:
        verdict = VERDICT_UNSTABLE
        reason = f"backlog grows: slope CI lower bound {trend.ci[0]:.4g} > {tol:.4g} req/s"
    elif trend.ci[1] < tol and jump_ok and span >= MIN_SOJOURNS_IN_WINDOW * w_mean:
        verdict = VERDICT_STABLE
        reason = f"backlog slope CI upper bound {trend.ci[1]:.4g} < {tol:.4g} req/s"
    else:
        verdict = VERDICT_INCONCLUSIVE
        if span < MIN_SOJOURNS_IN_WINDOW * w_mean:
            reason = f"window {span:.1f}s < {MIN_SOJOURNS_IN_WINDOW:g} mean sojourns"
        elif not jump_ok:
            reason = "backlog jumps in the last quarter"
        else:
            reason = f"slope CI [{trend.ci[0]:.4g}, {trend.ci[1]:.4g}] straddles {tol:.4g} req/s"
    out["verdict"], out["reason"] = verdict, reason
    return out
