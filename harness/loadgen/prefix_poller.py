"""Prefix-cache hits per call, read live from the engine's own ``/metrics`` (issue 15).

vLLM exports cumulative counters ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` (prompt tokens looked up / found in the prefix cache).
:class:`MetricsPoller` reads them every ``period_s`` on wall time; when at most one call is in
flight (sessions replayed one at a time, ``--max-active-sessions 1``), the increase between a
call's send and its first token (+ one period) belongs to that call: :func:`hit_shares`.
The counts go to the run directory with :func:`harness.results.prefix_hits.write_prefix_hits`.
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pandas as pd

from harness.loadgen.sampler import scan_values

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


__all__ = ["HITS", "QUERIES", "MetricsPoller", "hit_counts", "hit_shares", "prefix_counters"]
