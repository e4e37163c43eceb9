"""The per-step host logic that lets a harness policy drive SGLang's scheduler.

SGLang's loop (sglang 0.5.23 ``managers/scheduler.py`` ``event_loop_normal``;
anchors-engines.md §3.1) is prefill-first: ``get_next_batch_to_run`` merges the last prefill
into the running batch, asks ``get_new_batch_prefill`` for a prefill batch built by
``PrefillAdder`` from ``waiting_queue``, and only when that returns no batch decodes every
running request (``update_running_batch``, which retracts requests when KV is short).

The host wraps two methods (plugin.py installs the wraps as ``HookType.AROUND`` hooks):

- :meth:`SGLangHost.around_prefill` (``get_new_batch_prefill``): builds the policy's
  :class:`~harness.policies.base.View` from ``waiting_queue``, the running batch and the KV
  pool, asks the policy for a :class:`~harness.policies.base.Plan`, and makes SGLang's own
  ``PrefillAdder`` see *only* ``plan.admit``, in plan order, for this call (base.py rule 3:
  admission in order, head-of-line, within SGLang's budget and KV checks). An empty admit list
  means "no prefill this step", so the scheduler falls through to its decode step: that is how
  threshold policies (WAIT, Nested-WAIT; anchors-engines.md §3.3 sketch) hold arrivals back.
  A request SGLang is still chunk-prefilling always continues (SGLang requires it).
- :meth:`SGLangHost.around_next_batch` (``get_next_batch_to_run``): closes the previous step
  (its results are processed before the next call in the non-overlap loop) with a
  :class:`~harness.policies.base.StepReport`, and records the batch SGLang chose.

What SGLang's scheduler cannot express, and what the host does instead (documented, not
emulated): a decode step always covers every running request (no paused requests, base.py
rule 4, and ``plan.run`` order is not used); ``plan.preempt`` is not applied (SGLang retracts
on its own when decode KV runs short, reported as ``preempted``); an admitted request's first
chunk is sized by SGLang's ``--chunked-prefill-size``, not by the plan's token count.

Everything here is duck-typed on the scheduler (``waiting_queue``, ``chunked_req``,
``max_total_num_tokens``, ``page_size``, ``token_to_kv_pool_allocator``, ``tree_cache``,
``max_prefill_tokens``, ``max_running_requests``) and the batch (``reqs``, ``forward_mode``,
``extend_lens``), so it is testable without SGLang's GPU stack.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.host_base import StepTally, idle_wait_s
from adapters.sglang.view import SglRequestView
from harness.policies.base import KVView, Plan, View

logger = logging.getLogger("harness.adapters.sglang")


@dataclass(slots=True)
class _Pending(StepTally):
    """What the host remembers between choosing a batch and the next loop iteration."""

    reqs: list[Any]
    out_before: list[int]


def _default_next_batch_plan(batch_to_run: Any, running_batch: Any) -> Any:
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    return NextBatchPlan(batch_to_run=batch_to_run, running_batch=running_batch)


class SGLangHost:
    """One per scheduler process: the policy, the request views, the step bookkeeping."""

    def __init__(
        self,
        policy: Any,
        *,
        clock: Callable[[], float] = time.perf_counter,
        next_batch_plan: Callable[[Any, Any], Any] = _default_next_batch_plan,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._origin = clock()
        self._next_batch_plan = next_batch_plan
        self.views: dict[str, SglRequestView] = {}
        self._pending: _Pending | None = None
        self._last_admitted: tuple[str, ...] = ()
        self._last_step_s: float | None = None
        self.ignored_preemptions = 0
        self.steps = 0
        self.idle_waits = 0
        self._idle_sleep: Callable[[float], None] = time.sleep  # tests replace it

    def now(self) -> float:
        return self._clock() - self._origin

    # ------------------------------------------------------------------ state
    def view_of(self, req: Any) -> SglRequestView:
        v = self.views.get(req.rid)
        if v is None or v.request is not req:
            v = self.views[req.rid] = SglRequestView(req, self.now())
        return v

    def on_add(self, req: Any, is_retracted: bool = False) -> None:
        """``_add_request_to_queue`` ran: a new request (not a retracted one) arrived."""
        if is_retracted or req.rid in self.views:
            return
        view = self.view_of(req)
        self.policy.on_arrival(view, view.arrival_s)

    @staticmethod
    def kv_view(sched: Any) -> KVView:
        """KV in pages: free = allocator free + evictable radix-cache tokens
        (anchors-engines.md §7 item 5: SGLang's usage is ``1 - (available+evictable)/max``)."""
        page = int(getattr(sched, "page_size", 1) or 1)
        total_tokens = int(sched.max_total_num_tokens)
        free = int(sched.token_to_kv_pool_allocator.available_size())
        tree = getattr(sched, "tree_cache", None)
        if tree is not None and hasattr(tree, "evictable_size"):
            free += int(tree.evictable_size())
        total = total_tokens // page
        used = max(0, min(total, total - free // page))
        return KVView(block_size=page, total_blocks=total, used_blocks=used)

    def running_reqs(self, sched: Any, running_batch: Any) -> list[Any]:
        reqs = list(getattr(running_batch, "reqs", None) or [])
        chunked = getattr(sched, "chunked_req", None)
        if chunked is not None and all(r is not chunked for r in reqs):
            reqs.append(chunked)
        return [r for r in reqs if not r.finished()]

    def build_view(self, sched: Any, running_batch: Any, now: float) -> View:
        """The policy's read-only view of this step, straight from SGLang's queues."""
        budget = getattr(sched, "max_prefill_tokens", None) or getattr(
            sched, "chunked_prefill_size", None
        )
        # SGLang re-queues a retracted request at the back; the contract lists preempted
        # requests first (base.py View.waiting), so they are moved to the front here.
        waiting = [self.view_of(r) for r in sched.waiting_queue]
        waiting = [v for v in waiting if self._retracted(v)] + [
            v for v in waiting if not self._retracted(v)
        ]
        return View(
            now=now,
            waiting=waiting,
            running=[self.view_of(r) for r in self.running_reqs(sched, running_batch)],
            kv=self.kv_view(sched),
            token_budget=int(budget or 0),
            max_num_seqs=int(sched.max_running_requests),
            last_step_s=self._last_step_s,
        )

    @staticmethod
    def _retracted(v: SglRequestView) -> bool:
        return v.num_preemptions > 0 and v.num_computed_tokens == 0

    # ------------------------------------------------------------ the hooks
    def around_prefill(self, orig: Callable[..., Any], sched: Any, running_batch: Any) -> Any:
        """Wrap ``Scheduler.get_new_batch_prefill(running_batch) -> NextBatchPlan``."""
        plan: Plan = self.policy.schedule(self.build_view(sched, running_batch, self.now()))
        if plan.preempt:
            self.ignored_preemptions += len(plan.preempt)
            if self.ignored_preemptions == len(plan.preempt):
                logger.warning(
                    "SGLang host: plan.preempt is not applied (SGLang retracts on its own); "
                    "policy %r asked to preempt %d request(s)",
                    getattr(self.policy, "name", "?"),
                    len(plan.preempt),
                )
        queue = list(sched.waiting_queue)
        by_id = {r.rid: r for r in queue}
        admit: list[Any] = []
        seen: set[str] = set()
        for rid, n in plan.admit:
            r = by_id.get(rid)
            if r is not None and n > 0 and rid not in seen:
                seen.add(rid)
                admit.append(r)
        self._last_admitted = ()
        if not admit and getattr(sched, "chunked_req", None) is None:
            if queue and not self.running_reqs(sched, running_batch):
                # Held back with nothing to decode: SGLang's loop is not "fully idle" while
                # its queue holds requests (``Scheduler.is_fully_idle``), so ``on_idle`` never
                # sleeps and the loop would re-ask the policy on a spinning core; wait one
                # step's worth of time instead (as the vLLM host does).
                self.idle_waits += 1
                self._idle_sleep(idle_wait_s(self._last_step_s))
            return self._next_batch_plan(None, running_batch)  # decode (or idle) step
        sched.waiting_queue = admit
        try:
            out = orig(sched, running_batch)
        finally:
            left = list(sched.waiting_queue)
            left_ids = {id(r) for r in left}
            admit_ids = {id(r) for r in admit}
            queue_ids = {id(r) for r in queue}
            self._last_admitted = tuple(r.rid for r in admit if id(r) not in left_ids)
            # Original order minus the admitted, then anything SGLang queued meanwhile
            # (e.g. requests whose grammar became ready).
            sched.waiting_queue = [
                r for r in queue if id(r) not in admit_ids or id(r) in left_ids
            ] + [r for r in left if id(r) not in queue_ids]
        return out

    def around_next_batch(self, orig: Callable[..., Any], sched: Any, *a: Any, **kw: Any) -> Any:
        """Wrap ``Scheduler.get_next_batch_to_run``: report the last step, record the next."""
        now = self.now()
        if self._pending is not None:
            self._report(sched, self._pending, now)
            self._pending = None
        running_batch = kw.get("running_batch", a[0] if a else None)
        before = {
            id(r): (r, int(getattr(r, "retraction_count", 0) or 0))
            for r in getattr(running_batch, "reqs", None) or []
        }
        out = orig(sched, *a, **kw)
        preempted = tuple(
            r.rid for r, n in before.values() if int(getattr(r, "retraction_count", 0) or 0) > n
        )
        batch = getattr(out, "batch_to_run", None)
        reqs = list(getattr(batch, "reqs", None) or [])
        if reqs:
            self._pending = self._record(batch, reqs, now, preempted)
        return out

    # -------------------------------------------------------------- reporting
    def _record(
        self, batch: Any, reqs: list[Any], start: float, preempted: tuple[str, ...]
    ) -> _Pending:
        mode = getattr(batch, "forward_mode", None)
        extend = bool(mode is not None and mode.is_extend())
        lens = list(getattr(batch, "extend_lens", None) or []) if extend else []
        prefill = decode = n_pre = n_dec = 0
        for i, r in enumerate(reqs):
            n = (lens[i] if i < len(lens) else int(getattr(r, "extend_len", 1))) if extend else 1
            if n == 1 and len(r.output_ids) > 0:
                decode += 1
                n_dec += 1
            else:
                prefill += n
                n_pre += 1
        return _Pending(
            start_s=start,
            reqs=reqs,
            out_before=[len(r.output_ids) for r in reqs],
            prefill_tokens=prefill,
            decode_tokens=decode,
            num_prefill_seqs=n_pre,
            num_decode_seqs=n_dec,
            admitted=self._last_admitted if extend else (),
            preempted=preempted,
        )

    def _report(self, sched: Any, pend: _Pending, end: float) -> None:
        for r, before in zip(pend.reqs, pend.out_before, strict=True):
            v = self.views.get(r.rid)
            if v is not None and len(r.output_ids) > before:
                v.saw_token(end)
        finished = tuple(rid for rid, v in self.views.items() if v.request.finished())
        for rid in finished:
            self.views.pop(rid, None)
        report = pend.report(end, self.kv_view(sched).used_blocks, finished)
        self._last_step_s = report.duration_s
        self.steps += 1
        self.policy.on_step(report)
