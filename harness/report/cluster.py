"""Report panels of a cluster or agent-network run (issue 16): per-engine utilisation, queue
and KV over time (from the engine samples' ``engine`` column), and for an agent network the
token backlog W(t) and per-agent load (from ``network.json``, written by
``harness experiment agents``; rules in :mod:`harness.results.network`). A single-engine run
gets none (``[]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from harness.report.figures import PALETTE, _layout, esc

NETWORK_JSON = "network.json"
BINS = 200


def _engine_rows(samples: pd.DataFrame | None) -> pd.DataFrame | None:
    """Engine telemetry rows of a run with at least two engines, else None."""
    if samples is None or samples.empty or "engine" not in samples.columns:
        return None
    s = samples[samples["engine"].notna()]
    if "source" in s.columns:
        s = s[s["source"] == "engine"]
    if s.empty or s["engine"].nunique() < 2:
        return None
    return s


def _bins(s: pd.DataFrame) -> tuple[np.ndarray, float]:
    t = s["t_s"].to_numpy(float)
    lo, hi = float(np.nanmin(t)), float(np.nanmax(t))
    width = max((hi - lo) / BINS, 1e-9)
    return lo + width * (np.arange(BINS) + 0.5), width


def engine_budgets(run_dir: Path) -> dict[str, int]:
    """Each engine's token budget from run.json (``cluster.engines``); {} when absent."""
    path = Path(run_dir) / "run.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        engines = (meta.get("cluster") or {}).get("engines") or []
        return {str(e["name"]): int(e["engine"]["token_budget"]) for e in engines}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def engine_utilisation(s: pd.DataFrame, budgets: dict[str, int] | None = None) -> go.Figure:
    """Per engine and time bin: busy share (step time / bin width) and, where the token
    budget is known, batch fill (tokens per step / budget). Both matter: in seed 004's slotted
    model an engine is always busy, yet an agent starved by its upstream fills a tenth of its
    batches (seed-stability.md §2.6)."""
    centers, width = _bins(s)
    lo = centers[0] - width / 2
    fig = go.Figure()
    for i, (name, g) in enumerate(s.groupby("engine", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        k = np.clip(((g["t_s"].to_numpy(float) - lo) / width).astype(int), 0, BINS - 1)
        dur = g["step_duration_s"].fillna(0).to_numpy(float)
        busy = np.bincount(k, weights=dur, minlength=BINS) / width
        fig.add_trace(
            go.Scatter(
                x=centers,
                y=np.minimum(busy, 1.0) * 100,
                name=f"{esc(name)} busy",
                line={"color": color},
            )
        )
        b = (budgets or {}).get(str(name))
        if b:
            tok = (g["prefill_tokens"].fillna(0) + g["decode_tokens"].fillna(0)).to_numpy(float)
            steps = np.bincount(k, weights=g["num_steps"].fillna(1).to_numpy(float), minlength=BINS)
            fill = np.bincount(k, weights=tok, minlength=BINS) / np.maximum(steps, 1) / b
            fig.add_trace(
                go.Scatter(
                    x=centers[steps > 0],
                    y=fill[steps > 0] * 100,
                    name=f"{esc(name)} batch fill",
                    line={"color": color, "dash": "dot"},
                )
            )
    return _layout(
        fig,
        "Per-engine utilisation: busy share of time and batch fill (tokens / budget)",
        xaxis={"title": "time (s)"},
        yaxis={"title": "%", "range": [0, 105]},
    )


def engine_gauge(s: pd.DataFrame, col: str, title: str, ytitle: str, scale: float = 1.0) -> Any:
    """One line per engine of a gauge column (its last value in each time bin)."""
    if col not in s.columns or s[col].isna().all():
        return None
    centers, width = _bins(s)
    lo = centers[0] - width / 2
    fig = go.Figure()
    for name, g in s.groupby("engine", sort=True):
        g = g.sort_values("t_s", kind="stable")
        k = np.clip(((g["t_s"].to_numpy(float) - lo) / width).astype(int), 0, BINS - 1)
        last = pd.Series(g[col].to_numpy(float) * scale).groupby(k).last()
        fig.add_trace(go.Scatter(x=centers[last.index], y=last.to_numpy(), name=esc(name)))
    return _layout(fig, title, xaxis={"title": "time (s)"}, yaxis={"title": ytitle})


def _network(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / NETWORK_JSON
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def network_backlog(doc: dict[str, Any]) -> go.Figure | None:
    """W(t), the network's unprocessed tokens, and each agent's share (seed 004 Fig. 8)."""
    if not doc.get("t"):
        return None
    unit = doc.get("unit", "s")
    fig = go.Figure(go.Scatter(x=doc["t"], y=doc["W"], name="network W(t)", line={"width": 3}))
    for agent, w in (doc.get("W_agents") or {}).items():
        fig.add_trace(go.Scatter(x=doc["t"], y=w, name=esc(agent), line={"dash": "dot"}))
    v = doc.get("verdict") or {}
    slope = v.get("slope")
    extra = f", slope {slope:+.1f} tokens/{unit}" if isinstance(slope, int | float) else ""
    return _layout(
        fig,
        f"Network token backlog W(t): {v.get('verdict', '?')}{extra}",
        xaxis={"title": f"time ({unit})"},
        yaxis={"title": "unprocessed tokens"},
    )


def agent_load_bars(doc: dict[str, Any]) -> go.Figure | None:
    """Per agent: offered load ρ, measured utilisation and the nominal ρ of the parameters."""
    rho = doc.get("rho") or {}
    if not rho:
        return None
    agents = list(rho)
    fig = go.Figure()
    for key, label in (
        ("rho", "offered load ρ"),
        ("utilisation", "utilisation"),
        ("rho_nominal", "ρ from the parameters"),
    ):
        vals = doc.get(key) or {}
        fig.add_trace(
            go.Bar(x=[esc(a) for a in agents], y=[vals.get(a) for a in agents], name=label)
        )
    return _layout(
        fig,
        "Per-agent load (ρ < 1 everywhere does not make a network stable)",
        yaxis={"title": "share of b/t_b"},
        barmode="group",
    )


def cluster_figures(run_dir: Path, samples: pd.DataFrame | None) -> list[tuple[str, Any]]:
    """(panel name, figure) for a cluster / agent-network run; [] for a one-engine run."""
    out: list[tuple[str, Any]] = []
    s = _engine_rows(samples)
    if s is not None:
        out += [
            ("Cluster: per-engine utilisation", engine_utilisation(s, engine_budgets(run_dir))),
            (
                "Cluster: per-engine queue",
                engine_gauge(s, "num_waiting", "Per-engine queue (waiting)", "requests waiting"),
            ),
            (
                "Cluster: per-engine KV",
                engine_gauge(s, "kv_usage", "Per-engine KV-cache usage", "% of KV", 100.0),
            ),
        ]
    doc = _network(run_dir)
    if doc:
        out += [
            ("Network: token backlog W(t)", network_backlog(doc)),
            ("Network: per-agent load", agent_load_bars(doc)),
        ]
    return out
