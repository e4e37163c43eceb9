"""``synthetic``: lengths drawn from simple distributions (vLLM ``random`` dataset style).

Options: ``input_len`` (512), ``output_len`` (128), ``range_ratio`` (0.0): each length is
uniform on ``[len*(1-r), len*(1+r)]`` as in vLLM's ``random`` dataset, rounded, at least 1;
or ``profile=NAME`` to draw (prompt, output) pairs from a bundled length profile
(``lmsys``, ``sharegpt``, ``azure-conv``). Rows come from the caller's sampling stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.workload.sources.base import SourceData, take_options
from harness.workload.trace import TraceError


def load_synthetic(options: dict[str, Any]) -> SourceData:
    opts = take_options(
        options,
        {"input_len": 512, "output_len": 128, "range_ratio": 0.0, "profile": None},
        "synthetic",
    )
    if opts["profile"] is not None:
        from harness.workload.profile import load_profile

        prof = load_profile(str(opts["profile"]))
        return SourceData(
            df=pd.DataFrame(columns=["prompt_len", "output_len"]),
            meta={"source": "synthetic", "profile": prof.name, "profile_origin": prof.origin},
            sampler=prof.sample_frame,
            timed=prof.gap_q is not None,
        )
    try:
        il, ol, rr = int(opts["input_len"]), int(opts["output_len"]), float(opts["range_ratio"])
    except (TypeError, ValueError):
        raise TraceError(
            "synthetic: input_len/output_len must be integers, range_ratio a number"
        ) from None
    if il < 1 or ol < 1:
        raise TraceError(f"synthetic: input_len and output_len must be >= 1 (got {il}, {ol})")
    if not 0.0 <= rr < 1.0:
        raise TraceError(f"synthetic: range_ratio must be in [0, 1), got {rr}")

    def sample(n: int, rng: np.random.Generator) -> pd.DataFrame:
        def draw(mean: int) -> np.ndarray:
            if rr == 0.0:
                return np.full(n, mean, dtype=np.int64)
            lo, hi = mean * (1 - rr), mean * (1 + rr)
            return np.maximum(1, np.rint(rng.uniform(lo, hi, size=n))).astype(np.int64)

        return pd.DataFrame({"prompt_len": draw(il), "output_len": draw(ol)})

    return SourceData(
        df=pd.DataFrame(columns=["prompt_len", "output_len"]),
        meta={"source": "synthetic", "input_len": il, "output_len": ol, "range_ratio": rr},
        sampler=sample,
    )
