"""SGLang ``Req`` objects seen through the harness :class:`RequestView` protocol.

The wrapper reads the live request (no copies), mapping sglang 0.5.23's fields
(``managers/schedule_batch.py`` ``Req``) onto the contract's vLLM-style accounting
(``harness/policies/base.py``):

- ``num_prompt_tokens`` = ``len(req.origin_input_ids)``; ``num_output_tokens`` =
  ``len(req.output_ids)``;
- ``num_computed_tokens`` = ``req.kv.kv_committed_len`` ("KV content committed up to here"),
  which SGLang resets to 0 on retraction (``Req.reset_for_retract``), i.e. recompute
  preemption as in the contract; a decoding request shows exactly one remaining token;
- ``max_tokens`` = ``sampling_params.max_new_tokens`` (SGLang's default 128 when unset);
- tier and SLOs from ``sampling_params.custom_params`` (anchors-engines.md §3.4: the dict
  survives IPC to the scheduler), ``priority`` from the request (sent with vLLM's polarity by
  the harness, lower = more important), preemptions from ``req.retraction_count``.

Nothing here imports SGLang, so it is testable with stand-ins as well as with real ``Req``s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.workload.tiers import request_tags

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # sglang SamplingParams default


def custom_params(req: Any) -> Mapping[str, Any]:
    """The request's ``sampling_params.custom_params`` (tier carrier), or an empty mapping."""
    sp = getattr(req, "sampling_params", None)
    cp = getattr(sp, "custom_params", None) if sp is not None else None
    return cp if isinstance(cp, Mapping) else {}


class SglRequestView:
    """A live, read-only :class:`~harness.policies.base.RequestView` over an SGLang ``Req``.

    ``arrival_s`` is the host clock when the scheduler queued the request; ``first_token_s``
    and ``last_token_s`` are set by the host after each step.
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
    )

    def __init__(self, req: Any, arrival_s: float) -> None:
        self._req = req
        self.request_id: str = str(req.rid)
        self.arrival_s: float = float(arrival_s)
        cp = custom_params(req)
        tags = request_tags(cp)
        self.tier: str = tags.tier
        self.ttft_slo_s: float | None = tags.ttft_slo_s
        self.tbt_slo_s: float | None = tags.tbt_slo_s
        self.priority: int = int(getattr(req, "priority", 0) or 0)
        self.predicted_output_len: int | None = tags.predicted_output_len
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None

    @property
    def request(self) -> Any:
        """The wrapped SGLang request (hosts only; policies must not touch it)."""
        return self._req

    @property
    def num_prompt_tokens(self) -> int:
        return len(self._req.origin_input_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._req.output_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_computed_tokens(self) -> int:
        kv = getattr(self._req, "kv", None)
        n = int(getattr(kv, "kv_committed_len", 0) or 0)
        return min(n, self.num_tokens)

    @property
    def max_tokens(self) -> int:
        m = getattr(self._req.sampling_params, "max_new_tokens", None)
        return int(m) if m is not None else SGLANG_DEFAULT_MAX_NEW_TOKENS

    @property
    def num_preemptions(self) -> int:
        return int(getattr(self._req, "retraction_count", 0) or 0)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"SglRequestView({self.request_id!r}, tier={self.tier},"
            f" prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/{self.max_tokens},"
            f" computed={self.num_computed_tokens})"
        )
