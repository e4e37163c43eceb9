"""Round-robin: engine i, i+1, ... in turn, blind to load and sessions (the baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.registry import register


@register("round-robin")
class RoundRobin(Router):
    """Cycle through the engines in index order, one call each."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        choice = self._next % len(engines)
        self._next = choice + 1
        return choice
