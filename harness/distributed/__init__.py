"""Past one machine the harness runs on Ray (design.md), an optional extra: ``[ray]``.

Nothing here imports ray at module import time; :func:`require_ray` does, and turns its
absence into one ``error:`` line naming the extra. :mod:`.pool` fans independent runs
(simulations, sweep points) out as Ray tasks; :mod:`.loadgen` places load-generator shards
as Ray actors on several hosts.
"""

from __future__ import annotations

from typing import Any

from harness.cli.errors import HarnessError

EXTRA_HINT = "pip install 'llm-harness[ray]'"


def require_ray() -> Any:
    """The ``ray`` module, or HarnessError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise HarnessError(f"--ray needs the optional 'ray' extra: {EXTRA_HINT}") from None
    return ray


def connect(address: str) -> Any:
    """Join the Ray cluster at ``address`` (``auto``: the running one if any, else a new
    local instance on this machine). Idempotent; returns the ray module."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address == "auto":
        try:
            ray.init(address="auto", **kw)
        except (ConnectionError, RuntimeError):
            ray.init(**kw)  # no cluster running: a local one
    else:
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HarnessError(f"--ray {address}: cannot join the Ray cluster: {exc}") from None
    return ray
