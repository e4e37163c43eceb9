"""Small traces for the engine tests, built directly with Trace.from_frame (no sources)."""

from __future__ import annotations

from typing import Any

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


class JitteryCost:
    """A stand-in "real" engine for fidelity tests: ``cost``'s step times times a seeded
    uniform factor in ``[lo, hi]`` per step, plus ``gap_s`` (the loop's own work after a step's
    tokens leave); with ``stall=(share, times)`` that share of the steps takes ``times`` as
    long (a CPU box's right-skewed steps). Fast-forward must be off: only ``step_time`` is
    defined."""

    name = "jittery"
    uses_prefill_attn = False

    def __init__(
        self,
        cost: Any,
        seed: int,
        lo: float,
        hi: float,
        gap_s: float = 0.0,
        stall: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        self._cost, self._lo, self._hi, self._gap = cost, lo, hi, gap_s
        self._stall = stall
        self._rng = np.random.default_rng(seed)

    def step_time(self, p: int, d: int, kv: int, prefill_attn: float = 0.0) -> float:
        factor = self._rng.uniform(self._lo, self._hi)
        if self._rng.random() < self._stall[0]:
            factor *= self._stall[1]
        return self._cost.step_time(p, d, kv) * factor + self._gap

    def step_times(self, p, d, kv):  # noqa: ANN001, ANN201 - fast-forward is off here
        raise AssertionError("not used")

    def to_dict(self) -> dict:
        return {}
