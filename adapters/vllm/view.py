"""vLLM ``Request`` objects seen through the harness :class:`RequestView` protocol.

The wrapper reads the live vLLM request (no copies), so the policy always sees the engine's
own token accounting (anchors-engines.md §1.4, §1.7): ``num_prompt_tokens``,
``num_output_tokens``, ``num_computed_tokens`` (0 after a recompute preemption) and
``max_tokens``. Tier and SLOs come from the request's ``vllm_xargs`` (which vLLM hands to the
scheduler as ``sampling_params.extra_args``, §1.9) and ``priority`` from the request body.
Times are host-clock seconds: ``time.time()`` minus the scheduler's origin, because vLLM
stamps ``arrival_time`` with ``time.time()`` in the API-server process.

Nothing here imports vLLM, so it is testable with stand-in objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.workload.tiers import request_tags


def request_xargs(request: Any) -> Mapping[str, Any]:
    """The request's ``vllm_xargs`` (``sampling_params.extra_args``), or an empty mapping."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    return extra if isinstance(extra, Mapping) else {}


class VllmRequestView:
    """A live, read-only :class:`~harness.policies.base.RequestView` over a vLLM request.

    Static fields (tier, SLOs, arrival) are resolved once; token counts are read through.
    ``first_token_s`` / ``last_token_s`` are set by the host after each step.
    """

    __slots__ = (
        "_req",
        "request_id",
        "arrival_s",
        "tier",
        "priority",
        "ttft_slo_s",
        "tbt_slo_s",
        "predicted_output_len",
        "first_token_s",
        "last_token_s",
        "engine_arrival_s",
    )

    def __init__(self, request: Any, origin: float) -> None:
        self._req = request
        self.request_id: str = request.request_id
        self.arrival_s: float = float(request.arrival_time) - origin
        xa = request_xargs(request)
        tags = request_tags(xa)
        self.tier: str = tags.tier
        self.ttft_slo_s: float | None = tags.ttft_slo_s
        self.tbt_slo_s: float | None = tags.tbt_slo_s
        self.priority: int = int(getattr(request, "priority", 0) or 0)
        self.predicted_output_len: int | None = tags.predicted_output_len
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        # when the engine core received it (arrival_s is the API server's stamp; the gap is
        # vLLM's front end: processing plus the hop to the engine process)
        self.engine_arrival_s: float | None = None

    @property
    def request(self) -> Any:
        """The wrapped vLLM request (hosts only; policies must not touch it)."""
        return self._req

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._req.num_prompt_tokens)

    @property
    def num_output_tokens(self) -> int:
        return int(self._req.num_output_tokens)

    @property
    def num_computed_tokens(self) -> int:
        return int(self._req.num_computed_tokens)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def max_tokens(self) -> int:
        return int(self._req.max_tokens)

    @property
    def num_preemptions(self) -> int:
        return int(getattr(self._req, "num_preemptions", 0))

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"VllmRequestView({self.request_id!r}, tier={self.tier},"
            f" prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/{self.max_tokens},"
            f" computed={self.num_computed_tokens})"
        )
