"""Stability of a network of engines (agents): token backlog W(t), per-agent load, verdict.

Why: in a network, per-agent load below 1 is necessary but not sufficient (seed-stability.md
§2.6, the Rybko-Stolyar counterexample), so a network's verdict must come from the
network-wide backlog, never from per-node utilisation alone (§4 item 8).

Rules (each cites its source; "ours" = our choice):

- Token backlog per agent ``W_j(t) = A_j(t) - S_j(t)``: the work released to agent ``j`` by
  ``t`` minus the tokens its engine served by ``t`` (the balance equations of seed-stability.md
  §1.4, C.4-C.7: ``Z_k(n) = Z_k(0) + V_k(E(n)) - T_k(n)``). A call's work is the tokens the
  engine processes for it, ``prompt_len + output_len - 1`` (vLLM accounting: the last sampled
  token is never fed back, harness/policies/base.py). Served tokens come from the engine
  samples (``prefill_tokens + decode_tokens`` per step), spread evenly over a fast-forwarded
  row's steps. So W is exact at step ends, needs no chunk log, and is >= 0.
- Network backlog ``W(t) = Σ_j W_j(t)``: the paper's "total number of tokens in this system"
  (§2.6, Fig. 8): tokens of calls present at some agent; a hop not yet released (its parents
  still running) is not yet in the system.
- Per-agent load ``ρ_j`` = work offered to ``j`` per unit time / its capacity ``b/t_b``
  (§4 item 8, §1.5: Σ_classes λ_k (m_p + m_d) t_b / b; a call's work is offered when its
  session arrives), and utilisation = tokens served per unit time / ``b/t_b``.
- Verdict (§4 item 6, in token units, tolerance ``ε·Λ`` with Λ the network's offered token
  rate): MSER-5 warm-up cut clamped to [20 %, 50 %] of the horizon and an OLS trend with a
  Newey-West CI, both from :mod:`harness.results.stability`. ``unstable`` if the CI's lower
  bound > ε·Λ; ``stable`` if its upper bound < ε·Λ, the last quarter's mean is not above the
  previous quarter's by more than 2 standard deviations of W, and the window spans >= 10 mean
  call sojourns; else ``inconclusive``.
- Peak test (ours; §4 item 6 allows "a backlog trend test [that] rejects boundedness"): also
  ``unstable`` when the slope's point estimate > ε·Λ and W's maximum over the last half of
  the run is >= 2x its maximum over the first half. Why: a Rybko-Stolyar instability grows in
  cycles of growing length (§2.6: peaks ~4x per cycle), so the OLS trend's Newey-West CI
  stays wide however clear the growth; a bounded backlog's running maximum does not double
  when the horizon doubles.
- RS flag (§4 item 8): every agent's ρ < 1 and the verdict is ``unstable`` -> "per-node
  under-loaded but network backlog diverging" (a priority instability, not overload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.results.stability import (
    MIN_SOJOURNS_IN_WINDOW,
    VERDICT_INCONCLUSIVE,
    VERDICT_STABLE,
    VERDICT_UNSTABLE,
    hac_trend,
    mser_cut,
)

PEAK_RATIO = 2.0  # the peak test (module rules)
RS_FLAG = "per-node under-loaded but network backlog diverging (priority instability, §4.8)"


@dataclass
class NetworkBacklog:
    """W(t) on a grid, in total and per agent (tokens)."""

    t: np.ndarray
    total: np.ndarray
    per_agent: dict[str, np.ndarray]


def call_work(prompt_len: Any, output_len: Any) -> np.ndarray:
    """Tokens an engine processes for a call: ``prompt + output - 1`` (module rules)."""
    return np.asarray(prompt_len, dtype=np.int64) + np.asarray(output_len, dtype=np.int64) - 1


def served_curve(samples: pd.DataFrame, grid: np.ndarray) -> np.ndarray:
    """Cumulative tokens one engine served by each grid time (linear inside a step row)."""
    if samples.empty:
        return np.zeros(len(grid))
    s = samples.sort_values("t_s", kind="stable")
    end = s["t_s"].to_numpy(float)
    dur = s["step_duration_s"].fillna(0.0).to_numpy(float)
    tok = (s["prefill_tokens"].fillna(0) + s["decode_tokens"].fillna(0)).to_numpy(float)
    cum = np.cumsum(tok)
    xs = np.empty(2 * len(end))
    ys = np.empty(2 * len(end))
    xs[0::2], xs[1::2] = end - dur, end
    ys[0::2], ys[1::2] = cum - tok, cum
    return np.interp(grid, xs, ys, left=0.0, right=float(cum[-1]))


def token_backlog(
    calls: pd.DataFrame, samples: pd.DataFrame, grid: np.ndarray, engine_col: str = "engine"
) -> NetworkBacklog:
    """W_j(t) and W(t) on ``grid``. ``calls``: ``agent``, ``release_s``, ``work`` (tokens);
    ``samples``: engine telemetry rows with an ``engine`` column naming the agent."""
    per: dict[str, np.ndarray] = {}
    agents = list(dict.fromkeys(calls["agent"].astype(str)))
    for a in agents:
        c = calls[calls["agent"].astype(str) == a]
        rel = c["release_s"].to_numpy(float)
        o = np.argsort(rel, kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(c["work"].to_numpy(float)[o])])
        arrived = cum[np.searchsorted(rel[o], grid, side="right")]
        mine = samples[samples[engine_col].astype(str) == a] if len(samples) else samples
        per[a] = arrived - served_curve(mine, grid)
    total = np.sum(list(per.values()), axis=0) if per else np.zeros(len(grid))
    return NetworkBacklog(grid, total, per)


def agent_loads(
    calls: pd.DataFrame,
    samples: pd.DataFrame,
    capacity: dict[str, float],
    t0: float,
    t1: float,
    engine_col: str = "engine",
) -> dict[str, dict[str, float]]:
    """Per agent over [t0, t1): offered load ρ (work offered / capacity) and utilisation
    (served tokens / capacity); ``capacity`` is b/t_b in tokens per unit time. A call's work
    counts as offered at ``offered_s`` when ``calls`` has it (its session's arrival: the
    paper's λ(m_p + m_d), whether or not an upstream hop has released it yet), else at its
    release."""
    span = t1 - t0
    grid = np.array([t0, t1])
    col = "offered_s" if "offered_s" in calls.columns else "release_s"
    out: dict[str, dict[str, float]] = {}
    for a, cap in capacity.items():
        c = calls[calls["agent"].astype(str) == a]
        rel = c[col].to_numpy(float)
        work = float(c["work"].to_numpy(float)[(rel >= t0) & (rel < t1)].sum())
        mine = samples[samples[engine_col].astype(str) == a] if len(samples) else samples
        s0, s1 = served_curve(mine, grid)
        out[a] = {"rho": work / (span * cap), "utilisation": (s1 - s0) / (span * cap)}
    return out


def window_maxima(t: np.ndarray, w: np.ndarray, window: float) -> list[float]:
    """max W per consecutive window of length ``window`` (the spec's 900-slot windows)."""
    if not len(t):
        return []
    n = max(1, math.ceil((t[-1] - t[0]) / window))  # a last point on a window edge joins it
    k = np.minimum(np.floor((t - t[0]) / window).astype(int), n - 1)
    return [float(w[k == i].max()) for i in range(n) if (k == i).any()]


def network_verdict(
    t: np.ndarray,
    w: np.ndarray,
    offered_rate: float,
    *,
    mean_sojourn: float | None = None,
    epsilon: float = 0.02,
) -> dict[str, Any]:
    """Stability verdict of a token backlog series (module rules); ``offered_rate`` Λ in
    tokens per unit time sets the tolerance ε·Λ."""
    out: dict[str, Any] = {"verdict": VERDICT_INCONCLUSIVE, "reason": "", "epsilon": epsilon}
    n = len(t)
    if n < 20:
        out["reason"] = "too few points"
        return out
    cut = int(np.clip(mser_cut(w), int(0.2 * (n - 1)), int(0.5 * (n - 1))))
    tw, ww = t[cut:], w[cut:]
    tr = hac_trend(tw, ww)
    out["warmup_cut"] = float(t[cut])
    if tr is None:
        out["reason"] = "too few points after the warm-up cut"
        return out
    tol = epsilon * offered_rate
    out["slope"] = tr.slope
    out["slope_ci"] = [tr.ci[0], tr.ci[1]]
    out["tolerance"] = tol
    q = len(ww) // 4
    last_q, prev_q = ww[-q:], ww[-2 * q : -q]
    jump_ok = (last_q.mean() - prev_q.mean()) <= 2.0 * max(float(ww.std()), 1.0)
    span = float(tw[-1] - tw[0])
    long_enough = mean_sojourn is None or span >= MIN_SOJOURNS_IN_WINDOW * mean_sojourn
    half = t >= t[0] + (t[-1] - t[0]) / 2
    peak_ratio = float(w[half].max() / max(float(w[~half].max()), 1.0))
    out["peak_ratio"] = peak_ratio
    if tr.ci[0] > tol:
        out["verdict"] = VERDICT_UNSTABLE
        out["reason"] = f"W grows: slope CI lower bound {tr.ci[0]:.4g} > {tol:.4g} tokens/unit"
    elif tr.slope > tol and peak_ratio >= PEAK_RATIO:
        out["verdict"] = VERDICT_UNSTABLE
        out["reason"] = (
            f"W peaks grow: the last half's max is {peak_ratio:.1f}x the first half's, "
            f"slope {tr.slope:.4g} > {tol:.4g} tokens/unit"
        )
    elif tr.ci[1] < tol and jump_ok and long_enough:
        out["verdict"] = VERDICT_STABLE
        out["reason"] = f"W slope CI upper bound {tr.ci[1]:.4g} < {tol:.4g} tokens/unit"
    elif not long_enough:
        out["reason"] = f"window {span:.4g} < {MIN_SOJOURNS_IN_WINDOW:g} mean sojourns"
    elif not jump_ok:
        out["reason"] = "W jumps in the last quarter"
    else:
        out["reason"] = f"slope CI [{tr.ci[0]:.4g}, {tr.ci[1]:.4g}] straddles {tol:.4g}"
    return out


def rs_flag(rhos: dict[str, float], verdict: str) -> str | None:
    """The §4.8 flag: every agent under-loaded yet the network backlog diverges."""
    if verdict == VERDICT_UNSTABLE and rhos and all(r < 1.0 for r in rhos.values()):
        return RS_FLAG
    return None


def mean_call_sojourn(calls: pd.DataFrame, t0: float, t_end: float) -> float:
    """Mean (finish - release) of calls released in [t0, t_end]; unfinished ones are censored
    at ``t_end`` (a lower bound, like the request backlog's sojourns)."""
    rel = calls["release_s"].to_numpy(float)
    fin = calls["finish_s"].to_numpy(float)
    m = (rel >= t0) & (rel <= t_end)
    if not m.any():
        return math.nan
    return float(np.mean(np.where(np.isnan(fin[m]), t_end, np.minimum(fin[m], t_end)) - rel[m]))


def analyze_network(
    calls: pd.DataFrame,
    samples: pd.DataFrame,
    capacity: dict[str, float],
    horizon: float,
    *,
    step: float = 1.0,
    window: float | None = None,
    epsilon: float = 0.02,
) -> dict[str, Any]:
    """W(t) on a grid of ``step`` over [0, horizon], per-agent loads, window maxima and the
    verdict (module rules). ``calls``: ``agent``, ``release_s``, ``work``, ``finish_s``."""
    grid = np.arange(0.0, horizon + step / 2, step)
    wb = token_backlog(calls, samples, grid)
    loads = agent_loads(calls, samples, capacity, 0.0, horizon)
    offered = sum(v["rho"] * capacity[a] for a, v in loads.items())
    soj = mean_call_sojourn(calls, 0.2 * horizon, horizon)
    v = network_verdict(grid, wb.total, offered, mean_sojourn=soj, epsilon=epsilon)
    rhos = {a: x["rho"] for a, x in loads.items()}
    v["flag"] = rs_flag(rhos, v["verdict"])
    v["loads"] = loads
    v["offered_tokens_per_unit"] = offered
    v["mean_call_sojourn"] = soj
    v["w_max"] = float(wb.total.max())
    v["w_final"] = float(wb.total[-1])
    v["window_maxima"] = window_maxima(grid, wb.total, window) if window else []
    v["backlog"] = wb
    return v
