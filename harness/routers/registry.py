"""One registry of cluster routers, keyed by name (a new router costs one file + one import).

Mirrors :mod:`harness.policies.registry`: hosts (the cluster simulator, the live multi-replica
server) build routers by name and never import a router module themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from harness.routers.base import Router

_REGISTRY: dict[str, type[Router]] = {}

T = TypeVar("T", bound=type)


class UnknownRouterError(ValueError):
    """Raised for a router name nobody registered; the message lists the known ones."""


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make a router available by ``name``. Duplicate names are a bug."""

    def deco(cls: T) -> T:
        if name in _REGISTRY:
            raise ValueError(f"router {name!r} registered twice")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def available_routers() -> list[str]:
    """Names of all registered routers, sorted."""
    import harness.routers  # noqa: F401  (imports every built-in module)

    return sorted(_REGISTRY)


def router_class(name: str) -> type[Router]:
    """The class registered under ``name``."""
    names = available_routers()
    if name not in _REGISTRY:
        raise UnknownRouterError(f"unknown router {name!r}; choose from: {', '.join(names)}")
    return _REGISTRY[name]


def make_router(name: str, **params: Any) -> Router:
    """Instantiate a registered router with keyword parameters (a fresh, stateless start)."""
    return router_class(name)(**params)


def parse_router_params(name: str, items: list[str] | None) -> dict[str, Any]:
    """``--router-param NAME=VALUE`` items (values JSON when they parse, else strings) for
    router ``name``, checked against its constructor: one-line ``ValueError`` on a typo."""
    import inspect
    import json

    cls = router_class(name)
    accepted = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--router-param {item!r}: expected NAME=VALUE (e.g. seed=1)")
        if key not in accepted:
            valid = ", ".join(accepted) or "(none)"
            raise ValueError(
                f"--router-param {key}: {name} has no parameter {key!r}; valid: {valid}"
            )
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    return out
