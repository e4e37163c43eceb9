"""What the vLLM and SGLang hosts share, none of it engine-specific:

- :class:`HostRequestView`, the engine-independent part of a request view: the request's tags
  (tier, SLOs, length hint; ``request_tags``) resolved once from whatever dict carries them,
  its priority, and the token times the host sets after each step. ``adapters.vllm.view`` and
  ``adapters.sglang.view`` add the live token accounting read from their engine's request.
- :class:`StepTally`, a step's composition counted when it is scheduled, turned into the
  policy's :class:`~harness.policies.base.StepReport` once the step's outputs are in;
- :func:`idle_wait_s`, how long a host whose policy holds every request back waits before
  asking again (both engines' loops would otherwise spin a core while work waits).

Nothing here imports an engine, so both adapters' venvs (and the harness's) can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.policies.base import StepReport
from harness.workload.tiers import request_tags

IDLE_WAIT_MIN_S = 1e-3
IDLE_WAIT_MAX_S = 20e-3


def idle_wait_s(last_step_s: float | None) -> float:
    """How long a held-back engine waits before re-asking the policy: one step's worth of
    time, so a threshold policy sees arrivals within about a step, without busy-spinning."""
    return min(max(last_step_s or 0.0, IDLE_WAIT_MIN_S), IDLE_WAIT_MAX_S)


class HostRequestView:
    """Static fields of a live request view; subclasses supply the token counts."""

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

    def __init__(
        self, req: Any, request_id: str, arrival_s: float, tags: Mapping[str, Any]
    ) -> None:
        self._req = req
        self.request_id: str = request_id
        self.arrival_s: float = float(arrival_s)
        t = request_tags(tags)
        self.tier: str = t.tier
        self.ttft_slo_s: float | None = t.ttft_slo_s
        self.tbt_slo_s: float | None = t.tbt_slo_s
        self.priority: int = int(getattr(req, "priority", 0) or 0)
        self.predicted_output_len: int | None = t.predicted_output_len
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None

    def saw_token(self, t_s: float) -> None:
        """The request produced output in the step that ended at ``t_s``."""
        if self.first_token_s is None:
            self.first_token_s = t_s
        self.last_token_s = t_s

    @property
    def request(self) -> Any:
        """The wrapped engine request (hosts only; policies must not touch it)."""
        return self._req

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"{type(self).__name__}({self.request_id!r}, tier={self.tier},"
            f" prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/{self.max_tokens},"
            f" computed={self.num_computed_tokens})"
        )


@dataclass(slots=True)
class StepTally:
    """A scheduled step's composition (host-clock start, prefill/decode tokens and sequences,
    admissions, preemptions); each host extends it with what it needs to find the outputs."""

    start_s: float
    prefill_tokens: int
    decode_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]

    def report(self, end_s: float, kv_used_blocks: int, finished: tuple[str, ...]) -> StepReport:
        """The policy's report of this one step, ended at ``end_s``."""
        return StepReport(
            start_s=self.start_s,
            duration_s=max(0.0, end_s - self.start_s),
            num_steps=1,
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            num_prefill_seqs=self.num_prefill_seqs,
            num_decode_seqs=self.num_decode_seqs,
            kv_used_blocks=kv_used_blocks,
            preempted=self.preempted,
            admitted=self.admitted,
            finished=finished,
        )
