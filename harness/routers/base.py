"""The router contract: which engine of a cluster serves a call (issue 16).

A router is to a cluster what a policy is to one engine: a plain object with no clock and no
I/O, hosted by the virtual-time cluster (:mod:`harness.engine.cluster`) and by the live server
(``harness serve --replicas N``) alike. It sees each engine only through :class:`EngineLoad`
and each call only through :class:`RouteCall`, so a router never imports a host and a host
never hard-codes a router (the same rule as for policies, design.md).

Routing is decided once per call, at its release (arrival, or its parents' finish plus think
time); a call never migrates. Calls of an agent graph that name their ``agent`` go to that
agent's engine and are not offered to the router.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class RouteCall:
    """What a router may know of a call: its identity and sizes, never its output length."""

    request_id: str
    prompt_len: int
    max_tokens: int
    tier: str = "default"
    session_id: str | None = None
    # The prompt's token identity (harness.engine.prefix_cache.PromptIdentity) or None when
    # the workload gives none (plain traces); prefix-aware routers probe engines with it.
    identity: Any = None


class EngineLoad(Protocol):
    """One engine as a router sees it, read at routing time."""

    @property
    def index(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet computed plus output tokens not yet generated (max_tokens)."""
        ...

    @property
    def kv_usage(self) -> float: ...

    def cached_tokens(self, identity: Any) -> int:
        """Prompt tokens of ``identity`` this engine's prefix cache holds now (0 if none)."""
        ...


class Router(ABC):
    """Choose an engine index for each call; hooks let stateful routers track their choices."""

    name: ClassVar[str] = "?"

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"router {self.name!r} takes no parameters: {sorted(params)}")

    @abstractmethod
    def route(self, call: RouteCall, engines: Sequence[EngineLoad], now_s: float) -> int:
        """Index (into ``engines``) of the engine that serves ``call``."""

    def on_finish(self, call: RouteCall, engine: int, now_s: float) -> None:  # noqa: B027
        """The call finished (or was aborted) on ``engine``; default: nothing to track."""

    def params(self) -> dict[str, Any]:
        """Parameters worth recording in run.json (public attributes; state is private)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
