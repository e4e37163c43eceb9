"""Uniform random routing: RAD's theoretical planner (seed-rad-slai.md §1.4, Theorem 2).

Each call goes to an engine drawn uniformly at random, with no monitoring and no migration;
seeded, so a simulated run is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.registry import register


@register("random")
class RandomRouter(Router):
    """Uniformly random engine per call (RAD's planner, seed-rad-slai.md §1.4), seeded."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = int(seed)
        self._rng = random.Random(self.seed)

    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        return self._rng.randrange(len(engines))
