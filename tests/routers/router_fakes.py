"""Small fake engines for router tests: plain data behind the EngineLoad protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeEngine:
    """An EngineLoad with settable figures; ``cache`` maps an identity to its cached tokens."""

    index: int
    num_waiting: int = 0
    num_running: int = 0
    outstanding_tokens: int = 0
    kv_usage: float = 0.0
    cache: dict[Any, int] = field(default_factory=dict)

    def cached_tokens(self, identity: Any) -> int:
        return self.cache.get(identity, 0)


def engines(n: int, **kw: Any) -> list[FakeEngine]:
    """``n`` idle fake engines (``kw`` applied to each)."""
    return [FakeEngine(index=i, **kw) for i in range(n)]
