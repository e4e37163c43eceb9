"""RAD: the resource-aware dynamic, throughput-optimal scheduler (seed-rad-slai.md §3).

RAD runs in cycles of at most ``n`` started requests. A decode batch holds *every*
decode-phase request (at most ``t_col*`` of them, the optimal GeMM tile width) and runs when
``|D| = t_col*``, when no prefill is waiting, or when the cycle has started ``n`` requests
(Algorithm 1 line 6). Otherwise the FCFS-oldest waiting request is prefilled *alone*, in
chunks of ``t_lcm* = LCM(t_row*, t_col*, t_red*)`` tokens, until its prompt is done (lines
10-18); prefill and decode never share a batch. The cycle ends when ``D`` drains (line 9).
The paper never ran RAD; this is the authors' *theoretical* scheduler, expect high TBT.

Decisions on the spec's ambiguities (seed-rad-slai.md §3.3-§3.5, §7 #18-#19):

* Chunk off-by-one fixed: ``c = min(t_lcm*, L^P - i + 1)``, i.e. the remaining prompt.
* Line 6 is not re-checked between the chunks of one prefill (the paper runs it to the end).
* Defaults ``t_col* = 128``, ``t_lcm* = 256`` (A100 tiles 256×128, ``t_red* = 32``),
  ``n = 1024`` (none are in the paper). Budget/``max_num_seqs`` of the host still apply.
* A recompute-preempted request returns to the waiting queue and is re-prefilled FCFS.
* State across cycles is only the queue and the cycle counter (Lemma 2's Markov structure).
* KV (the paper assumes it never binds): a prefill chunk that does not fit the free KV blocks
  waits, and the decode batch runs instead (line 6 with "no KV room" beside "no seat room"), so
  decodes drain and free KV; without this RAD asked for an admission the host cannot make, and
  stalled with work left. A decode batch short of KV loses its newest members (host rule 2).
* The FCFS-oldest waiting request comes from a FIFO of the arrivals (they come in
  ``(arrival, id)`` order, O(1) each) beside a heap for the rest (re-queued preempted
  requests, an arrival out of that order; O(log n)), both kept by ``on_arrival``/``on_step``
  and deleted from lazily: the oldest is the smaller of their heads, never a sort of the
  whole queue per step. Both are rebuilt from the view whenever their size disagrees with
  the host's waiting queue (a host that skips the hooks).
* It plans from the running set's columns (policies/columns.py), so the vectorised kernel runs
  it, and promises ``then_steady`` on every plan (plan_columns says why). The prefill in
  progress is the oldest running request with prefill left (ties by running order; RAD
  prefills one request at a time, so there is normally one).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

import numpy as np

from harness.policies import planops
from harness.policies.base import (
    RequestView,
    StepReport,
    blocks_for,
    hears_changes_only,
    remaining_tokens,
)
from harness.policies.columns import (
    NO_POSITIONS,
    ColumnPlan,
    ColumnPolicy,
    ColumnView,
    RunningColumns,
)
from harness.policies.registry import register


@register("rad")
class RADPolicy(ColumnPolicy):
    """Resource-Aware Dynamic scheduler (seed-rad-slai.md §3.2, Algorithm 1)."""

    def __init__(
        self,
        n: int = 1024,
        t_col: int = 128,
        t_row: int = 256,
        t_red: int = 32,
    ) -> None:
        if min(n, t_col, t_row, t_red) < 1:
            raise ValueError("rad: n and tile sizes must be >= 1")
        self.n = int(n)
        self.t_col = int(t_col)
        self.t_row = int(t_row)
        self.t_red = int(t_red)
        self.t_lcm = math.lcm(self.t_row, self.t_col, self.t_red)
        self.requests_in_cycle = 0
        self.cycles = 0
        # (arrival, id) of waiting requests, lazily deleted: arrivals in that order, the rest
        self._fifo: deque[tuple[float, str]] = deque()
        self._heap: list[tuple[float, str]] = []
        self._waiting: dict[str, RequestView] = {}  # the waiting requests the FIFO and heap cover
        self._known: dict[str, RequestView] = {}  # every request seen and not finished

    def _oldest_waiting(self, cv: ColumnView) -> RequestView | None:
        """FCFS-oldest waiting request by (arrival, id), O(1) amortised for arrivals."""
        waiting = self._waiting
        if len(waiting) != cv.num_waiting:  # the hooks missed something: resync
            waiting = self._waiting = {r.request_id: r for r in cv.waiting}
            self._known.update(waiting)
            self._fifo.clear()
            self._heap = [(r.arrival_s, r.request_id) for r in waiting.values()]
            heapq.heapify(self._heap)
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][1] not in waiting:
            fifo.popleft()
        while heap and heap[0][1] not in waiting:
            heapq.heappop(heap)
        if heap and (not fifo or heap[0] < fifo[0]):
            return waiting[heap[0][1]]
        return waiting[fifo[0][1]] if fifo else None

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        # Plan.then_steady on every plan: with nothing waiting, no prefill left and every
        # running request decoding, the plan is always the decode batch of all of D (line 6:
        # no prefill waits), steady within the budget (the host checks it); oldest first,
        # which only orders a step the host clips or preempts in (it keeps the promise only
        # when neither happens). The cycle counter changes no such plan (line 9 resets it only
        # once D is empty, a plan the host always asks for).
        rc = cv.running
        budget = cv.token_budget
        chunk = min(self.t_lcm, budget)
        bs, total, used = cv.kv
        free = total - used
        n_running = len(rc.prompt)
        n_prefilling = rc.num_prefilling
        n_decoding = n_running - n_prefilling
        if n_prefilling:  # lines 12-16: finish the current prefill, one chunk a batch, alone
            if n_prefilling == 1 and rc.newest_prefills():  # the usual: the newest, alone
                p = n_running - 1
            else:  # the oldest (RAD prefills one request at a time, so this is rare)
                prefilling = rc.prefilling()
                p = int(prefilling[np.argmin(rc.arrival[prefilling])])
            c0 = rc.computed.item(p)  # (.item: a Python int, twice as quick as int(a[p]))
            c = min(chunk, rc.prompt.item(p) + rc.output.item(p) - c0)
            if n_decoding and blocks_for(c0 + c, bs) - blocks_for(c0, bs) > free:
                # no KV for the chunk yet: let decodes drain
                return self._decode_batch(rc, n_prefilling, n_decoding, budget, False)
            # the same request's chunks follow until its prompt is done (line 6 not
            # re-checked, above); only a chunk's KV could change that (the test above), not
            # an arrival (this branch reads no waiting request): the run holds past them
            return ColumnPlan(np.array([p]), c, prefill_run=True, hold=True, then_steady=True)
        if not n_decoding and self.requests_in_cycle > 0:  # line 9: D drained, new cycle
            self.requests_in_cycle = 0
            self.cycles += 1
        head = self._oldest_waiting(cv)
        if head is None:
            if not n_decoding:
                return ColumnPlan(NO_POSITIONS)  # line 5: idle
            return self._decode_batch(rc, 0, n_decoding, budget, False)
        if (
            n_decoding >= self.t_col
            or self.requests_in_cycle >= self.n
            or n_running >= cv.max_num_seqs  # no seat
        ):
            return self._decode_batch(rc, 0, n_decoding, budget, True)
        c = min(chunk, remaining_tokens(head))
        if n_decoding and blocks_for(c, bs) > free:
            # no KV room for the first chunk: decodes drain
            return self._decode_batch(rc, 0, n_decoding, budget, True)
        # lines 11-17: FCFS prefill of one request (counted in on_step); its next chunks are
        # the plans above (c is the chunk whenever prompt is left after it)
        return ColumnPlan(
            NO_POSITIONS,
            admit_requests=[(head, c)],
            prefill_run=True,
            hold=True,
            then_steady=True,
        )

    @staticmethod
    def _decode_batch(
        rc: RunningColumns, n_prefilling: int, n_decoding: int, budget: int, queued: bool
    ) -> ColumnPlan:
        """Lines 6-8: a DI for all of D, oldest first. ``queued``: a request waits for it.
        With a prefill in progress (waiting for KV): the same batch until a finish or
        preemption frees some (``steady_decodes``; the decoding requests' KV only grows till
        then, and that branch of :meth:`plan_columns` reads no waiting request: it holds)."""
        steady = not n_prefilling and n_decoding <= budget
        # with a request already queued, an arrival (younger) changes neither the head nor
        # this decision: the host may run the batch on past arrivals (Plan.hold). Every
        # decode batch repeats (ColumnPlan.repeats): until an arrival, finish, preemption or
        # admission, D's order stays (arrival order) and every reason for this batch stands
        # (the free KV only shrinks as D decodes; the cycle count moves only on admissions)
        if steady and (n_decoding < 2 or planops.ascending(rc.arrival)):  # oldest first
            return ColumnPlan(None, 1, steady=True, hold=queued, then_steady=True, repeats=True)
        # oldest first (a stable sort: equal arrivals keep the running order)
        out = np.empty(len(rc.prompt), np.int64)
        m = planops.oldest_decoding(rc.prompt, rc.output, rc.computed, rc.arrival, out)
        if n_prefilling:
            parked = n_decoding <= budget
            return ColumnPlan(
                out[:m], 1, hold=parked, then_steady=True, steady_decodes=parked, repeats=True
            )
        return ColumnPlan(
            out[:m], 1, steady=steady, hold=steady and queued, then_steady=True, repeats=True
        )

    def on_arrival(self, request: RequestView, now: float) -> None:
        rid = request.request_id
        self._known[rid] = request
        self._waiting[rid] = request
        key = (request.arrival_s, rid)
        fifo = self._fifo
        if not fifo or key >= fifo[-1]:  # in order (the usual case): the FIFO stays sorted
            fifo.append(key)
        else:
            heapq.heappush(self._heap, key)

    @hears_changes_only
    def on_step(self, report: StepReport) -> None:
        self.requests_in_cycle += len(report.admitted)  # line 18
        for rid in report.admitted:
            self._waiting.pop(rid, None)
        for rid in report.preempted:  # back to waiting (recompute)
            r = self._known.get(rid)
            if r is not None:
                self._waiting[rid] = r
                heapq.heappush(self._heap, (r.arrival_s, rid))
        for rid in report.finished:
            self._known.pop(rid, None)

    def params(self) -> dict[str, Any]:
        return {"n": self.n, "t_col": self.t_col, "t_row": self.t_row, "t_red": self.t_red}
