"""Routers: which engine of a cluster serves a call (contract in :mod:`harness.routers.base`).

Every built-in router module is imported here, once, so the registry lists them all.
"""

from harness.routers import (  # noqa: F401
    least_loaded,
    prefix_aware,
    random_router,
    round_robin,
    session_affinity,
)
from harness.routers.base import EngineLoad, RouteCall, Router
from harness.routers.registry import (
    UnknownRouterError,
    available_routers,
    make_router,
    register,
)

__all__ = [
    "EngineLoad",
    "RouteCall",
    "Router",
    "UnknownRouterError",
    "available_routers",
    "make_router",
    "register",
]
