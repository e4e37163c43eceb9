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
* It plans from the running set's columns (policies/columns.py), so the vectorised kernel
  runs it: deadlines are cached per request key (``RunningColumns.key``), and partial
  prefills are taken in running order, which is admission order on every host (admissions
  join the end of the running set).
* Every plan whose requests (running and admitted) fit ``τ`` and ``β`` promises
  ``then_steady`` (base.Plan): with nothing waiting and every request decoding, the plan is
  the light-load one whatever the deadlines, so a simulator runs it without asking. The
  per-plan tallies ``critical_total`` / ``noncritical_total`` then count the plans SLAI
  made, as under a steady run's fast-forward already; ``deferred_total`` and
  ``critical_dropped`` are unchanged (a light-load plan defers and drops nothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from harness.policies import planops
from harness.policies.base import (
    RequestView,
    StepReport,
    View,
    blocks_for,
)
from harness.policies.columns import (
    ColumnPlan,
    ColumnPolicy,
    ColumnView,
    per_key,
    prefill_chunks,
)
from harness.policies.common import SortedWaiting
from harness.policies.registry import register


@register("slai")
class SLAIPolicy(ColumnPolicy):
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
        # Eq. 8's cache per request key (RunningColumns.key): the token time it was computed
        # for (NaN: never) and its value (#3)
        self._lst_e = np.full(0, np.nan)
        self._lst_v = np.zeros(0)
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

    def current_offset(self, view: View | ColumnView) -> float:
        """``δ`` now: fixed, or by KV block usage (§5.3, #9)."""
        if not self.dynamic_offset:
            return self.offset
        return self.offset_high if view.kv.usage >= self.memory_limit else self.offset_low

    def lsts(self, cv: ColumnView, positions: np.ndarray) -> np.ndarray:
        """Eq. (8) for the next decode of the running requests at ``positions``: ``e + TBT_j
        - δ·t̄_batch``, computed once per produced token with the δ and t̄ of that moment
        (#3), from the per-key cache; ``e`` is the last token's time (#4: the final prefill
        chunk's end), ``TBT_j`` the request's SLO or ``default_tbt_s``."""
        return self._deadlines(cv, positions, every=False)[0]

    def _deadlines(
        self, cv: ColumnView, positions: np.ndarray, *, every: bool
    ) -> tuple[np.ndarray, int]:
        """:meth:`lsts` and how many of them are critical now (``C <= now``); ``every``: the
        positions are every running request in running order (no gather)."""
        rc = cv.running
        self._grow(cv.num_keys)
        out = np.empty(len(positions))
        critical = planops.deadlines(
            rc.key,
            rc.last,
            rc.tbt,
            None if every else positions,
            self._lst_e,
            self._lst_v,
            self.default_tbt_s,
            self.current_offset(cv) * self._mean_dur,
            cv.now,
            out,
        )
        return out, critical

    def lst(self, r: RequestView, view: View) -> float:
        """:meth:`lsts` for one request on an object host."""
        keys = self.request_keys()
        k = keys.key(r.request_id)  # may name it: the cache grows after
        self._grow(keys.next)
        out = np.empty(1)
        planops.deadlines(
            np.array([k]),
            np.array([math.nan if r.last_token_s is None else r.last_token_s]),
            np.array([math.nan if r.tbt_slo_s is None else r.tbt_slo_s]),
            None,
            self._lst_e,
            self._lst_v,
            self.default_tbt_s,
            self.current_offset(view) * self._mean_dur,
            view.now,
            out,
        )
        return float(out[0])

    def _grow(self, num_keys: int) -> None:
        """Room in Eq. 8's per-key cache for keys below ``num_keys``."""
        if num_keys > len(self._lst_e):
            self._lst_e = per_key(self._lst_e, num_keys, math.nan)
            self._lst_v = per_key(self._lst_v, num_keys, 0.0)

    # -- planning ------------------------------------------------------------------------
    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        budget = cv.token_budget
        if self.token_budget is not None:
            budget = min(budget, self.token_budget)
        alpha = (
            cv.max_num_seqs if self.max_active is None else min(self.max_active, cv.max_num_seqs)
        )
        beta = alpha if self.max_decodes is None else self.max_decodes
        bs = cv.kv.block_size
        rc = cv.running

        # a running request that is not decoding has prefill (or recompute) left (base.py);
        # the partial prefills in admission order = running order (#10: they keep it)
        decodes, partial = rc.split()
        nd = len(decodes)
        lst, ncrit = decodes, 0  # Eq. 8 every plan (#3's moment); critical: C <= now
        if nd:
            lst, ncrit = self._deadlines(cv, decodes, every=nd == len(rc))
        if not cv.num_waiting and not len(partial) and nd <= min(budget, beta):
            # Light load: every decode runs every step, as in Sarathi (work-conserving)
            self.noncritical_total += nd - ncrit
            self.critical_total += ncrit
            order = self._every_decode_order(cv, decodes, lst)
            return ColumnPlan(order, 1, steady=nd > 0, then_steady=nd > 0)

        # (1)+(2) critical decodes, capped by τ and β (#5): one token each
        nc = min(ncrit, budget, beta)
        self.critical_dropped += ncrit - nc
        self.critical_total += nc
        # (3a) partial prefills, FIFO, chunk = what the budget leaves
        got: np.ndarray | int
        if len(partial) == 1 and budget > nc:  # the usual case, in scalars
            p = int(partial[0])
            got = min(int(rc.prompt[p] + rc.output[p] - rc.computed[p]), budget - nc)
            part, tokens = partial, nc + got
        else:
            part, got, left = prefill_chunks(rc, partial, budget - nc)
            tokens = budget - left
        # (3b) new prefills in prefill order, head-of-line: α and the full prompt's KV
        admit: list[tuple[RequestView, int]] = []
        active = len(rc)
        if cv.num_waiting and tokens < budget and active < alpha:
            # the KV left after the critical decodes' and the partial prefills' blocks: first
            # as if every critical decode opened a block; which of them do (those at a block
            # boundary) is counted only if an admission would not fit otherwise
            free = cv.kv.free_blocks - nc
            unsure = nc > 0
            if isinstance(got, int):  # the one partial prefill (above): in scalars
                c0 = int(rc.computed[part[0]])
                free -= (c0 + got + bs - 1) // bs - (c0 + bs - 1) // bs
            elif len(part):
                c0 = rc.computed[part]
                free -= int(((c0 + got + bs - 1) // bs - (c0 + bs - 1) // bs).sum())
            reserve = math.ceil(self.watermark * cv.kv.total_blocks)
            for r in self._prefill_queue(cv):
                if tokens >= budget or active >= alpha:
                    break
                # its tokens read once (each count a property on the vectorised kernel's rows)
                n_tok = r.num_prompt_tokens + r.num_output_tokens
                need = blocks_for(n_tok, bs)
                if unsure and free - need < reserve:
                    # when every critical decode runs, they are the critical set: no ranking
                    crit = (
                        decodes[lst <= cv.now]
                        if nc == ncrit
                        else planops.rank_decodes(decodes, lst, rc.arrival)[:nc]
                    )
                    free += nc - rc.decode_blocks(crit, bs)
                    unsure = False
                if free - need < reserve:
                    break
                c = min(n_tok - r.num_computed_tokens, budget - tokens)  # remaining_tokens
                admit.append((r, c))
                tokens += c
                active += 1
                free -= need
        # (4) non-critical decodes, ascending C, while τ and β allow
        nn = max(0, min(nd - ncrit, budget - tokens, beta - nc))
        self.noncritical_total += nn
        self.deferred_total += nd - ncrit - nn
        # Once nothing waits and everything running decodes, the next plan is the light-load
        # one above, whatever the deadlines say, if those requests fit τ and β: a host may
        # then run it without asking (Plan.then_steady); it also holds through finishes.
        then = active <= min(budget, beta)
        if not nc and not nn:
            return ColumnPlan(part, got, admit_requests=admit, then_steady=then)
        if not len(part) and nc + nn == nd:  # every decode runs one token, nothing else
            order = self._every_decode_order(cv, decodes, lst)
            return ColumnPlan(order, 1, admit_requests=admit, then_steady=then)
        # the decodes ranked (#6), then the critical ones, the prefills, the non-critical ones
        # that fit (one C pass)
        order = np.empty(nc + len(part) + nn, np.int64)
        tok = np.empty(len(order), np.int64)
        planops.ranked_order(decodes, lst, rc.arrival, part, got, nc, ncrit, nn, order, tok)
        return ColumnPlan(order, tok, admit_requests=admit, then_steady=then)

    def _every_decode_order(
        self, cv: ColumnView, decodes: np.ndarray, lst: np.ndarray
    ) -> np.ndarray | None:
        """The run order of a plan in which every decode runs one token and nothing else:
        running order (None, the host's all-decode path) when their next blocks fit, since
        rule 2 then clips and preempts nothing and the order cannot matter; else ranked, so
        the host preempts from the non-critical tail."""
        rc = cv.running
        if rc.decodes_fit(decodes, cv.kv.block_size, cv.kv.free_blocks):
            return None
        return planops.rank_decodes(decodes, lst, rc.arrival)  # (C, arrival), stable (#6)

    def _prefill_queue(self, cv: ColumnView) -> Iterable[RequestView]:
        """Waiting requests in prefill order: FCFS (host order) or SPF, optionally paid first
        (a stable sort of the host's queue; kept incrementally, read lazily: head-of-line)."""
        if self._wq is None:
            return cv.waiting
        self._wq.sync(cv)
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

    def params(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_") and not k.endswith(("_total", "_dropped"))
        }
