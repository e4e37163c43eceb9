"""vLLM ``Request`` objects seen through the harness :class:`RequestView` protocol.

The wrapper reads the live vLLM request (no copies), so the policy always sees the engine's
own token accounting (anchors-engines.md §1.4, §1.7): ``num_prompt_tokens``,
``num_output_tokens``, ``num_computed_tokens`` (0 after a recompute preemption) and
``max_tokens``. With prefix caching on, a waiting request's cached prompt prefix counts as
computed, as vLLM counts it the moment it schedules the request (``Scheduler.schedule``:
``num_computed_tokens`` = the prefix-cache hit from ``KVCacheManager.get_computed_blocks``,
capped at prompt - 1 so the last token is recomputed for logits); the scheduler refreshes
:attr:`VllmRequestView.cached_tokens` each step, since hits come and go with other requests.
Tier and SLOs come from the request's ``vllm_xargs`` (which vLLM hands to the scheduler as
``sampling_params.extra_args``, §1.9) and ``priority`` from the request body.
Times are host-clock seconds: ``time.time()`` minus the scheduler's origin, because vLLM
stamps ``arrival_time`` with ``time.time()`` in the API-server process.

Nothing here imports vLLM, so it is testable with stand-in objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.host_base import HostRequestView


def request_xargs(request: Any) -> Mapping[str, Any]:
    """The request's ``vllm_xargs`` (``sampling_params.extra_args``), or an empty mapping."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    return extra if isinstance(extra, Mapping) else {}


class VllmRequestView(HostRequestView):
    """A live, read-only :class:`~harness.policies.base.RequestView` over a vLLM request.

    Static fields (tier, SLOs, arrival) are resolved once; token counts are read through.
    ``first_token_s`` / ``last_token_s`` are set by the host after each step.
    """

    # when the engine core received it (arrival_s is the API server's stamp; the gap is
    # vLLM's front end: processing plus the hop to the engine process); ready_s: when the
    # engine core's input thread handed it to the loop (scheduler.stamp_ready_times)
    __slots__ = ("engine_arrival_s", "ready_s", "cached_tokens")

    def __init__(self, request: Any, origin: float) -> None:
        arrival_s = float(request.arrival_time) - origin
        super().__init__(request, request.request_id, arrival_s, request_xargs(request))
        self.engine_arrival_s: float | None = None
        self.ready_s: float | None = None
        # prefix-cache hit of a request not yet scheduled (set by the host each step)
        self.cached_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._req.num_prompt_tokens)

    @property
    def num_output_tokens(self) -> int:
        return int(self._req.num_output_tokens)

    @property
    def num_computed_tokens(self) -> int:
        n = int(self._req.num_computed_tokens)
        return n if n > 0 else min(self.cached_tokens, self.num_tokens - 1)

    @property
    def max_tokens(self) -> int:
        return int(self._req.max_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(getattr(self._req, "num_preemptions", 0))
