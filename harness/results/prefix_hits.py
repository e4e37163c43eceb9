"""Prefix-cache hits per call in a run directory (issues 15, 16).

A run directory may hold the per-request counts in ``prefix_hits.parquet`` (``req``,
``queries``, ``hits``): written by whoever knows them (the simulator from the engine core's
``num_cached_tokens``, a live run from :func:`harness.loadgen.prefix_poller.hit_counts`)
with :func:`write_prefix_hits`; :func:`prefix_hit_summary` turns them into the run's hit rate
and the rate per turn index, which the sessions report shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PREFIX_HITS_FILE = "prefix_hits.parquet"


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
