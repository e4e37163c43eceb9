"""Freeze a session trace and count what it holds (``harness trace build|show`` on sessions).

Why: a session replay is only comparable across targets when its sessions (calls, parents,
think times, arrivals, tiers) are fixed in a file. Parquet is the exact format: the project
frozen file (:func:`harness.workload.frozen.write_parquet`) keeps the session columns, the
tier specs and the meta, and :func:`harness.workload.session_build.build_session_trace`
reads it back unchanged. JSONL is the portable one: one call per line with the session
columns, read back as a session file (``load_session_file``); it carries tier *names* but
not their SLO specs (give ``--tiers`` again when they are not the default).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.sessions import SESSION_COLUMNS, Session, sessions_from_frame
from harness.workload.trace import COLUMNS, Trace


def save_session_trace(trace: Trace, path: Path | str) -> Path:
    """Write ``trace`` to ``path``: ``.jsonl`` as one call per line, anything else as the
    frozen Parquet file (module docstring)."""
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        from harness.workload.build import save_trace

        return save_trace(trace, path)
    cols = list(COLUMNS) + [c for c in ("hash_ids", *SESSION_COLUMNS) if c in trace.df.columns]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in trace.df[cols].to_dict(orient="records"):
            f.write(json.dumps({k: _plain(v) for k, v in row.items()}) + "\n")
    tmp.replace(path)
    return path


def _plain(v: Any) -> Any:
    """numpy scalars/arrays and NaN -> JSON values (NaN -> null: an unset optional column)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def session_counts(trace: Trace) -> dict[str, Any]:
    """Sessions, calls, calls per session and turns per session (the longest parent chain:
    sequential rounds; a conversation's turns, an agent graph's depth), plus sessions/s over
    the span of session arrivals."""
    sessions = sessions_from_frame(trace.df)
    calls = np.array([len(s.calls) for s in sessions], dtype=float)
    turns = np.array([_depth(s) for s in sessions], dtype=float)
    arr = np.array([s.arrival_s for s in sessions], dtype=float)
    span = float(arr.max() - arr.min()) if len(arr) > 1 else 0.0

    def stats(x: np.ndarray) -> dict[str, float]:
        return {"mean": float(x.mean()), "p50": float(np.median(x)), "max": float(x.max())}

    tiers = pd.Series([s.tier for s in sessions], dtype=object).value_counts(sort=False)
    return {
        "sessions": len(sessions),
        "calls": int(calls.sum()),
        "calls_per_session": stats(calls),
        "turns_per_session": stats(turns),
        "session_span_s": span,
        "offered_sessions_per_s": (len(sessions) - 1) / span if span > 0 else float("inf"),
        "sessions_by_tier": {str(k): int(v) for k, v in tiers.items()},
    }


def _depth(s: Session) -> int:
    """Calls on the longest parent chain (calls are in call-index order; a parent may have a
    higher index in a hand-written graph, so iterate until no depth changes)."""
    depth = {c.index: 1 for c in s.calls}
    for _ in range(len(s.calls)):
        changed = False
        for c in s.calls:
            d = 1 + max((depth.get(p, 0) for p in c.parents), default=0)
            if d > depth[c.index]:
                depth[c.index], changed = d, True
        if not changed:
            break
    return max(depth.values(), default=0)


def fixed_arrivals(source: str) -> bool:
    """True for a frozen session Parquet file: it replays its own session arrivals whatever
    rate is asked (build_session_trace), so a rate sweep over it would repeat one run."""
    from harness.workload.session_build import _is_frozen

    path = Path(source).expanduser()
    return path.is_file() and _is_frozen(path)
