"""Warm-up exclusion (``--warmup N|DURATION``): the first requests of a run are kept in the run
directory but left out of every metric.

Why: the first seconds of a run measure an empty engine (no queue, a cold cache), which
flatters TTFT and drags throughput; vLLM bench, SGLang bench, GuideLLM and AIPerf all let
users drop them (issue 20). The spec is recorded in run.json ``warmup`` (``{"requests": N}``
or ``{"duration_s": D}``); summary.json and the report apply it when they read the run, and
say how many requests it excluded and until when. Requests are ordered by their scheduled
arrival (``target_s``): "the first N" is the first N the trace sent, whatever their fate.
The stability verdict keeps its own warm-up cut (MSER-5) over every request.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from harness.results.rundir import Run

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min)\s*$")


def parse_warmup(text: str) -> dict[str, float | int]:
    """``"50"`` -> first 50 requests; ``"30s"`` / ``"500ms"`` / ``"2m"`` -> arrivals in the
    first duration. Raises ValueError with a one-line ``--warmup`` message otherwise."""
    t = (text or "").strip()
    if t.isdigit():
        n = int(t)
        return {"requests": n}
    m = _DUR.match(t)
    if m:
        v = float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}[m.group(2)]
        if math.isfinite(v):
            return {"duration_s": v}
    raise ValueError(
        f"--warmup {text!r}: give a request count (50) or a duration with its unit (30s, 500ms)"
    )


def warmup_mask(requests: Any, spec: dict[str, Any] | None) -> np.ndarray:
    """Per request row: True when the warm-up spec excludes it."""
    n = len(requests)
    out = np.zeros(n, dtype=bool)
    if not spec or n == 0:
        return out
    t = requests["target_s"].to_numpy(dtype=float)
    if spec.get("requests") is not None:
        k = min(int(spec["requests"]), n)
        if k > 0:
            order = np.argsort(np.nan_to_num(t, nan=np.inf), kind="stable")
            out[order[:k]] = True
    elif spec.get("duration_s") is not None:
        out = np.nan_to_num(t, nan=np.inf) < float(spec["duration_s"])
    return out


def spec_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    w = meta.get("warmup")
    return dict(w) if isinstance(w, dict) and w else None


def without_warmup(run: Run) -> tuple[Run, dict[str, Any] | None]:
    """The run with its warm-up requests (and their chunks) removed, and a description
    ``{spec, excluded, until_s}`` for summary.json (None when the run has no warm-up)."""
    spec = spec_of(run.meta)
    if spec is None:
        return run, None
    mask = warmup_mask(run.requests, spec)
    t = run.requests["target_s"].to_numpy(dtype=float)
    info = {
        **spec,
        "excluded": int(mask.sum()),
        "until_s": float(np.nanmax(t[mask])) if mask.any() else None,
    }
    if not mask.any():
        return run, info
    gone = run.requests["req"].to_numpy()[mask]
    reqs = run.requests[~mask].reset_index(drop=True)
    chunks = run.chunks
    if len(chunks):
        chunks = chunks[~chunks["req"].isin(gone)].reset_index(drop=True)
    return dataclasses.replace(run, requests=reqs, chunks=chunks), info
