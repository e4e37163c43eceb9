"""The ``sglang.srt.plugins`` entry point: install the harness host into SGLang's scheduler.

sglang 0.5.23 ships ``sglang/srt/plugins/hook_registry.py`` (anchors-engines.md §3.3, open
item §7.4: verified in the wheel), so no subclass or monkey-patch of our own is needed:
:func:`register` registers three ``HookType.AROUND`` hooks on
``sglang.srt.managers.scheduler.Scheduler`` and ``load_plugins()`` applies them in every
scheduler process before the scheduler is built:

- ``get_new_batch_prefill``: the policy decides admission (``host.SGLangHost.around_prefill``);
- ``get_next_batch_to_run``: step reports for the policy (``around_next_batch``);
- ``_add_request_to_queue``: ``Policy.on_arrival`` for each new request.

The host lives on the scheduler object (one per scheduler process, created on first use).
Start-up refuses overlap scheduling (``--disable-overlap-schedule`` is required: with overlap,
step k+1 is chosen before step k's tokens are processed, so the policy would plan on stale
counts; the same reason the vLLM adapter needs ``--no-async-scheduling``) and an unpinned
SGLang version (``HARNESS_SGLANG_ANY_VERSION=1`` overrides). ``HARNESS_POLICY=stock``
registers nothing, so the same container runs SGLang's own scheduler as the baseline.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from adapters.sglang import SUPPORTED_SGLANG_VERSION
from adapters.sglang.host import SGLangHost
from adapters.vllm.config import build_policy, resolve_policy

logger = logging.getLogger("harness.adapters.sglang")

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
STOCK = "stock"  # HARNESS_POLICY=stock: load no hooks (SGLang's own scheduler, for baselines)
HOOKED = ("get_new_batch_prefill", "get_next_batch_to_run", "_add_request_to_queue")


def check_version(version: str) -> None:
    """Refuse an SGLang other than the pinned one (private methods are hooked)."""
    if version != SUPPORTED_SGLANG_VERSION and os.environ.get("HARNESS_SGLANG_ANY_VERSION") != "1":
        raise RuntimeError(
            f"adapters.sglang supports SGLang {SUPPORTED_SGLANG_VERSION}, found {version} "
            "(set HARNESS_SGLANG_ANY_VERSION=1 to try anyway)"
        )


def host_of(sched: Any) -> SGLangHost:
    """The scheduler's host, created (policy resolved from the environment) on first use."""
    host = getattr(sched, "_harness_host", None)
    if host is None:
        if getattr(sched, "enable_overlap", False):
            raise RuntimeError(
                "adapters.sglang needs the normal event loop: start SGLang with "
                "--disable-overlap-schedule"
            )
        sp = getattr(getattr(sched, "policy", None), "enable_priority_scheduling", False)
        if sp:
            logger.warning(
                "adapters.sglang: --enable-priority-scheduling re-sorts the admit list; "
                "ordering is the harness policy's job, leave it off"
            )
        choice = resolve_policy(None)
        host = SGLangHost(build_policy(choice))
        sched._harness_host = host
        logger.warning(
            "adapters.sglang: policy %r params %s (from %s)",
            choice.name,
            choice.params,
            choice.source,
        )
    return host


def _around_prefill(orig: Any, sched: Any, running_batch: Any, *a: Any, **kw: Any) -> Any:
    if a or kw:  # a signature this adapter does not know: do not guess
        return orig(sched, running_batch, *a, **kw)
    return host_of(sched).around_prefill(orig, sched, running_batch)


def _around_next_batch(orig: Any, sched: Any, *a: Any, **kw: Any) -> Any:
    return host_of(sched).around_next_batch(orig, sched, *a, **kw)


def _around_add(orig: Any, sched: Any, req: Any, *a: Any, **kw: Any) -> Any:
    out = orig(sched, req, *a, **kw)
    queue = getattr(sched, "waiting_queue", None)
    if queue and queue[-1] is req:  # queued, not refused (priority/queue-limit aborts)
        retracted = bool(kw.get("is_retracted", a[0] if a else False))
        host_of(sched).on_add(req, is_retracted=retracted)
    return out


def register() -> None:
    """Entry point (``sglang.srt.plugins`` group, name ``harness``)."""
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if os.environ.get("HARNESS_POLICY") == STOCK:
        logger.warning("adapters.sglang: HARNESS_POLICY=stock, SGLang's own scheduler runs")
        return
    check_version(sglang.__version__)
    hooks = (_around_prefill, _around_next_batch, _around_add)
    for name, hook in zip(HOOKED, hooks, strict=True):
        HookRegistry.register(f"{SCHEDULER}.{name}", hook, HookType.AROUND)
