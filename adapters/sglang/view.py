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

from adapters.host_base import HostRequestView

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # sglang SamplingParams default


def custom_params(req: Any) -> Mapping[str, Any]:
    """The request's ``sampling_params.custom_params`` (tier carrier), or an empty mapping."""
    sp = getattr(req, "sampling_params", None)
    cp = getattr(sp, "custom_params", None) if sp is not None else None
    return cp if isinstance(cp, Mapping) else {}


class SglRequestView(HostRequestView):
    """A live, read-only :class:`~harness.policies.base.RequestView` over an SGLang ``Req``.

    ``arrival_s`` is the host clock when the scheduler queued the request; ``first_token_s``
    and ``last_token_s`` are set by the host after each step.
    """

    __slots__ = ()

    def __init__(self, req: Any, arrival_s: float) -> None:
        super().__init__(req, str(req.rid), arrival_s, custom_params(req))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self._req.origin_input_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._req.output_ids)

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
