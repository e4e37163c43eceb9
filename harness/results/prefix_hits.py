"""Prefix-cache hits per call, from the engine's own ``/metrics`` counters (issue 15).

vLLM exports cumulative counters ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` (prompt tokens looked up / found in the prefix cache).
:class:`MetricsPoller` reads them every ``period_s`` on wall time; when at most one call is in
flight (sessions replayed one at a time, ``--max-active-sessions 1``), the increase between a
call's send and its first token (+ one period) belongs to that call: :func:`hit_shares`.

A run directory may hold the per-request counts in ``prefix_hits.parquet`` (``req``,
``queries``, ``hits``): written by whoever knows them (the simulator from the engine core's
``num_cached_tokens``, a live run from :func:`hit_counts`) with :func:`write_prefix_hits`;
:func:`prefix_hit_summary` turns them into the run's hit rate and the rate per turn index
(issue 16), which the sessions report shows.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

from harness.loadgen.sampler import scan_values

PREFIX_HITS_FILE = "prefix_hits.parquet"
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


def prefix_counters(text: str) -> tuple[float, float] | None:
    """(queries, hits) summed over label sets, or None when the engine exports neither
    (the sampler's line scan: no full parse of vLLM's ~56 KB text every poll)."""
    queries, hits = scan_values(text, QUERIES), scan_values(text, HITS)
    return (sum(queries), sum(hits)) if queries and hits else None


class MetricsPoller(threading.Thread):
    """Polls ``<url>/metrics`` in a thread; ``rows``: (unix time, queries, hits)."""

    def __init__(self, url: str, period_s: float = 0.02) -> None:
        super().__init__(daemon=True, name="prefix-hits")
        self.url, self.period_s = url.rstrip("/"), period_s
        self.rows: list[tuple[float, float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=2.0) as c:
            while not self.halt.is_set():
                try:
                    got = prefix_counters(c.get(self.url + "/metrics").text)
                except httpx.HTTPError:
                    got = None
                if got is not None:
                    self.rows.append((time.time(), *got))
                self.halt.wait(self.period_s)

    def stop(self) -> None:
        self.halt.set()
        self.join()


def hit_counts(
    requests: pd.DataFrame, rows: list[tuple[float, float, float]], t0_unix: float, period_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per request row: (prompt tokens queried, tokens found) in the prefix cache between its
    send and first token (+ one period); NaN where no poll brackets it. Valid only when calls
    did not overlap."""
    q = np.full(len(requests), np.nan)
    h = np.full(len(requests), np.nan)
    if not rows:
        return q, h
    m = np.asarray(rows, dtype=float)
    t = m[:, 0] - t0_unix
    send = requests["send_s"].to_numpy(float)
    first = requests["first_chunk_s"].to_numpy(float)
    for i in range(len(requests)):
        if not (np.isfinite(send[i]) and np.isfinite(first[i])):
            continue
        b = np.searchsorted(t, send[i], side="right") - 1
        a = np.searchsorted(t, first[i] + period_s, side="left")
        if b < 0 or a >= len(t):
            continue
        q[i], h[i] = m[a, 1] - m[b, 1], m[a, 2] - m[b, 2]
    return q, h


def hit_shares(
    requests: pd.DataFrame, rows: list[tuple[float, float, float]], t0_unix: float, period_s: float
) -> np.ndarray:
    """Per request row: hits / queries (:func:`hit_counts`); NaN where nothing was queried."""
    q, h = hit_counts(requests, rows, t0_unix, period_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(q > 0, h / q, np.nan)


def hits_by_turn(call_index: Any, queries: Any, hits: Any) -> pd.DataFrame:
    """Per call index: calls, prompt tokens queried, tokens hit and the hit rate (hits /
    queries, vLLM's ratio); rows with unknown (NaN) counts are left out."""
    df = pd.DataFrame({"call_index": call_index, "queries": queries, "hits": hits}).dropna()
    g = df.groupby("call_index")
    out = pd.DataFrame(
        {"calls": g.size(), "queries": g["queries"].sum(), "hits": g["hits"].sum()}
    ).reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["hit_rate"] = np.where(out["queries"] > 0, out["hits"] / out["queries"], np.nan)
    return out


def write_prefix_hits(run_dir: Path | str, req: Any, queries: Any, hits: Any) -> Path:
    """Write the per-request prefix-cache counts of a run (``req`` = the request rows' key)."""
    path = Path(run_dir) / PREFIX_HITS_FILE
    pd.DataFrame(
        {
            "req": np.asarray(req, dtype=np.int64),
            "queries": np.asarray(queries, dtype=float),
            "hits": np.asarray(hits, dtype=float),
        }
    ).to_parquet(path, index=False)
    return path


def prefix_hit_summary(run_dir: Path | str, requests: pd.DataFrame) -> dict[str, Any] | None:
    """The run's prefix-cache hit rate and its rate per turn index, or None without
    ``prefix_hits.parquet``. ``requests``: the run's request rows (``req``, ``call_index``
    when it is a session run)."""
    path = Path(run_dir) / PREFIX_HITS_FILE
    if not path.is_file():
        return None
    counts = pd.read_parquet(path)
    cols = ["req", "call_index"] if "call_index" in requests.columns else ["req"]
    df = counts.merge(requests[cols], on="req", how="left")
    if "call_index" not in df.columns:
        df["call_index"] = 0
    q, h = float(df["queries"].sum()), float(df["hits"].sum())
    turns = hits_by_turn(df["call_index"].fillna(0), df["queries"], df["hits"])
    return {
        "queries": q,
        "hits": h,
        "hit_rate": h / q if q > 0 else float("nan"),
        "per_turn": turns.to_dict(orient="records"),
    }
