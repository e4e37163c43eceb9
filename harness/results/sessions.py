"""Session metrics: per turn, per session, per tier, and session goodput (issue 15).

Inputs: a run's request rows with the session columns (``session_id``, ``call_index``,
``parents``, ``attempt``; :data:`harness.results.schema.SESSION_FIELDS`) and
``sessions.parquet``. Rules:

- a *call* is judged on its last attempt (retries are the user's experience of one call);
- a call *meets* its tier's SLO when it succeeded, its TTFT <= the tier's TTFT SLO and its own
  p99 inter-chunk gap <= the tier's TBT SLO (the request rule of
  :mod:`harness.results.summary`, :func:`harness.results.metrics.itl_p99_within`);
- a session is judged as a whole: ``all_met`` when every planned call met its SLO (a call
  never sent, after an abandonment, a failure or a context overflow, did not), and
  ``fraction_met`` = calls met / calls planned;
- ``duration_s`` = last call's end - session start; ``ttlt_s`` (time to last token) = last
  call's end - the session's scheduled arrival (includes waiting for a free session slot);
- session goodput = sessions with ``all_met`` per second of run (the run's measured duration).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.results import metrics as M
from harness.results import schema
from harness.results.rundir import Run, read_run, write_json


def read_sessions(run_dir: Path | str) -> pd.DataFrame | None:
    """``sessions.parquet`` of a run, or None for a plain (single-request) run."""
    path = Path(run_dir) / schema.SESSIONS_FILE
    if not path.is_file():
        return None
    return pq.read_table(path, schema=schema.SESSIONS).to_pandas()


@dataclass
class SessionRecord:
    """One sessions.parquet row (absolute clock times until written); the live session
    dispatcher and sessions in virtual time keep one per session."""

    session_id: str
    tier: str | None
    calls_planned: int
    target: float
    start: float = math.nan
    end: float = math.nan
    calls_sent: int = 0
    calls_done: int = 0
    calls_failed: int = 0
    retries: int = 0
    abandoned: bool = False
    end_reason: str = "not_started"
    errors: dict[str, int] = field(default_factory=dict)


def write_sessions(run_dir: Path, tbl: pa.Table) -> Path:
    """Atomically write ``sessions.parquet`` (tmp + rename)."""
    path = Path(run_dir) / schema.SESSIONS_FILE
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(tbl, tmp)
    os.replace(tmp, path)
    return path


def sessions_table(records: Iterable[Any], t0: float = 0.0) -> pa.Table:
    """``sessions.parquet`` rows from session records
    (:class:`SessionRecord`): the live replay's on the absolute clock
    (``t0`` = the run's start), the simulator's already on the run clock (``t0`` = 0)."""
    rows = [
        {
            "session_id": r.session_id,
            "tier": r.tier,
            "target_s": r.target - t0,
            "start_s": r.start - t0,
            "end_s": r.end - t0,
            "calls_planned": r.calls_planned,
            "calls_sent": r.calls_sent,
            "calls_done": r.calls_done,
            "calls_failed": r.calls_failed,
            "retries": r.retries,
            "abandoned": r.abandoned,
            "end_reason": r.end_reason,
            "errors": json.dumps(r.errors, sort_keys=True) if r.errors else None,
        }
        for r in records
    ]
    return pa.Table.from_pylist(rows, schema=schema.SESSIONS)


def _tiers(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(t["name"]): t for t in meta.get("tiers") or [] if isinstance(t, dict)}


def call_metrics(run: Run) -> pd.DataFrame:
    """One row per call (last attempt): request metrics + session columns + ``met``."""
    req = run.requests
    rm, cv = M.request_metrics(req, run.chunks)
    n = len(rm)
    tiers = _tiers(run.meta)
    tier_col = rm["tier"].to_numpy(dtype=object)
    ttft_slo = (
        np.array([_get(tiers, t, "ttft_slo_s") for t in tier_col], dtype=np.float64)
        if n
        else np.zeros(0)
    )
    tbt_slo = (
        np.array([_get(tiers, t, "tbt_slo_s") for t in tier_col], dtype=np.float64)
        if n
        else np.zeros(0)
    )
    ttft_ok = ~np.isfinite(ttft_slo) | (
        np.nan_to_num(rm["ttft_s"].to_numpy(), nan=np.inf) <= ttft_slo
    )
    tbt_ok = M.itl_p99_within(cv, n, tbt_slo)
    out = rm.copy()
    out["met"] = rm["success"].to_numpy(dtype=bool) & ttft_ok & tbt_ok
    for col in ("session_id", "call_index", "parents", "attempt", "request_id", "prompt_len"):
        out[col] = req[col].to_numpy() if col in req.columns else None
    if "session_id" not in req.columns:  # a plain run: every request a session of one call
        out["session_id"] = req["request_id"].to_numpy()
        out["call_index"] = 0
        out["attempt"] = 0
    out["attempt"] = out["attempt"].fillna(0).astype(np.int64)
    out = out.sort_values(["session_id", "call_index", "attempt"], kind="stable")
    out = out.drop_duplicates(["session_id", "call_index"], keep="last")
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ttft_per_prompt_token_ms"] = (
            out["ttft_s"] * 1000.0 / out["prompt_tokens"].where(out["prompt_tokens"] > 0)
        )
    return out.reset_index(drop=True)


def _get(tiers: dict[str, dict[str, Any]], name: Any, key: str) -> float:
    v = tiers.get(str(name), {}).get(key)
    return float(v) if v is not None else math.nan


def per_turn(calls: pd.DataFrame) -> pd.DataFrame:
    """By call index: calls, success share, TTFT/TBT(TPOT)/E2E mean and p50/p99 (ms), mean
    prompt tokens and mean TTFT per prompt token (ms/token)."""
    rows = []
    for k, g in calls.groupby("call_index", sort=True):
        ok = g[g["success"]]
        row: dict[str, Any] = {
            "call_index": int(k),
            "calls": len(g),
            "success": float(g["success"].mean()),
        }
        for name, col in (("ttft", "ttft_s"), ("tbt", "tpot_s"), ("e2e", "e2el_s")):
            v = ok[col].dropna().to_numpy() * 1000.0
            row[f"{name}_mean_ms"] = float(v.mean()) if v.size else math.nan
            row[f"{name}_p50_ms"] = float(np.percentile(v, 50)) if v.size else math.nan
            row[f"{name}_p99_ms"] = float(np.percentile(v, 99)) if v.size else math.nan
        row["prompt_tokens_mean"] = float(ok["prompt_tokens"].mean()) if len(ok) else math.nan
        per = ok["ttft_per_prompt_token_ms"].dropna()
        row["ttft_per_prompt_token_ms"] = float(per.mean()) if len(per) else math.nan
        row["met"] = float(g["met"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def per_session(sessions: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """The sessions table plus ``calls_met``, ``fraction_met``, ``all_met``, ``duration_s``,
    ``ttlt_s`` (module docstring)."""
    met = calls.groupby("session_id")["met"].sum()
    out = sessions.copy()
    out["calls_met"] = out["session_id"].map(met).fillna(0).astype(np.int64)
    planned = out["calls_planned"].clip(lower=1)
    out["fraction_met"] = out["calls_met"] / planned
    out["all_met"] = out["calls_met"] == out["calls_planned"]
    out["duration_s"] = out["end_s"] - out["start_s"]
    out["ttlt_s"] = out["end_s"] - out["target_s"]
    return out


def _block(s: pd.DataFrame, duration_s: float) -> dict[str, Any]:
    n = len(s)
    d = s["duration_s"].dropna().to_numpy()
    per = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    return {
        "sessions": n,
        "completed": int((s["end_reason"] == "complete").sum()),
        "abandoned": int(s["abandoned"].sum()),
        "calls_planned": int(s["calls_planned"].sum()),
        "calls_done": int(s["calls_done"].sum()),
        "slo_attainment": float(s["all_met"].mean()) if n else None,
        "mean_fraction_met": float(s["fraction_met"].mean()) if n else None,
        "session_goodput": per(float(s["all_met"].sum())),
        "sessions_per_s": per(float(n)),
        "duration_mean_s": float(d.mean()) if d.size else None,
        "duration_p99_s": float(np.percentile(d, 99)) if d.size else None,
        "ttlt_mean_s": float(s["ttlt_s"].mean()) if n else None,
    }


def session_summary(run_dir: Path | str) -> dict[str, Any] | None:
    """Overall, per-tier and per-turn session figures (None for a plain run)."""
    sessions = read_sessions(run_dir)
    if sessions is None:
        return None
    run = read_run(run_dir, samples=False)
    calls = call_metrics(run)
    s = per_session(sessions, calls)
    duration = run.meta.get("duration_s")
    if not isinstance(duration, int | float) or not duration > 0:
        duration = float(np.nanmax(s["end_s"])) if len(s) else 0.0
    out: dict[str, Any] = _block(s, float(duration))
    out["calls_per_s"] = len(run.requests) / duration if duration > 0 else None
    out["duration_s"] = float(duration)
    out["tiers"] = {str(t): _block(g, float(duration)) for t, g in s.groupby("tier", sort=True)}
    out["per_turn"] = per_turn(calls).to_dict(orient="records")
    from harness.results.prefix_hits import prefix_hit_summary

    hits = prefix_hit_summary(run_dir, run.requests)  # run and per-turn hit rate (issue 16)
    if hits is not None:
        out["prefix_cache"] = hits
    info = run.meta.get("sessions") or {}
    for key in ("sharegpt", "lmsys", "fallback", "agent_graph"):
        if key in info:
            out[key] = info[key]
    return out


def add_session_summary(run_dir: Path | str) -> dict[str, Any] | None:
    """Put :func:`session_summary` under ``summary.json["sessions"]`` (no-op for plain runs)."""
    out = session_summary(run_dir)
    if out is None:
        return None
    path = Path(run_dir) / schema.SUMMARY_JSON
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    summary["sessions"] = out
    write_json(path, summary)
    return out


def print_session_summary(run_dir: Path | str, console: Any = None) -> None:
    """A short sessions table on the console (nothing for a plain run)."""
    path = Path(run_dir) / schema.SUMMARY_JSON
    if not path.is_file():
        return
    s = json.loads(path.read_text(encoding="utf-8")).get("sessions")
    if not s:
        return
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    tbl = Table(title="sessions (SLO judged per session: every call met)")
    for col in ("tier", "sessions", "done", "abandoned", "all met", "mean met", "goodput/s"):
        tbl.add_column(col, justify="right")

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    for name, b in [*s["tiers"].items(), ("all", s)]:
        tbl.add_row(
            name,
            str(b["sessions"]),
            str(b["completed"]),
            str(b["abandoned"]),
            pct(b["slo_attainment"]),
            pct(b["mean_fraction_met"]),
            f"{b['session_goodput']:.3g}",
        )
    console.print(tbl)
    if "sharegpt" in s:
        n = s["sharegpt"].get("conversations_recovered")
        console.print(
            f"ShareGPT: {n} conversations recovered from a truncated file (not the full set)"
        )
