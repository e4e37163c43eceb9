"""Least outstanding tokens: send each call where the least work is still owed.

Shared by the load-aware routers (session affinity places new sessions with it, prefix-aware
breaks ties with it). Ties go round-robin from a rotating start, so an idle cluster spreads a
burst instead of piling it on engine 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.registry import register


def least_loaded(engines: Sequence[EngineLoad], start: int = 0) -> int:
    """Index of the engine with the fewest outstanding tokens (then fewest requests); ties
    broken by position counted from ``start``. Each view is read once (a read may sum a
    running batch)."""
    n = len(engines)
    best = 0
    best_key: tuple[int, int, int] | None = None
    for i, e in enumerate(engines):
        key = (e.outstanding_tokens, e.num_waiting + e.num_running, (i - start) % n)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


@register("least-outstanding-tokens")
class LeastOutstandingTokens(Router):
    """The engine owing the fewest tokens (prompt not yet computed + output not yet made)."""

    def __init__(self) -> None:
        super().__init__()
        self._turn = 0

    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        choice = least_loaded(engines, self._turn)
        self._turn += 1
        return choice
