"""One registry of scheduling policies, keyed by name (a new policy costs one file + one import)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from harness.policies.base import Policy

_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


class UnknownPolicyError(ValueError):
    """Raised for a policy name nobody registered; the message lists the known ones."""


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make a policy available by ``name``. Duplicate names are a bug."""

    def deco(cls: T) -> T:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return deco


def available() -> list[str]:
    """Names of all registered policies, sorted."""
    import harness.policies  # noqa: F401  (imports every built-in module)

    return sorted(_REGISTRY)


def policy_class(name: str) -> type:
    """The class registered under ``name``."""
    names = available()
    if name not in _REGISTRY:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose from: {', '.join(names)}")
    return _REGISTRY[name]


def make_policy(name: str, **params: Any) -> Policy:
    """Instantiate a registered policy with keyword parameters."""
    return policy_class(name)(**params)
