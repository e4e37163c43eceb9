"""A Poisson test trace for the scale-out tests (no workload sources needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace


def make_trace(n: int, rate: float, output_len: int = 20) -> Trace:
    rng = np.random.default_rng(1)
    arr = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))])
    tiers = default_tiers()
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": arr,
            "prompt": [None] * n,
            "prompt_len": [16] * n,
            "output_len": [output_len] * n,
            "tier": [tiers[i % len(tiers)].name for i in range(n)],
        }
    )
    return Trace.from_frame(df, tiers, meta={"source": "test"})
