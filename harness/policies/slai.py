"""SLAI: SLO-aware scheduling with per-request TBT deadlines (seed-rad-slai.md §5).

Each decode gets a *last schedulable time* ``C = e + TBT_j - δ·t̄_batch`` (Eq. 8), where
``e`` is the end of the step that produced the request's previous token, ``TBT_j`` its own
tier's TBT SLO and ``t̄_batch`` the running mean step duration. A decode is *critical* once
``now >= C``. Every step is built in this order under the token budget ``τ``, the active cap
``α`` (requests holding KV) and the decode cap ``β`` (§5.4/§5.5):

1. critical decodes, ascending ``(C, arrival)``;
2. partially prefilled requests, FIFO, non-preemptive, chunk = what the budget leaves;
3. new prefills, FCFS or shortest-prompt-first (optionally paid tier first), head-of-line:
   stop at the first that does not fit ``α`` or the KV for its *full* prompt (1% watermark);
4. non-critical decodes, ascending ``C``, while budget and ``β`` allow.

Decisions on the spec's ambiguities (seed-rad-slai.md §7):

* #1 ``δ`` is dimensionless (multiples of ``t̄_batch``). #2 ``t̄_batch``: cumulative mean of
  all step durations (``batch_mean="cumulative"``, the code's) or an EMA (``"ema"``).
* #3 ``C`` is computed once per decode, at the first step after its previous token, with the
  ``δ`` and ``t̄_batch`` of that moment, and not recomputed while the decode is deferred.
* #4 the first decode's ``e`` is the end of the final prefill chunk (the host's
  ``last_token_s``). #5 critical decodes are capped by ``τ`` and ``β`` too; the ones dropped
  are counted in ``critical_dropped``. #6 ties by arrival; tiers only enter through ``TBT_j``.
* #7 KV pressure: the host preempts from the end of the run order, i.e. non-critical decodes
  first, then partial prefills, never a critical decode while another victim exists (the
  code preempts the newest paused prefill first; a small, documented difference).
* #8 ``α`` counts every request holding KV. #9 dynamic ``δ``: ``offset_high`` when the KV
  block usage is ``>= memory_limit`` (0.96), else ``offset_low``. #10 SPF keys on the full
  prompt of not-yet-started requests; started prefills keep their place. #12 chunks are
  Sarathi-style greedy fill (no tiling). #20 output lengths are never read.
* A request without a TBT SLO uses ``default_tbt_s`` (0.2 s, the code's default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from harness.policies.base import (
    BasePolicy,
    Plan,
    RequestView,
    StepReport,
    View,
    blocks_for,
    prefill_remaining,
    remaining_tokens,
)
from harness.policies.common import SortedWaiting, split_running
from harness.policies.registry import register

_LST_ARRIVAL = itemgetter(0, 1)  # sort (lst, arrival, request) by (lst, arrival)


@register("slai")
class SLAIPolicy(BasePolicy):
    """SLO-Aware LLM Inference scheduler (seed-rad-slai.md §5.5)."""

    def __init__(
        self,
        *,
        prefill_order: str = "spf",
        tier_priority: bool = False,
        offset: float = 10.0,
        dynamic_offset: bool = True,
        offset_low: float = 5.0,
        offset_high: float = 10.0,
        memory_limit: float = 0.96,
        token_budget: int | None = 512,
        max_active: int | None = 128,
        max_decodes: int | None = 128,
        watermark: float = 0.01,
        default_tbt_s: float = 0.2,
        batch_mean: str = "cumulative",
        ema_alpha: float = 0.05,
    ) -> None:
        if prefill_order not in ("fcfs", "spf"):
            raise ValueError("slai: prefill_order must be 'fcfs' or 'spf'")
        if batch_mean not in ("cumulative", "ema"):
            raise ValueError("slai: batch_mean must be 'cumulative' or 'ema'")
        self.prefill_order = prefill_order
        self.tier_priority = bool(tier_priority)
        self.offset = float(offset)
        self.dynamic_offset = bool(dynamic_offset)
        self.offset_low = float(offset_low)
        self.offset_high = float(offset_high)
        self.memory_limit = float(memory_limit)
        self.token_budget = token_budget
        self.max_active = max_active
        self.max_decodes = max_decodes
        self.watermark = float(watermark)
        self.default_tbt_s = float(default_tbt_s)
        self.batch_mean = batch_mean
        self.ema_alpha = float(ema_alpha)
        # telemetry (the code logs these per batch)
        self.critical_total = 0
        self.noncritical_total = 0
        self.deferred_total = 0
        self.critical_dropped = 0
        self._mean_dur = 0.0
        self._nb = 0
        self._lst: dict[str, tuple[float | None, float]] = {}
        self._adm: dict[str, int] = {}
        self._seq = 0
        # the prefill queue in its order, kept by the hooks (no per-step sort, issue 13)
        self._wq: SortedWaiting | None = None
        if prefill_order == "spf" and self.tier_priority:
            self._wq = SortedWaiting(lambda r: (r.priority, r.num_prompt_tokens), host_order=True)
        elif prefill_order == "spf":
            self._wq = SortedWaiting(lambda r: r.num_prompt_tokens, host_order=True)
        elif self.tier_priority:
            self._wq = SortedWaiting(lambda r: r.priority, host_order=True)

    # -- deadlines ---------------------------------------------------------------------
    @property
    def mean_batch_s(self) -> float:
        """``t̄_batch``: the running mean step duration (0 before the first step)."""
        return self._mean_dur

    def current_offset(self, view: View) -> float:
        """``δ`` now: fixed, or by KV block usage (§5.3, #9)."""
        if not self.dynamic_offset:
            return self.offset
        return self.offset_high if view.kv.usage >= self.memory_limit else self.offset_low

    def lst(self, r: RequestView, view: View) -> float:
        """Eq. (8) for the request's next decode, computed once per produced token (#3)."""
        e = r.last_token_s
        cached = self._lst.get(r.request_id)
        if cached is not None and cached[0] == e:
            return cached[1]
        tbt = r.tbt_slo_s if r.tbt_slo_s is not None else self.default_tbt_s
        base = e if e is not None else view.now
        value = base + tbt - self.current_offset(view) * self._mean_dur
        self._lst[r.request_id] = (e, value)
        return value

    def _keyed(self, decodes: list[RequestView], view: View) -> list[tuple[float, float, Any]]:
        """``(lst, arrival, r)`` per decode: :meth:`lst` inlined (it runs per decode per step)."""
        cache = self._lst
        now = view.now
        shift = None  # δ·t̄_batch, the same for every request of this step
        out = []
        for r in decodes:
            e = r.last_token_s
            rid = r.request_id
            cached = cache.get(rid)
            if cached is not None and cached[0] == e:
                value = cached[1]
            else:
                if shift is None:
                    shift = self.current_offset(view) * self._mean_dur
                tbt = r.tbt_slo_s if r.tbt_slo_s is not None else self.default_tbt_s
                value = (e if e is not None else now) + tbt - shift
                cache[rid] = (e, value)
            out.append((value, r.arrival_s, r))
        return out

    # -- planning ------------------------------------------------------------------------
    def schedule(self, view: View) -> Plan:
        budget = view.token_budget
        if self.token_budget is not None:
            budget = min(budget, self.token_budget)
        alpha = (
            view.max_num_seqs
            if self.max_active is None
            else min(self.max_active, view.max_num_seqs)
        )
        beta = alpha if self.max_decodes is None else self.max_decodes
        bs = view.kv.block_size
        free = view.kv.free_blocks
        reserve = math.ceil(self.watermark * view.kv.total_blocks)

        # one pass: a running request that is not decoding has prefill left (base.py)
        decodes, prefilling = split_running(view.running)
        keyed = self._keyed(decodes, view)
        keyed.sort(key=_LST_ARRIVAL)
        now = view.now
        critical = [t[2] for t in keyed if t[0] <= now]
        noncritical = [t[2] for t in keyed if t[0] > now]
        adm = self._adm
        partial = sorted(prefilling, key=lambda r: (adm.get(r.request_id, -1), r.arrival_s))
        if not view.waiting and not partial and len(decodes) <= min(budget, beta):
            # Light load: every decode runs every step, as in Sarathi (work-conserving).
            self.noncritical_total += len(noncritical)
            self.critical_total += len(critical)
            run = [(r.request_id, 1) for r in critical + noncritical]
            return Plan(run=run, steady=bool(run))

        def grow(r: RequestView, n: int) -> int:
            return blocks_for(r.num_computed_tokens + n, bs) - blocks_for(r.num_computed_tokens, bs)

        run: list[tuple[str, int]] = []
        tokens = 0
        ndec = 0
        for i, r in enumerate(critical):  # (1)+(2)
            if tokens >= budget or ndec >= beta:
                self.critical_dropped += len(critical) - i
                break
            run.append((r.request_id, 1))
            tokens += 1
            ndec += 1
            free -= grow(r, 1)
        self.critical_total += ndec
        for r in partial:  # (3a)
            if tokens >= budget:
                break
            c = min(prefill_remaining(r), budget - tokens)
            run.append((r.request_id, c))
            tokens += c
            free -= grow(r, c)
        admit: list[tuple[str, int]] = []
        active = len(view.running)
        for r in self._prefill_queue(view):  # (3b), head-of-line
            if tokens >= budget or active >= alpha:
                break
            need = blocks_for(r.num_tokens, bs)
            if free - need < reserve:
                break
            c = min(remaining_tokens(r), budget - tokens)
            admit.append((r.request_id, c))
            tokens += c
            active += 1
            free -= need
        ncrit = ndec
        for r in noncritical:  # (4)
            if tokens >= budget or ndec >= beta:
                break
            run.append((r.request_id, 1))
            tokens += 1
            ndec += 1
        self.noncritical_total += ndec - ncrit
        self.deferred_total += len(noncritical) - (ndec - ncrit)
        return Plan(run=run, admit=admit)

    def _prefill_queue(self, view: View) -> Iterable[RequestView]:
        """Waiting requests in prefill order: FCFS (host order) or SPF, optionally paid first
        (a stable sort of the host's queue; kept incrementally, read lazily: head-of-line)."""
        if self._wq is None:
            return view.waiting
        self._wq.sync(view)
        return self._wq.iter()

    def on_arrival(self, request: RequestView, now: float) -> None:
        if self._wq is not None:
            self._wq.add(request)

    def on_step(self, report: StepReport) -> None:
        k = report.num_steps
        if k <= 0:  # a preemption-only step ran nothing
            self._forget(report)
            return
        if self.batch_mean == "cumulative":
            self._mean_dur = (self._mean_dur * self._nb + report.duration_s) / (self._nb + k)
        else:
            d = report.duration_s / k
            if self._nb == 0:
                self._mean_dur = d
            else:
                self._mean_dur = d + (self._mean_dur - d) * (1.0 - self.ema_alpha) ** k
        self._nb += k
        self._forget(report)

    def _forget(self, report: StepReport) -> None:
        if self._wq is not None:
            self._wq.on_step(report)
        for rid in report.admitted:
            self._seq += 1
            self._adm[rid] = self._seq
        for rid in report.finished:
            self._lst.pop(rid, None)
            self._adm.pop(rid, None)
        for rid in report.preempted:
            self._adm.pop(rid, None)

    def params(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_") and not k.endswith(("_total", "_dropped"))
        }
