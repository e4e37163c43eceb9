"""Session affinity: every turn of a session goes to the engine that served its first turn.

A multi-turn session's next prompt repeats its history, which that engine's prefix cache
still holds, so stickiness turns a full re-prefill into a cache hit (llm-d's session-affinity
scorer; issue 16). A call with no session, and a session's first call, go to the least loaded
engine. Rebalancing: when the sticky engine owes more than ``rebalance_factor`` times this
call's prompt in tokens beyond the least loaded engine, the wait there costs more than the
re-prefill stickiness saves, so the session moves (and sticks to its new engine).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.least_loaded import least_loaded
from harness.routers.registry import register


@register("session-affinity")
class SessionAffinity(Router):
    """Sticky by session id; new sessions to the least loaded engine; moves an overloaded one."""

    def __init__(self, rebalance_factor: float | None = 4.0, max_sessions: int = 1_000_000) -> None:
        super().__init__()
        if rebalance_factor is not None and rebalance_factor < 0:
            raise ValueError("rebalance_factor must be >= 0 (or None to never move a session)")
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.rebalance_factor = rebalance_factor
        self.max_sessions = int(max_sessions)
        self._home: OrderedDict[str, int] = OrderedDict()  # LRU: session id -> engine index
        self._turn = 0
        self._moves = 0

    @property
    def moves(self) -> int:
        """Sessions moved off an overloaded engine."""
        return self._moves

    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        self._turn += 1
        best = least_loaded(engines, self._turn)
        sid = call.session_id
        if sid is None:
            return best
        home = self._home.get(sid)
        if home is None or home >= len(engines):
            choice = best
        elif self._overloaded(engines[home], engines[best], call):
            choice = best
            self._moves += 1
        else:
            choice = home
        self._home[sid] = choice
        self._home.move_to_end(sid)
        if len(self._home) > self.max_sessions:  # forget the longest-idle session
            self._home.popitem(last=False)
        return choice

    def _overloaded(self, home: EngineLoad, best: EngineLoad, call: RouteCall) -> bool:
        if self.rebalance_factor is None or home.index == best.index:
            return False
        excess = home.outstanding_tokens - best.outstanding_tokens
        return excess > self.rebalance_factor * max(call.prompt_len, 1)
