"""Report panels of a session run (issue 15): TTFT and prompt tokens by turn, per-tier session
SLO attainment, and a timeline of sample sessions. Plain runs get none (``[]``).

Figures come from ``summary.json["sessions"]`` (:mod:`harness.results.sessions`) and the
request rows' session columns, so the report shows what the metrics computed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from harness.report.figures import _layout, esc, tier_color
from harness.results import schema

TIMELINE_SESSIONS = 20


def _summary(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / schema.SUMMARY_JSON
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("sessions")


def ttft_by_turn(s: dict[str, Any]) -> go.Figure | None:
    """Mean, p50 and p99 TTFT per call index, and TTFT per prompt token on a second axis."""
    turns = pd.DataFrame(s.get("per_turn") or [])
    if turns.empty:
        return None
    fig = go.Figure()
    x = turns["call_index"]
    for key, dash in (("ttft_mean_ms", "solid"), ("ttft_p50_ms", "dot"), ("ttft_p99_ms", "dash")):
        fig.add_trace(go.Scatter(x=x, y=turns[key], name=key[5:8], line={"dash": dash}))
    fig.add_trace(
        go.Scatter(
            x=x,
            y=turns["ttft_per_prompt_token_ms"],
            name="TTFT per prompt token (ms/token)",
            yaxis="y2",
            line={"color": "#888"},
        )
    )
    return _layout(
        fig,
        "TTFT by turn (call index)",
        xaxis={"title": "call index in session", "dtick": 1},
        yaxis={"title": "TTFT (ms)"},
        yaxis2={"title": "ms / prompt token", "overlaying": "y", "side": "right"},
    )


def prompt_by_turn(s: dict[str, Any]) -> go.Figure | None:
    """Mean prompt tokens (history + new text) per call index, with the call counts."""
    turns = pd.DataFrame(s.get("per_turn") or [])
    if turns.empty:
        return None
    fig = go.Figure(
        go.Bar(
            x=turns["call_index"],
            y=turns["prompt_tokens_mean"],
            text=[f"n={n}" for n in turns["calls"]],
            name="mean prompt tokens",
        )
    )
    return _layout(
        fig,
        "Prompt tokens by turn (the history grows)",
        xaxis={"title": "call index in session", "dtick": 1},
        yaxis={"title": "prompt tokens (mean)"},
    )


def session_slo_bars(s: dict[str, Any]) -> go.Figure | None:
    """Per tier: share of sessions whose every call met the SLO, and mean share of calls met."""
    tiers = s.get("tiers") or {}
    if not tiers:
        return None
    names = list(tiers)
    fig = go.Figure()
    for key, label in (("slo_attainment", "every call met"), ("mean_fraction_met", "calls met")):
        vals = [100.0 * (tiers[t].get(key) or 0.0) for t in names]
        fig.add_trace(go.Bar(x=[esc(t) for t in names], y=vals, name=label))
    return _layout(
        fig,
        "Session SLO attainment per tier",
        yaxis={"title": "% of sessions / calls", "range": [0, 100]},
        barmode="group",
    )


def session_timeline(requests: pd.DataFrame, n: int = TIMELINE_SESSIONS) -> go.Figure | None:
    """The first ``n`` sessions: each call a bar from send to last chunk (darker up to the
    first chunk); gaps between bars are think time or waiting on parents."""
    if "session_id" not in requests.columns or requests.empty:
        return None
    r = requests.dropna(subset=["session_id"])
    first = r.groupby("session_id")["target_s"].min().sort_values()
    keep = list(first.index[:n])
    fig = go.Figure()
    for i, sid in enumerate(keep):
        g = r[r["session_id"] == sid]
        send = g["send_s"].to_numpy(float)
        fc = g["first_chunk_s"].to_numpy(float)
        end = np.where(np.isfinite(g["last_chunk_s"]), g["last_chunk_s"], send)
        fc = np.where(np.isfinite(fc), fc, end)
        color = tier_color(0 if g["success"].all() else 1)
        label = esc(sid)
        fig.add_trace(
            go.Bar(
                y=[label] * len(g),
                x=fc - send,
                base=send,
                orientation="h",
                marker={"color": color, "opacity": 0.9},
                name="waiting for first token",
                showlegend=i == 0,
                legendgroup="ttft",
                hovertext=[
                    f"call {k} (attempt {a})"
                    for k, a in zip(g["call_index"], g["attempt"], strict=True)
                ],
            )
        )
        fig.add_trace(
            go.Bar(
                y=[label] * len(g),
                x=end - fc,
                base=fc,
                orientation="h",
                marker={"color": color, "opacity": 0.45},
                name="streaming",
                showlegend=i == 0,
                legendgroup="stream",
            )
        )
    return _layout(
        fig,
        f"Timeline of {len(keep)} sessions (calls as bars; gaps: think time, parents)",
        height=max(300, 22 * len(keep) + 120),
        xaxis={"title": "run time (s)"},
        barmode="overlay",
    )


def session_figures(run_dir: Path, requests: pd.DataFrame) -> list[tuple[str, go.Figure | None]]:
    """(panel name, figure) for a session run; [] for a plain run."""
    s = _summary(run_dir)
    if not s:
        return []
    return [
        ("Sessions: TTFT by turn", ttft_by_turn(s)),
        ("Sessions: prompt tokens by turn", prompt_by_turn(s)),
        ("Sessions: SLO attainment per tier", session_slo_bars(s)),
        ("Sessions: timeline", session_timeline(requests)),
        ("Sessions: prefix-cache hits by turn", prefix_hits_by_turn(run_dir, requests)),
    ]


def prefix_hits_by_turn(run_dir: Path, requests: pd.DataFrame) -> go.Figure | None:
    """Prefix-cache hit rate per call index (hits / queried prompt tokens), when the run has
    per-request counts (harness.results.prefix_hits, issue 16)."""
    from harness.results.prefix_hits import prefix_hit_summary

    p = prefix_hit_summary(run_dir, requests)
    if not p or not p["per_turn"]:
        return None
    turns = pd.DataFrame(p["per_turn"])
    fig = go.Figure(go.Bar(x=turns["call_index"], y=turns["hit_rate"], name="hit rate"))
    return _layout(
        fig,
        f"Prefix-cache hit rate by turn (run: {p['hit_rate']:.1%})",
        xaxis={"title": "call index in session", "dtick": 1},
        yaxis={"title": "hits / prompt tokens queried", "range": [0, 1]},
    )
