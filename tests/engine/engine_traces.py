"""Small traces for the engine tests, built directly with Trace.from_frame (no sources)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace


def make_trace(arrivals, prompts, outputs, tiers=None) -> Trace:
    n = len(arrivals)
    tl = default_tiers()
    names = tiers or [tl[i % len(tl)].name for i in range(n)]
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.asarray(arrivals, dtype=float),
            "prompt_len": np.asarray(prompts, dtype=np.int64),
            "output_len": np.asarray(outputs, dtype=np.int64),
            "tier": names,
        }
    )
    return Trace.from_frame(df, tl, meta={"source": "test"})


def poisson_trace(n: int, rate: float, seed: int = 0, pmax: int = 200, omax: int = 300) -> Trace:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    return make_trace(arr, rng.integers(1, pmax, n), rng.integers(1, omax, n))
