"""Plotly figure builders for the report. Each takes RunViews and returns a Figure or None
(no data: the panel is skipped with a note).

Why the downsampling: a report of 100k requests and 30M chunks must stay a small file that
a browser opens in seconds. So no figure ships raw per-chunk data: distributions become
quantile curves (≤ ``CDF_POINTS`` points) or histograms computed here, time series are
binned to ≤ ``TIME_BINS`` bins, and the per-request timeline shows a deterministic sample of
≤ ``GANTT_MAX`` requests. Free text from traces or servers is HTML-escaped before it goes
into a figure (plotly renders a subset of HTML in labels).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from harness.report.data import RunView

CDF_POINTS = 300
TIME_BINS = 400
GANTT_MAX = 120
HIST_BINS = 60
# run / policy colours: no red or green, which mean "misses / meets an SLO" in this report
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
    "#393b79",
    "#637939",
)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _layout(
    fig: go.Figure, title: str, height: int = 380, margin_top: int = 50, **kw: object
) -> go.Figure:
    kw.setdefault("legend", {"orientation": "h", "y": -0.18})
    fig.update_layout(
        title={"text": esc(title), "x": 0.01, "font": {"size": 15}},
        height=height,
        margin={"l": 60, "r": 20, "t": margin_top, "b": 45},
        template="plotly_white",
        colorway=list(PALETTE),  # default trace colours: never red/green (they mean SLOs)
        **kw,
    )
    return fig


def cdf_points(values: np.ndarray, n: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Quantile curve: x = value at probability p for n evenly spaced p (an exact CDF,
    downsampled in probability)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.zeros(0), np.zeros(0)
    p = np.linspace(0.0, 1.0, min(n, max(v.size, 2)))
    return np.quantile(v, p), p


def ccdf_points(values: np.ndarray, n: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Tail curve: x = value exceeded by a share s of the samples, for s log-spaced from 1 down
    to 1/size (at most 1e-5). On a log y axis the P99 (s = 0.01) and beyond stay readable,
    which a linear CDF squeezes into its last pixel."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.zeros(0), np.zeros(0)
    lo = min(5.0, np.log10(max(v.size, 2)))
    s = np.logspace(0.0, -lo, n)
    return np.quantile(v, 1.0 - s), s


def binned(
    t: np.ndarray, weights: np.ndarray | None, t_max: float, bins: int = TIME_BINS
) -> tuple[np.ndarray, np.ndarray, float]:
    """Sum of ``weights`` per time bin (count when None): (bin centres, sums, bin width)."""
    t_max = max(float(t_max), 1e-9)
    width = t_max / bins
    nice = [0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600]
    width = next((w for w in nice if w >= width), width)
    nb = max(1, int(np.ceil(t_max / width)))
    sums, edges = np.histogram(t, bins=nb, range=(0.0, nb * width), weights=weights)
    return (edges[:-1] + edges[1:]) / 2, sums, width


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# Tiers get colours that never read as a verdict (no red, no green): red/green are kept for
# "misses / meets its SLO" only (issue 20: the free tier's bar was red while meeting its SLO).
TIER_COLORS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
SLO_MET, SLO_MISSED, NO_SLO = "#2ca02c", "#d62728", "#9aa3b2"


def tier_color(i: int) -> str:
    return TIER_COLORS[i % len(TIER_COLORS)]


def slo_color(met: bool | None) -> str:
    """Green when a value meets its SLO, red when it misses it, grey without an SLO."""
    return NO_SLO if met is None else (SLO_MET if met else SLO_MISSED)


# completions per bin the completed-req/s line aims for: Poisson noise of a bin with k
# completions is 1/sqrt(k), so 25 per bin keeps the line within ~20% (issue 20: 0.1 s bins
# of a 1 req/s run were all 0 or 10).
MIN_PER_BIN = 25


# ---------------------------------------------------------------- single run
def ttft_cdf(rv: RunView) -> go.Figure | None:
    """TTFT CDF per tier (log x), with each tier's TTFT SLO as a dashed line."""
    fig = go.Figure()
    ttft = rv.rm["ttft_s"].to_numpy(dtype=float) * 1000.0
    tiers = rv.rm["tier"].to_numpy(dtype=object)
    any_data = False
    for i, name in enumerate(rv.tier_names or [None]):
        v = ttft if name is None else ttft[tiers == name]
        x, p = cdf_points(v)
        if not x.size:
            continue
        any_data = True
        fig.add_trace(
            go.Scatter(
                x=x, y=p, mode="lines", name=esc(name or "all"), line={"color": tier_color(i)}
            )
        )
        slo = rv.tiers.get(str(name), {}).get("ttft_slo_s")
        if slo:
            fig.add_vline(
                x=float(slo) * 1000, line={"dash": "dash", "color": tier_color(i), "width": 1}
            )
    if not any_data:
        return None
    return _layout(
        fig,
        "TTFT CDF per tier (dashed: tier TTFT SLO)",
        xaxis={"type": "log", "title": "TTFT (ms)"},
        yaxis={"title": "fraction of requests", "range": [0, 1.01]},
    )


def tbt_cdf(rv: RunView) -> go.Figure | None:
    """TBT (vLLM ITL, one gap per chunk) tail per tier: the share of gaps longer than x, log
    axes, each tier's TBT SLO dashed. A tier meets its P99 TBT SLO when its curve is below
    the dotted 1% line at its SLO."""
    if rv.itl_s.size == 0:
        return None
    v_all = rv.itl_s * 1000.0
    fig = go.Figure()
    for i, name in enumerate(rv.tier_names or ["all"]):
        v = v_all if name == "all" else v_all[rv.itl_tier == name]
        x, p = ccdf_points(v)
        if not x.size:
            continue
        fig.add_trace(
            go.Scatter(x=x, y=p, mode="lines", name=esc(name), line={"color": tier_color(i)})
        )
        slo = rv.tiers.get(str(name), {}).get("tbt_slo_s")
        if slo:
            fig.add_vline(
                x=float(slo) * 1000, line={"dash": "dash", "color": tier_color(i), "width": 1}
            )
    if not fig.data:
        return None
    fig.add_hline(y=0.01, line={"dash": "dot", "color": "#888", "width": 1})
    return _layout(
        fig,
        "TBT per tier: share of gaps longer than x (dashed: tier TBT SLO; dotted: 1% = P99)",
        xaxis={"type": "log", "title": "time between tokens (ms)"},
        yaxis={"type": "log", "title": "share of gaps > x", "exponentformat": "power"},
    )


def itl_distribution(rv: RunView) -> go.Figure | None:
    """ITL (vLLM: one gap per chunk) histogram per tier on log bins, and P99 vs TBT SLO."""
    if rv.itl_s.size == 0:
        return None
    v_all = rv.itl_s * 1000.0
    pos = v_all[v_all > 0]
    if pos.size == 0:
        return None
    lo, hi = np.log10(max(pos.min(), 1e-3)), np.log10(pos.max() * 1.01)
    if hi - lo < 0.3:  # near-constant gaps: centre a half-decade either side
        mid = (hi + lo) / 2
        lo, hi = mid - 0.5, mid + 0.5
    edges = np.logspace(lo, hi, HIST_BINS + 1)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        subplot_titles=(
            "ITL distribution (share of gaps)",
            "P99 ITL per tier vs TBT SLO<br>(green: meets it, red: misses it)",
        ),
    )
    names, p99s, slos, colors = [], [], [], []
    for i, name in enumerate(rv.tier_names or ["all"]):
        v = v_all if name == "all" else v_all[rv.itl_tier == name]
        if v.size == 0:
            continue
        cnt, _ = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)
        centres = np.sqrt(edges[:-1] * edges[1:])
        fig.add_trace(
            go.Scatter(
                x=centres,
                y=cnt / v.size,
                mode="lines",
                line={"shape": "hvh", "color": tier_color(i)},
                name=esc(name),
            ),
            row=1,
            col=1,
        )
        names.append(esc(name))
        p99s.append(float(np.percentile(v, 99)))
        slo = rv.tiers.get(str(name), {}).get("tbt_slo_s")
        slos.append(float(slo) * 1000 if slo else None)
        colors.append(slo_color(None if slos[-1] is None else p99s[-1] <= slos[-1]))
    fig.add_trace(
        go.Bar(
            x=names,
            y=p99s,
            name="P99 ITL",
            marker={"color": colors},
            showlegend=False,
            text=[f"{p:.1f} ms" for p in p99s],
            textposition="auto",
        ),
        row=1,
        col=2,
    )
    if any(s is not None for s in slos):
        fig.add_trace(
            go.Scatter(
                x=names,
                y=slos,
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 40, "line": {"width": 3}},
                name="TBT SLO",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(type="log", title_text="ITL (ms)", row=1, col=1)
    fig.update_yaxes(title_text="share", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    return _layout(fig, "Time between tokens (TBT = vLLM ITL, per chunk)", margin_top=80)


def throughput(rv: RunView) -> go.Figure | None:
    """Output tokens/s and completed requests/s over time (binned)."""
    if rv.chunk_t.size == 0:
        return None
    end = rv.rm["end_s"].to_numpy(dtype=float)
    succ = rv.rm["success"].to_numpy(dtype=bool)
    t_max = float(max(rv.chunk_t.max(), np.nanmax(end) if np.isfinite(end).any() else 0))
    x, tok, w = binned(rv.chunk_t, rv.chunk_tokens.astype(float), t_max)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(x=x, y=tok / w, mode="lines", name="output tokens/s", line={"color": PALETTE[0]})
    )
    last = end[succ]  # rm rows: the warm-up (if any) is already left out
    last = last[np.isfinite(last)]
    x2, done, w2 = binned(last, None, t_max, bins=completion_bins(last.size, t_max))
    fig.add_trace(
        go.Scatter(
            x=x2,
            y=done / w2,
            mode="lines",
            name=f"completed req/s ({w2:g} s bins)",
            line={"dash": "dot", "shape": "hvh", "color": "#444"},
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="tokens/s", secondary_y=False)
    fig.update_yaxes(title_text="requests/s", rangemode="tozero", secondary_y=True)
    return _layout(fig, f"Throughput over time (tokens: {w:g} s bins)")


def completion_bins(n_done: int, t_max: float) -> int:
    """How many time bins the completed-requests/s line gets: about ``MIN_PER_BIN``
    completions per bin on average, at least 1, at most ``TIME_BINS``."""
    if n_done <= 0 or t_max <= 0:
        return 1
    return int(np.clip(n_done // MIN_PER_BIN, 1, TIME_BINS))


def backlog(rv: RunView) -> go.Figure | None:
    """Backlog B(t) = arrivals − departures, the engine's waiting/running gauges, the warm-up
    cut and the fitted trend, titled with the stability verdict."""
    bs = rv.backlog
    if bs.t.size < 2:
        return None
    st = rv.stability
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=bs.t, y=bs.backlog, mode="lines", name="backlog (client)"))
    s = rv.samples
    if len(s) and "num_waiting" in s:
        for src in ("engine", "prometheus"):
            sub = s[(s["source"] == src) & s["num_waiting"].notna()]
            if len(sub):
                tt, wv = _thin(sub["t_s"].to_numpy(float), sub["num_waiting"].to_numpy(float))
                fig.add_trace(go.Scatter(x=tt, y=wv, mode="lines", name=f"waiting ({src})"))
                if sub["num_running"].notna().any():
                    tt, rv_ = _thin(
                        sub["t_s"].to_numpy(float), sub["num_running"].fillna(0).to_numpy(float)
                    )
                    fig.add_trace(
                        go.Scatter(
                            x=tt, y=rv_, mode="lines", name=f"running ({src})", line={"width": 1}
                        )
                    )
                break
    cut = st.get("warmup_cut_s")
    slope = st.get("backlog_slope_rps")
    if cut is not None:
        fig.add_vline(x=cut, line={"dash": "dash", "color": "#888"})
        if slope is not None:
            m = bs.t >= cut
            mean_t, mean_b = bs.t[m].mean(), bs.backlog[m].mean()
            xs = np.array([cut, bs.t_end])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=mean_b + slope * (xs - mean_t),
                    mode="lines",
                    name="trend",
                    line={"color": "black", "dash": "dot"},
                )
            )
    _shade_warmup(fig, rv)
    ci = st.get("backlog_slope_ci")
    ci_txt = f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else ""
    slope_txt = "n/a" if slope is None else f"{slope:.3g}"
    title = (
        f"Backlog and queue: {st.get('verdict', '?').upper()} "
        f"(slope {slope_txt} req/s{ci_txt}; dashed: warm-up cut)"
    )
    return _layout(fig, title, xaxis={"title": "time (s)"}, yaxis={"title": "requests in system"})


def _shade_warmup(fig: go.Figure, rv: RunView) -> None:
    """Grey band over the requests ``--warmup`` left out of the metrics."""
    w = rv.summary.get("warmup")
    until = w.get("until_s") if isinstance(w, dict) else None
    if isinstance(until, int | float) and until > 0:
        fig.add_vrect(
            x0=0,
            x1=float(until),
            fillcolor="#888",
            opacity=0.15,
            line_width=0,
            annotation_text="warm-up (not measured)",
            annotation_position="top left",
        )


def _thin(t: np.ndarray, y: np.ndarray, n: int = 2 * TIME_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ~n points of a time series: per-bin maxima (peaks stay visible)."""
    if t.size <= n:
        return t, y
    o = np.argsort(t, kind="stable")
    t, y = t[o], y[o]
    idx = np.linspace(0, t.size, n + 1).astype(int)
    starts = idx[:-1][np.diff(idx) > 0]
    return t[starts], np.maximum.reduceat(y, starts)


def kv_gpu(rv: RunView) -> go.Figure | None:
    """KV-cache usage (%) and GPU memory (MiB) over time, on two axes."""
    s = rv.samples
    if not len(s):
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    n = 0
    kv = s[s["kv_usage"].notna()] if "kv_usage" in s else s.iloc[0:0]
    for src in ("engine", "prometheus"):
        sub = kv[kv["source"] == src]
        if len(sub):
            t, y = _thin(sub["t_s"].to_numpy(float), sub["kv_usage"].to_numpy(float) * 100)
            fig.add_trace(go.Scatter(x=t, y=y, mode="lines", name=f"KV usage % ({src})"))
            n += 1
            break
    gpu = s[(s["source"] == "gpu") & s["gpu_mem_used_mib"].notna()]
    for idx in sorted(gpu["gpu_index"].dropna().unique()) if len(gpu) else []:
        g = gpu[gpu["gpu_index"] == idx]
        t, y = _thin(g["t_s"].to_numpy(float), g["gpu_mem_used_mib"].to_numpy(float))
        fig.add_trace(
            go.Scatter(x=t, y=y, mode="lines", name=f"GPU {int(idx)} memory used (MiB)"),
            secondary_y=True,
        )
        n += 1
    if n == 0:
        return None
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="KV usage (%)", range=[0, 105], secondary_y=False)
    fig.update_yaxes(title_text="MiB", secondary_y=True)
    return _layout(fig, "KV-cache usage and GPU memory")


def send_lag(rv: RunView) -> go.Figure | None:
    """Send lag (release − schedule) over the schedule: binned p50 / p99 / max, in ms."""
    r = rv.requests
    target = r["target_s"].to_numpy(float)
    rel = r["arrival_s"].to_numpy(float)
    rel = np.where(np.isfinite(rel), rel, r["send_s"].to_numpy(float))
    lag = (rel - target) * 1000.0
    ok = np.isfinite(lag) & np.isfinite(target)
    if not ok.any():
        return None
    target, lag = target[ok], lag[ok]
    o = np.argsort(target, kind="stable")
    target, lag = target[o], lag[o]
    nb = int(min(TIME_BINS // 2, max(1, target.size // 20)))
    idx = np.linspace(0, target.size, nb + 1).astype(int)
    xs, p50, p99, mx = [], [], [], []
    for a, b in zip(idx[:-1], idx[1:], strict=True):
        if b <= a:
            continue
        seg = lag[a:b]
        xs.append(float(target[a:b].mean()))
        q = np.percentile(seg, [50, 99])
        p50.append(q[0])
        p99.append(q[1])
        mx.append(float(seg.max()))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=p50, mode="lines", name="p50"))
    fig.add_trace(go.Scatter(x=xs, y=p99, mode="lines", name="p99"))
    fig.add_trace(go.Scatter(x=xs, y=mx, mode="lines", name="max", line={"dash": "dot"}))
    thr = rv.summary.get("send_lag_threshold_ms")
    if thr:
        fig.add_hline(y=float(thr), line={"dash": "dash", "color": "red", "width": 1})
    p99_all = rv.summary.get("send_lag_p99_ms")
    title = "Send lag (dispatcher release − schedule)"
    if p99_all is not None:
        title += f": p99 {p99_all:.2f} ms"
    return _layout(fig, title, xaxis={"title": "scheduled time (s)"}, yaxis={"title": "lag (ms)"})


def timeline(rv: RunView) -> go.Figure | None:
    """Gantt of a deterministic sample of requests: client lag (schedule → send), waiting +
    prefill (send → first chunk, i.e. TTFT) and decode (first → last chunk). Failed requests
    are red markers with their (escaped) error."""
    r = rv.requests.sort_values("target_s", kind="stable")
    n = len(r)
    if n == 0:
        return None
    # a contiguous block of requests around the peak backlog: overlap and queueing show
    bs = rv.backlog
    t_peak = float(bs.t[int(np.argmax(bs.backlog))]) if bs.t.size else 0.0
    centre = int(np.searchsorted(r["target_s"].to_numpy(float), t_peak))
    lo = int(np.clip(centre - GANTT_MAX // 2, 0, max(0, n - GANTT_MAX)))
    pick = np.arange(lo, min(n, lo + GANTT_MAX))
    sub = r.iloc[pick]
    y = [f"#{int(q)}" for q in sub["req"]]
    tgt = sub["target_s"].to_numpy(float)
    snd = sub["send_s"].to_numpy(float)
    fst = sub["first_chunk_s"].to_numpy(float)
    lst = sub["last_chunk_s"].to_numpy(float)
    tiers = [esc(t) for t in sub["tier"].astype(str)]
    fig = go.Figure()
    segs = (
        ("client lag", tgt, snd, "#bbbbbb"),
        ("queue + prefill (TTFT)", snd, fst, "#ff7f0e"),
        ("decode", fst, lst, "#1f77b4"),
    )
    for name, a, b, color in segs:
        ok = np.isfinite(a) & np.isfinite(b)
        fig.add_trace(
            go.Bar(
                y=np.array(y, dtype=object)[ok],
                x=(b - a)[ok],
                base=a[ok],
                orientation="h",
                name=name,
                marker={"color": color},
                customdata=np.array(tiers, dtype=object)[ok],
                hovertemplate="%{y} (%{customdata}): %{base:.3f}s + %{x:.3f}s<extra>"
                + esc(name)
                + "</extra>",
            )
        )
    failed = ~sub["success"].fillna(False).to_numpy(bool)
    if failed.any():
        f = sub[failed]
        t_fail = f["send_s"].fillna(f["target_s"]).to_numpy(float)
        fig.add_trace(
            go.Scatter(
                x=t_fail,
                y=np.array(y, dtype=object)[failed],
                mode="markers",
                marker={"color": "red", "symbol": "x", "size": 9},
                name="failed",
                text=[esc(e) for e in f["error"].fillna(f["error_kind"]).astype(str)],
                hovertemplate="%{y}: %{text}<extra>failed</extra>",
            )
        )
    _shade_warmup(fig, rv)
    return _layout(
        fig,
        f"Per-request timeline: {len(pick)} of {n} requests in arrival order, around the "
        f"peak backlog (t≈{t_peak:.0f} s)",
        height=max(380, min(1400, 9 * len(pick) + 140)),
        barmode="overlay",
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0.5},
        xaxis={"title": "time (s)"},
        yaxis={"autorange": "reversed", "showticklabels": len(pick) <= 60},
    )


# ---------------------------------------------------------------- several runs
def _overlay_cdf(
    runs: Sequence[RunView], values_ms: Callable[[RunView], np.ndarray], title: str, xtitle: str
) -> go.Figure | None:
    """One CDF line per run (log x axis); None when no run has values."""
    fig = go.Figure()
    for i, rv in enumerate(runs):
        x, p = cdf_points(values_ms(rv))
        if x.size:
            fig.add_trace(
                go.Scatter(x=x, y=p, mode="lines", name=esc(rv.label), line={"color": _color(i)})
            )
    if not fig.data:
        return None
    return _layout(
        fig,
        title,
        xaxis={"type": "log", "title": xtitle},
        yaxis={"title": "fraction", "range": [0, 1.01]},
    )


def overlay_ttft(runs: Sequence[RunView]) -> go.Figure | None:
    return _overlay_cdf(
        runs,
        lambda rv: rv.rm["ttft_s"].to_numpy(float) * 1000,
        "TTFT CDF, all tiers, per run",
        "TTFT (ms)",
    )


def overlay_itl(runs: Sequence[RunView]) -> go.Figure | None:
    return _overlay_cdf(runs, lambda rv: rv.itl_s * 1000, "ITL CDF per run", "ITL (ms)")


def _tiers_of(runs: Sequence[RunView]) -> list[str]:
    names: list[str] = []
    for rv in runs:
        for t in rv.tier_names:
            if t not in names:
                names.append(t)
    return names


def _slo_ms(runs: Sequence[RunView], tier: str, key: str) -> float | None:
    for rv in runs:
        v = rv.tiers.get(tier, {}).get(key)
        if v:
            return float(v) * 1000.0
    return None


def overlay_tier_cdf(runs: Sequence[RunView], metric: str) -> go.Figure | None:
    """One panel per tier, one CDF line per run: ``metric`` 'ttft' (per request) or 'tbt'
    (per gap). The tier's SLO is dashed; for TBT the dotted line is P99. This is the figure
    where a tier-aware policy's trade shows: better for paid, worse for free."""
    tiers = _tiers_of(runs)
    if not tiers:
        return None
    slo_key = "ttft_slo_s" if metric == "ttft" else "tbt_slo_s"
    fig = make_subplots(
        rows=1,
        cols=len(tiers),
        subplot_titles=[
            esc(f"{t} (SLO {_slo_ms(runs, t, slo_key):g} ms)")
            if _slo_ms(runs, t, slo_key)
            else esc(t)
            for t in tiers
        ],
        shared_yaxes=metric == "ttft",
    )
    for c, tier in enumerate(tiers, start=1):
        for i, rv in enumerate(runs):
            if metric == "ttft":
                m = rv.rm["tier"].to_numpy(dtype=object) == tier
                v = rv.rm["ttft_s"].to_numpy(float)[m] * 1000.0
            else:
                v = rv.itl_s[rv.itl_tier == tier] * 1000.0
            x, p = cdf_points(v) if metric == "ttft" else ccdf_points(v)
            if not x.size:
                continue
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=p,
                    mode="lines",
                    name=esc(rv.label),
                    legendgroup=esc(rv.label),
                    showlegend=c == 1,
                    line={"color": _color(i)},
                ),
                row=1,
                col=c,
            )
        slo = _slo_ms(runs, tier, slo_key)
        if slo:
            fig.add_vline(x=slo, line={"dash": "dash", "color": "#444", "width": 1}, row=1, col=c)
        if metric == "tbt":
            fig.add_hline(y=0.01, line={"dash": "dot", "color": "#888", "width": 1}, row=1, col=c)
            fig.update_yaxes(type="log", exponentformat="power", row=1, col=c)
        else:
            fig.update_yaxes(range=[0, 1.01], row=1, col=c)
        fig.update_xaxes(type="log", title_text="ms", row=1, col=c)
    if not fig.data:
        return None
    if metric == "ttft":
        fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
        what = "TTFT CDF per tier"
    else:
        fig.update_yaxes(title_text="share of gaps > x", row=1, col=1)
        what = "TBT per tier: share of gaps longer than x (dotted: 1% = P99)"
    return _layout(fig, f"{what}, one line per run (dashed: the tier's SLO)", margin_top=80)


def tier_slo_bars(runs: Sequence[RunView]) -> go.Figure | None:
    """Per tier, one bar per run: SLO attainment (left) and P99 TBT against the tier's TBT
    SLO (right; bar green when it meets it, red when it misses). The paid tier's story at
    first glance."""
    tiers = _tiers_of(runs)
    if not tiers:
        return None
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "SLO attainment per tier (share of requests meeting TTFT and TBT SLOs)",
            "P99 TBT per tier, ms (✓ green: meets the tier's SLO, ✗ red: misses; ─ SLO)",
        ),
    )
    any_data = False
    for i, rv in enumerate(runs):
        blocks = rv.summary.get("tiers") or {}
        att, p99, colors, text = [], [], [], []
        for t in tiers:
            b = blocks.get(t) or {}
            a = b.get("slo_attainment")
            att.append(a)
            done = (b.get("completed") or 0) > 0
            v = b.get("p99_itl_ms") if done else None
            p99.append(v)
            slo = b.get("tbt_slo_ms")
            colors.append(slo_color(None if v is None or slo is None else v <= slo))
            text.append("no data" if v is None else f"{v:.0f}")
            any_data = any_data or a is not None or v is not None
        fig.add_trace(
            go.Bar(
                x=[esc(t) for t in tiers],
                y=att,
                name=esc(rv.label),
                legendgroup=esc(rv.label),
                marker={"color": _color(i)},
                text=["–" if a is None else f"{a:.0%}" for a in att],
                textposition="outside",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=[esc(t) for t in tiers],
                y=p99,
                name=esc(rv.label),
                legendgroup=esc(rv.label),
                showlegend=False,
                marker={"color": _color(i)},
                text=[
                    x if x == "no data" else f"{x} {'✓' if c == SLO_MET else '✗'}"
                    for x, c in zip(text, colors, strict=True)
                ],
                textposition="outside",
                textfont={"color": colors},
                cliponaxis=False,
            ),
            row=1,
            col=2,
        )
    if not any_data:
        return None
    slos = [_slo_ms(runs, t, "tbt_slo_s") for t in tiers]
    if any(s is not None for s in slos):
        fig.add_trace(
            go.Scatter(
                x=[esc(t) for t in tiers],
                y=slos,
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 60, "line": {"width": 3}},
                marker_color="#222",
                name="TBT SLO",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(range=[0, 1.12], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    return _layout(
        fig, "Per tier: SLO attainment and P99 TBT", height=440, margin_top=80, barmode="group"
    )


def overlay_throughput(runs: Sequence[RunView]) -> go.Figure | None:
    fig = go.Figure()
    t_max = max((float(rv.chunk_t.max()) for rv in runs if rv.chunk_t.size), default=0.0)
    if t_max <= 0:
        return None
    for i, rv in enumerate(runs):
        if rv.chunk_t.size:
            x, tok, w = binned(rv.chunk_t, rv.chunk_tokens.astype(float), t_max)
            fig.add_trace(
                go.Scatter(
                    x=x, y=tok / w, mode="lines", name=esc(rv.label), line={"color": _color(i)}
                )
            )
    return _layout(
        fig, "Output tokens/s per run", xaxis={"title": "time (s)"}, yaxis={"title": "tokens/s"}
    )


def overlay_backlog(runs: Sequence[RunView]) -> go.Figure | None:
    fig = go.Figure()
    for i, rv in enumerate(runs):
        bs = rv.backlog
        if bs.t.size > 1:
            v = rv.stability.get("verdict", "?")
            fig.add_trace(
                go.Scatter(
                    x=bs.t,
                    y=bs.backlog,
                    mode="lines",
                    name=esc(f"{rv.label} ({v})"),
                    line={"color": _color(i)},
                )
            )
    if not fig.data:
        return None
    return _layout(
        fig,
        "Backlog per run (arrivals − departures)",
        xaxis={"title": "time (s)"},
        yaxis={"title": "requests"},
    )


def paired_diff(base: RunView, other: RunView, metric: str = "ttft_s") -> dict | None:
    """Per-request differences other − base (ms) over requests that succeeded in both runs
    (same frozen trace: joined on ``req``). Bootstrap 95% CIs of the mean and median
    (anchors-harness.md §5 item 5); 1000 resamples of at most 20k pairs, seed 0."""
    a = base.rm[["req", metric]].dropna()
    b = other.rm[["req", metric]].dropna()
    j = a.merge(b, on="req", suffixes=("_a", "_b"))
    if len(j) < 2:
        return None
    d = (j[f"{metric}_b"].to_numpy(float) - j[f"{metric}_a"].to_numpy(float)) * 1000
    rng = np.random.default_rng(0)
    sample = d if d.size <= 20_000 else rng.choice(d, 20_000, replace=False)
    small = sample.size < 5000
    boots = rng.choice(sample, size=(1000, sample.size), replace=True) if small else None
    if boots is not None:
        means, meds = boots.mean(axis=1), np.median(boots, axis=1)
    else:
        means = np.empty(1000)
        meds = np.empty(1000)
        for k in range(1000):
            s = rng.choice(sample, sample.size, replace=True)
            means[k], meds[k] = s.mean(), np.median(s)
    return {
        "metric": metric.removesuffix("_s"),
        "base": base.label,
        "other": other.label,
        "pairs": int(d.size),
        "mean_ms": float(d.mean()),
        "mean_ci_ms": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))],
        "median_ms": float(np.median(d)),
        "median_ci_ms": [float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))],
        "other_faster": float((d < 0).mean()),
        "other_slower": float((d > 0).mean()),
        "diffs": d,
    }


def paired_diff_figure(diffs: Sequence[dict]) -> go.Figure | None:
    """CDF of per-request differences (win/loss CDF): left of 0 = the other run is faster."""
    fig = go.Figure()
    for i, dd in enumerate(diffs):
        x, p = cdf_points(dd["diffs"])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=p,
                mode="lines",
                name=esc(f"{dd['metric'].upper()}: {dd['other']} − {dd['base']}"),
                line={"color": _color(i + 1)},
            )
        )
    if not fig.data:
        return None
    fig.add_vline(x=0, line={"color": "#444", "width": 1})
    return _layout(
        fig,
        "Paired per-request differences (same frozen trace): CDF",
        xaxis={"title": "difference (ms); < 0: faster than the base run"},
        yaxis={"title": "fraction of requests", "range": [0, 1.01]},
    )


# ---------------------------------------------------------------- sweeps
def sweep_figures(sweep: dict) -> list[tuple[str, go.Figure]]:
    """Latency and throughput vs offered rate per policy, the capacity marked (dashed) and
    the stability verdict as marker symbol."""
    rows = sweep.get("runs", [])
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    caps = sweep.get("capacity", {})
    symbols = {"stable": "circle", "unstable": "x", "inconclusive": "diamond-open"}
    lat = make_subplots(rows=1, cols=2, subplot_titles=("P99 TTFT (ms)", "P99 ITL (ms)"))
    thr = go.Figure()
    by_cap: dict[float, list[str]] = {}
    for i, pol in enumerate(policies):
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        sym = [symbols.get(str(r.get("verdict")), "circle") for r in rs]
        txt = [esc(f"{r.get('verdict')}; SLOs met: {r.get('meets_slos')}") for r in rs]
        for col, key in ((1, "p99_ttft_ms"), (2, "p99_itl_ms")):
            lat.add_trace(
                go.Scatter(
                    x=x,
                    y=[r.get(key) for r in rs],
                    mode="lines+markers",
                    name=esc(pol),
                    legendgroup=esc(pol),
                    showlegend=col == 1,
                    marker={"symbol": sym, "size": 9, "color": _color(i)},
                    line={"color": _color(i)},
                    text=txt,
                ),
                row=1,
                col=col,
            )
        thr.add_trace(
            go.Scatter(
                x=x,
                y=[r.get("request_throughput") for r in rs],
                mode="lines+markers",
                name=esc(f"{pol}: completed"),
                marker={"symbol": sym, "size": 9, "color": _color(i)},
                line={"color": _color(i)},
                text=txt,
            )
        )
        cap = (caps.get(pol) or {}).get("capacity_rps")
        if cap is not None:
            for c in (1, 2):
                lat.add_vline(x=cap, line={"dash": "dash", "color": _color(i)}, row=1, col=c)
            thr.add_vline(x=cap, line={"dash": "dash", "color": _color(i)})
            by_cap.setdefault(cap, []).append(pol)
    for cap, pols in by_cap.items():  # one label per capacity value (no overlapping text)
        thr.add_annotation(
            x=cap,
            y=1.0,
            yref="paper",
            showarrow=False,
            xanchor="left",
            text=esc(f" capacity {', '.join(pols)}: {cap:g} req/s"),
        )
    if rows:
        rates = sorted({r["rate"] for r in rows})
        thr.add_trace(
            go.Scatter(
                x=rates,
                y=rates,
                mode="lines",
                name="offered",
                line={"color": "#999", "dash": "dot"},
            )
        )
    for c in (1, 2):
        lat.update_xaxes(title_text="offered rate (req/s)", row=1, col=c)
        lat.update_yaxes(type="log", row=1, col=c)
    _layout(lat, "Latency vs rate (dashed: capacity; x: unstable, ◇: inconclusive)", margin_top=80)
    _layout(
        thr,
        "Throughput vs rate",
        xaxis={"title": "offered rate (req/s)"},
        yaxis={"title": "completed requests/s"},
    )
    return [("Latency vs rate", lat), ("Throughput vs rate", thr)] + sweep_tier_figures(sweep)


# (key in the point's tier block, panel title, y-axis title, SLO key or threshold marker)
_TIER_SWEEP = (
    ("slo_attainment", "SLO attainment per tier vs rate", "share meeting SLOs"),
    ("goodput", "Goodput per tier vs rate (requests/s meeting the tier's SLOs)", "req/s"),
    ("p99_itl_ms", "P99 TBT per tier vs rate (dashed: the tier's TBT SLO)", "ms"),
)


def sweep_tier_figures(sweep: dict) -> list[tuple[str, go.Figure]]:
    """SLO attainment, goodput and P99 TBT per tier vs offered rate, one panel per tier and
    one line per policy; each policy's per-tier capacity dashed in the attainment panels."""
    rows = sweep.get("runs", [])
    tiers: list[str] = []
    for r in rows:
        for t in r.get("tiers") or {}:
            if t not in tiers:
                tiers.append(t)
    if not tiers:
        return []
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    caps = sweep.get("capacity", {})
    out = []
    for key, title, ytitle in _TIER_SWEEP:
        fig = make_subplots(rows=1, cols=len(tiers), subplot_titles=[esc(t) for t in tiers])
        for c, tier in enumerate(tiers, start=1):
            slo = None
            for i, pol in enumerate(policies):
                rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["rate"])
                ys = []
                for r in rs:
                    b = (r.get("tiers") or {}).get(tier) or {}
                    done = (b.get("completed") or 0) > 0
                    ys.append(b.get(key) if done or key != "p99_itl_ms" else None)
                    slo = slo or b.get("tbt_slo_ms")
                lo = [r.get("tiers_ci", {}).get(tier, {}).get(key) for r in rs]
                err = None
                if any(x is not None for x in lo):
                    err = {
                        "type": "data",
                        "symmetric": False,
                        "array": [
                            None if c_ is None else c_[1] - y for c_, y in zip(lo, ys, strict=True)
                        ],
                        "arrayminus": [
                            None if c_ is None else y - c_[0] for c_, y in zip(lo, ys, strict=True)
                        ],
                    }
                fig.add_trace(
                    go.Scatter(
                        x=[r["rate"] for r in rs],
                        y=ys,
                        error_y=err,
                        mode="lines+markers",
                        name=esc(pol),
                        legendgroup=esc(pol),
                        showlegend=c == 1,
                        line={"color": _color(i)},
                        marker={"color": _color(i), "size": 8},
                    ),
                    row=1,
                    col=c,
                )
                tcap = ((caps.get(pol) or {}).get("by_tier") or {}).get(tier)
                if key == "slo_attainment" and tcap is not None:
                    fig.add_vline(x=tcap, line={"dash": "dash", "color": _color(i)}, row=1, col=c)
            if key == "slo_attainment":
                fig.add_hline(
                    y=float(sweep.get("min_attainment", 0.9)),
                    line={"dash": "dot", "color": "#888"},
                    row=1,
                    col=c,
                )
                fig.update_yaxes(range=[-0.02, 1.05], tickformat=".0%", row=1, col=c)
            if key == "p99_itl_ms":
                if slo:
                    fig.add_hline(y=slo, line={"dash": "dash", "color": "#444"}, row=1, col=c)
                fig.update_yaxes(type="log", row=1, col=c)
            fig.update_xaxes(title_text="offered rate (req/s)", row=1, col=c)
        fig.update_yaxes(title_text=ytitle, row=1, col=1)
        extra = (
            " (dotted: min attainment; dashed: tier capacity)" if key == "slo_attainment" else ""
        )
        out.append((title, _layout(fig, title + extra, margin_top=80)))
    return out
