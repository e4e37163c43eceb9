"""Prefix-cache aware routing: trade the cached prefix an engine holds against its load.

Modelled on llm-d's inference scheduler (Filter -> Score -> Pick, llm-d.ai docs, "Request
Scheduler" and "Optimized Baseline"): each engine gets a weighted sum of scorer values in
[0, 1] and the highest total wins. The scorers, as there:

- prefix: the fraction of this call's prompt the engine's prefix cache holds now
  (``EngineLoad.cached_tokens(identity) / prompt_len``; llm-d counts matched blocks);
- queue: the engine's load min-max normalised across engines, 1 for the least loaded and 0
  for the most (llm-d's queue scorer uses the waiting-queue depth; we use outstanding tokens,
  the work the call would wait behind);
- kv: free KV, ``1 - kv_usage`` (llm-d's kv-cache-utilization scorer), off by default.

Default weights prefix 3, queue 2: the default profile llm-d ships (Red Hat OpenShift AI,
"Configuring scheduler settings for LLM inference services", §6), which prefers a cache hit
over an evenly spread load. Ties go to the least loaded engine. A call with no identity (plain
traces) scores only on load, i.e. least outstanding tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.least_loaded import least_loaded
from harness.routers.registry import register


def queue_scores(loads: Sequence[float]) -> list[float]:
    """Min-max normalised inverse load: 1.0 for the least loaded, 0.0 for the most (all 1.0
    when every engine carries the same load)."""
    lo, hi = min(loads), max(loads)
    if hi <= lo:
        return [1.0] * len(loads)
    return [(hi - x) / (hi - lo) for x in loads]


@register("prefix-aware")
class PrefixAware(Router):
    """Highest weighted score of cached-prefix fraction, inverse load and free KV (llm-d)."""

    def __init__(
        self, prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 0.0
    ) -> None:
        super().__init__()
        if min(prefix_weight, queue_weight, kv_weight) < 0:
            raise ValueError("router weights must be >= 0")
        self.prefix_weight = float(prefix_weight)
        self.queue_weight = float(queue_weight)
        self.kv_weight = float(kv_weight)
        self._turn = 0
        self._hits = 0

    @property
    def hits(self) -> int:
        """Calls routed to an engine holding part of their prompt."""
        return self._hits

    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        self._turn += 1
        fallback = least_loaded(engines, self._turn)
        if (call.identity is None or self.prefix_weight == 0) and self.kv_weight == 0:
            # only the queue score counts: the least loaded engine has the top score (1.0)
            # and wins the tie-break, so the choice is the fallback (same answer, no scoring)
            return fallback
        loads = [e.outstanding_tokens for e in engines]
        queue = queue_scores(loads)
        cached = [0] * len(engines)
        if call.identity is not None and self.prefix_weight > 0:
            cached = [e.cached_tokens(call.identity) for e in engines]
        denom = max(call.prompt_len, 1)
        scores = [
            self.prefix_weight * min(cached[i], denom) / denom
            + self.queue_weight * queue[i]
            + self.kv_weight * (1.0 - engines[i].kv_usage)
            for i in range(len(engines))
        ]
        top = max(scores)
        best = [i for i, s in enumerate(scores) if s >= top - 1e-9]
        choice = fallback if fallback in best else min(best, key=lambda i: (loads[i], i))
        if cached[choice] > 0:
            self._hits += 1
        return choice
