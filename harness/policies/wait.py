"""WAIT: fluid-guided threshold batching with known output lengths (seed-wait.md §3).

Requests are grouped into *types* by their (known or predicted) output length. Type ``j``
takes part in a batch, at every one of its stages, only when at least ``n_j`` of its prompts
are waiting for prefill (§3.3 "type-level gating"); each stage then runs at most ``n_j``
prompts (oldest first), so cohorts of exactly ``n_j`` advance in lockstep and resident
memory stays at most ``M^π = Σ_j n_j Σ_k (l_j + k)`` (§3.4). Thresholds come from
:mod:`harness.policies.thresholds` (fluid rule of §3.2, or the paper's practical ``B ρ_j /
(l'_j+1)`` rule).

Decisions on the spec's ambiguities (seed-wait.md §9):

* #2 stages: vLLM semantics, the prefill emits output token 1, so stage ``k`` = output
  tokens generated so far; a type-``j`` request runs stages ``0 .. l'_j - 1``.
* #4 eviction: the host's recompute preemption; the victim re-enters its type's stage-0
  queue keeping its arrival time (FIFO by arrival, #14).
* #6 integer thresholds: ``n_j = max(1, round(x))`` at construction (option a).
* #12 memory: no memory test in the policy; run order is "latest stage first, partial
  prefills last", so when KV runs out the host evicts the most recently admitted (LIFO, §1.4).
* #17 end of run: the policy cannot see the end of a trace. It flushes (every type runs
  with ``min(n_j, available)``; requests are never dropped) once ``now >= trace_end_s`` when
  the host knows the last arrival, or once nothing has arrived for ``flush_after_s`` seconds.
  ``on_idle``: what to do when the strict rule gives an empty batch. ``"wait"`` is the paper
  (idle until arrivals; the simulator jumps to the next arrival, so pair it with
  ``trace_end_s``); ``"flush"`` (default) runs the relaxed batch instead, so a host never
  stalls, at the price of batching less at low load.
* ``gating``: ``"type"`` is the paper's Algorithm 1; ``"admission"`` is the authors' Vidur
  code (Appendix A): all decodes run every step and only stage-0 admission is gated, with a
  per-type in-flight cap ``L_j = n_j (l'_j + 1)``.
* ``step_cap``: ``B`` as a per-step request cap (the authors' reading, §9 #15), separate
  from the host's ``max_num_seqs`` (requests holding KV, paused ones included).
* Output length: ``predicted_output_len`` when the host gives one, else ``max_tokens``
  (ignore-EOS traces make that the true length).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
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


def known_output_len(r: RequestView) -> int:
    """The output length a known-length policy plans with (predicted, else max_tokens)."""
    return int(r.predicted_output_len) if r.predicted_output_len is not None else int(r.max_tokens)


# (arrival, request_id): FIFO by arrival (seed-wait.md §9 #14); in C, it runs per request per step
_age_key = attrgetter("arrival_s", "request_id")


def idle_since(r: RequestView) -> float:
    """When the request last made progress (last token, else arrival)."""
    return r.last_token_s if r.last_token_s is not None else r.arrival_s


def stuck(view: View, flush_after_s: float | None, last_arrival: float) -> bool:
    """End-of-run flush test (seed-wait.md §9 #17): nothing has arrived for ``flush_after_s``.

    ``last_arrival`` comes from ``on_arrival`` (every request in the view arrived through it,
    so it is the newest: O(1) per step); hosts that skip that hook are covered by the newest
    arrival among the requests in the view.
    """
    if flush_after_s is None or not (view.waiting or view.running):
        return False
    newest = last_arrival
    if newest == float("-inf"):
        newest = max(r.arrival_s for r in chain(view.waiting, view.running))
    return view.now - newest >= flush_after_s


def executable(plan: Plan, view: View) -> bool:
    """Whether the host would run anything of ``plan`` (base.py rules 2-3): it runs a request,
    or its first admission gets a seat and its first chunk's KV. A plan that only admits while
    every seat is taken by requests it pauses is empty in effect, and ``on_idle="flush"`` must
    treat it so, or a threshold rule deadlocks under overload (issue 13: 256 paused requests
    waiting for a later segment's quota, prompts waiting for a seat)."""
    if plan.run:
        return True
    if not plan.admit or len(view.running) >= view.max_num_seqs:
        return False
    n = min(plan.admit[0][1], view.token_budget)
    return blocks_for(max(1, n), view.kv.block_size) <= view.kv.free_blocks


def int_thresholds(values: Sequence[float]) -> list[int]:
    """Round fractional thresholds the way the authors' code does: ``max(1, round(x))``."""
    return [max(1, int(round(float(v)))) for v in values]


class _Heads:
    """Per-type waiting counts and heads (oldest first) read from a :class:`SortedWaiting`."""

    __slots__ = ("_wq",)

    def __init__(self, wq: SortedWaiting) -> None:
        self._wq = wq

    def count(self, j: int) -> int:
        return len(self._wq.queues[j])

    def head(self, n: int, j: int) -> list[RequestView]:
        return self._wq.head(n, j)


class ThresholdFlushing(BasePolicy):
    """The end-of-trace rule WAIT and Nested WAIT share: plan normally; when stuck (no arrival
    for ``flush_after_s``, or past ``trace_end_s``), or when ``on_idle="flush"`` and the plan is
    empty with work left, plan again ignoring thresholds. Subclasses set ``flush_after_s``,
    ``trace_end_s``, ``on_idle``, ``flushes`` and ``_last_arrival`` and implement ``_plan``."""

    flush_after_s: float | None
    trace_end_s: float | None
    on_idle: str
    flushes: int
    _last_arrival: float

    def _plan(
        self, view: View, running: tuple[list[RequestView], list[RequestView]], *, flush: bool
    ) -> Plan:  # pragma: no cover - abstract
        """The plan for ``running`` = ``split_running(view.running)`` (read once a step)."""
        raise NotImplementedError

    def schedule(self, view: View) -> Plan:
        flush = self._stuck(view) or (self.trace_end_s is not None and view.now >= self.trace_end_s)
        running = split_running(view.running)
        plan = self._plan(view, running, flush=flush)
        if (
            not flush
            and self.on_idle == "flush"
            and not executable(plan, view)
            and (view.waiting or view.running)
        ):
            flush = True
            plan = self._plan(view, running, flush=True)
        self.flushes += int(flush)
        return plan

    def _stuck(self, view: View) -> bool:
        return stuck(view, self.flush_after_s, self._last_arrival)

    def on_arrival(self, request: RequestView, now: float) -> None:
        self._last_arrival = max(self._last_arrival, request.arrival_s)


@register("wait")
class WaitPolicy(ThresholdFlushing):
    """WAIT (seed-wait.md §3.3, Algorithm 1) with per-type per-stage thresholds ``n_j``.

    ``output_lens``: ascending type output lengths ``l'_j`` (a request of length ``o`` is the
    first type with ``l'_j >= o``, the longest type if none). ``thresholds``: ``n_j`` per type.
    """

    def __init__(
        self,
        output_lens: Sequence[int] = (128, 256, 512, 1024, 2048),
        thresholds: Sequence[float] = (8, 4, 2, 1, 1),
        *,
        gating: str = "type",
        flush_after_s: float | None = 1.0,
        on_idle: str = "flush",
        trace_end_s: float | None = None,
        step_cap: int | None = None,
    ) -> None:
        if on_idle not in ("flush", "wait"):
            raise ValueError("on_idle must be 'flush' or 'wait'")
        if step_cap is not None and step_cap < 1:
            raise ValueError("wait: step_cap must be >= 1")
        self.step_cap = None if step_cap is None else int(step_cap)
        self.on_idle = on_idle
        self.trace_end_s = trace_end_s
        if len(output_lens) != len(thresholds) or not output_lens:
            raise ValueError("wait: output_lens and thresholds need the same non-zero length")
        if list(output_lens) != sorted(output_lens) or len(set(output_lens)) != len(output_lens):
            raise ValueError("wait: output_lens must be strictly ascending")
        if gating not in ("type", "admission"):
            raise ValueError("wait: gating must be 'type' or 'admission'")
        self.output_lens = [int(x) for x in output_lens]
        self.thresholds = int_thresholds(thresholds)
        self.gating = gating
        self.flush_after_s = flush_after_s
        self.flushes = 0
        self._last_arrival = float("-inf")
        # per-type waiting queues, FIFO by arrival (#14), kept by the hooks (no per-step sort)
        self._wq = SortedWaiting(_age_key, len(self.output_lens), self.type_of)
        self._type_memo: dict[str, int] = {}  # request_id -> type, running requests

    def type_of(self, r: RequestView) -> int:
        """Index of the request's type: first ``l'_j >= o`` (§3.2; #7 binning)."""
        j = bisect.bisect_left(self.output_lens, known_output_len(r))
        return min(j, len(self.output_lens) - 1)

    def _types_of(self, rs: list[RequestView]) -> list[int]:
        """``type_of`` of each request, remembered per request (it never changes)."""
        memo = self._type_memo
        out = []
        for r in rs:
            j = memo.get(r.request_id)
            if j is None:
                j = memo[r.request_id] = self.type_of(r)
            out.append(j)
        return out

    def on_arrival(self, request: RequestView, now: float) -> None:
        super().on_arrival(request, now)
        self._wq.add(request)

    def on_step(self, report: StepReport) -> None:
        self._wq.on_step(report)
        for rid in report.finished:
            self._type_memo.pop(rid, None)

    # -- planning ---------------------------------------------------------------------
    def _plan(
        self, view: View, running: tuple[list[RequestView], list[RequestView]], *, flush: bool
    ) -> Plan:
        self._wq.sync(view)
        waiting = _Heads(self._wq)
        decoding, partial = running
        if self.gating == "admission":
            plan = self._plan_admission(view, waiting, partial, decoding, flush)
        else:
            plan = self._plan_type(waiting, partial, decoding, flush)
        if self.step_cap is not None and len(plan.run) + len(plan.admit) > self.step_cap:
            # B read as a per-step request cap (seed-wait.md §9 #15), not as KV holders.
            plan.run = plan.run[: self.step_cap]
            plan.admit = plan.admit[: max(0, self.step_cap - len(plan.run))]
            plan.steady = False
        return plan

    def _plan_type(
        self,
        waiting: _Heads,
        partial: list[RequestView],
        decoding: list[RequestView],
        flush: bool,
    ) -> Plan:
        """Algorithm 1's type-level gating with per-stage quotas (§3.3)."""
        m = len(self.output_lens)
        n = self.thresholds
        eligible = [waiting.count(j) >= n[j] or (flush and waiting.count(j) > 0) for j in range(m)]
        if not flush and not partial and not any(eligible):
            return Plan()  # what the rest computes then (no stage runs, nothing admitted), fast
        dec = sorted(decoding, key=_age_key)
        types = self._types_of(dec)
        if flush:  # end-of-run flush: every type with anything to do runs (#17)
            for j in types:
                eligible[j] = True
        # Per-stage quota min(n_j, inv[j][k]), oldest first (§3.3).
        stages: dict[tuple[int, int], list[RequestView]] = {}
        for r, j in zip(dec, types, strict=True):
            if eligible[j]:
                stages.setdefault((j, r.num_output_tokens), []).append(r)
        run: list[tuple[str, int]] = []
        for (j, _k), rs in sorted(stages.items(), key=lambda kv: -kv[0][1]):
            run.extend((r.request_id, 1) for r in rs[: n[j]])
        # Partial prefills are committed work; listed last so they are the LIFO victims.
        run.extend((r.request_id, prefill_remaining(r)) for r in partial)
        admits: list[RequestView] = []
        for j in range(m):
            if eligible[j]:
                admits.extend(waiting.head(n[j], j))
        admits.sort(key=_age_key)
        # Plan.steady: a flush plan with nothing waiting that runs every running request
        # repeats until an arrival or a finish: the same (type, stage) groups advance one
        # stage each step, and a type's quota n_j does not change with the stage (§3.3).
        steady = flush and not admits and not partial and len(run) == len(dec)
        return Plan(
            run=run, admit=[(r.request_id, remaining_tokens(r)) for r in admits], steady=steady
        )

    def _plan_admission(
        self,
        view: View,
        waiting: _Heads,
        partial: list[RequestView],
        decoding: list[RequestView],
        flush: bool,
    ) -> Plan:
        """The authors' Vidur variant (seed-wait.md Appendix A): gate admission only."""
        m = len(self.output_lens)
        occupied = [0] * m
        for j in self._types_of(partial + decoding):
            occupied[j] += 1
        quota = []
        for j in range(m):
            limit = self.thresholds[j] * (self.output_lens[j] + 1)
            quota.append(max(0, min(self.thresholds[j], limit - occupied[j])))
        trigger = flush or any(q > 0 and waiting.count(j) >= q for j, q in enumerate(quota))
        run = [(r.request_id, 1) for r in sorted(decoding, key=_age_key)]
        run.extend((r.request_id, prefill_remaining(r)) for r in partial)
        admits: list[RequestView] = []
        if trigger:
            for j in range(m):
                admits.extend(waiting.head(quota[j], j))
        admits.sort(key=_age_key)
        steady = not view.waiting and not partial and bool(decoding)
        return Plan(
            run=run,
            admit=[(r.request_id, remaining_tokens(r)) for r in admits],
            steady=steady and len(decoding) <= view.token_budget,
        )

    def params(self) -> dict[str, Any]:
        return {
            "output_lens": self.output_lens,
            "thresholds": self.thresholds,
            "gating": self.gating,
            "flush_after_s": self.flush_after_s,
            "on_idle": self.on_idle,
            "trace_end_s": self.trace_end_s,
            "step_cap": self.step_cap,
        }
