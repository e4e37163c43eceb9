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
* It plans from the running set's columns (policies/columns.py), so the vectorised kernel
  runs it (issue 13); a running request's type is kept per ``RunningColumns.key``, read from
  the request the first time it is seen running.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter, ge
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
from harness.policies.columns import NO_POSITIONS, ColumnPlan, ColumnPolicy, ColumnView, per_key
from harness.policies.common import SortedWaiting
from harness.policies.registry import register


def known_output_len(r: RequestView) -> int:
    """The output length a known-length policy plans with (predicted, else max_tokens)."""
    return int(r.predicted_output_len) if r.predicted_output_len is not None else int(r.max_tokens)


# (arrival, request_id): FIFO by arrival (seed-wait.md §9 #14); in C, it runs per request per step
_age_key = attrgetter("arrival_s", "request_id")


def any_recompute(admits: list[RequestView]) -> bool:
    """Whether any planned admission is a recompute (it has output already): a plan's
    then_steady test. The usual lone admission read directly (a generator cost ~0.5 us)."""
    if len(admits) == 1:
        return bool(admits[0].num_output_tokens)
    return any(r.num_output_tokens for r in admits)


def by_age(cv: ColumnView, positions: np.ndarray) -> np.ndarray:
    """Running ``positions`` oldest first, by (arrival, request id) (seed-wait.md §9 #14):
    one stable sort by arrival; request ids break ties only when arrivals tie."""
    if len(positions) < 2:
        return positions
    rc = cv.running
    arrival = rc.arrival[positions]
    o = np.argsort(arrival, kind="stable")
    sa = arrival[o]
    if not (sa[1:] == sa[:-1]).any():
        return positions[o]
    keys, id_of = rc.key, cv.id_of
    ordered = sorted(positions.tolist(), key=lambda p: (float(rc.arrival[p]), id_of(int(keys[p]))))
    return np.array(ordered, dtype=np.int64)


def runs_of(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``values``: the index where each one's run of equal values starts, and its
    rank inside that run (0 for the first)."""
    idx = np.arange(len(values))
    new = np.empty(len(values), dtype=bool)
    new[:1] = True
    np.not_equal(values[1:], values[:-1], out=new[1:])
    start_of = np.maximum.accumulate(idx * new)
    return start_of, idx - start_of


def stuck(cv: ColumnView, flush_after_s: float | None, last_arrival: float) -> bool:
    """End-of-run flush test (seed-wait.md §9 #17): nothing has arrived for ``flush_after_s``.

    ``last_arrival`` comes from ``on_arrival`` (every request in the view arrived through it,
    so it is the newest: O(1) per step); hosts that skip that hook are covered by the newest
    arrival among the requests in the view.
    """
    if flush_after_s is None or not (cv.num_waiting or len(cv.running)):
        return False
    newest = last_arrival
    if newest == float("-inf"):
        newest = max(
            float(cv.running.arrival.max(initial=newest)),
            max((r.arrival_s for r in cv.waiting), default=newest),
        )
    return cv.now - newest >= flush_after_s


def executable(plan: ColumnPlan, cv: ColumnView) -> bool:
    """Whether the host would run anything of ``plan`` (base.py rules 2-3): it runs a request,
    or its first admission gets a seat and its first chunk's KV. A plan that only admits while
    every seat is taken by requests it pauses is empty in effect, and ``on_idle="flush"`` must
    treat it so, or a threshold rule deadlocks under overload (issue 13: 256 paused requests
    waiting for a later segment's quota, prompts waiting for a seat)."""
    if len(cv.running) if plan.order is None else len(plan.order):
        return True
    if not plan.admit_requests or len(cv.running) >= cv.max_num_seqs:
        return False
    n = min(plan.admit_requests[0][1], cv.token_budget)
    return blocks_for(max(1, n), cv.kv.block_size) <= cv.kv.free_blocks


def runs_whole(cv: ColumnView, decoding: np.ndarray, partial: np.ndarray) -> bool:
    """Whether a plan of every decode (one token each) and then the partial prefills (what
    they have left, in running order) leaves nothing for the host to cut: every decode gets
    its token within the budget and the whole step's KV fits the free blocks, so rule 2 clips
    only the prefills (listed last either way) and preempts nothing (base.py rule 2). Then the
    decodes' order changes nothing, and a flush plan may list them in running order instead
    of sorting them (issue 13)."""
    rc = cv.running
    left = cv.token_budget - len(decoding)
    if left < 0:
        return False
    bs = cv.kv.block_size
    need = 0
    for p in partial.tolist():  # the sequential clip of the prefills, their new blocks
        c = int(rc.computed[p])
        g = min(int(rc.prompt[p] + rc.output[p]) - c, left)
        left -= g
        need += -(-(c + g) // bs) - -(-c // bs)
    return rc.decodes_fit(decoding, bs, cv.kv.free_blocks - need)


def int_thresholds(values: Sequence[float]) -> list[int]:
    """Round fractional thresholds the way the authors' code does: ``max(1, round(x))``."""
    return [max(1, int(round(float(v)))) for v in values]


def threshold_plan(
    decodes: np.ndarray,
    partial: np.ndarray,
    cv: ColumnView,
    admit: list[RequestView],
    step_cap: int | None,
    *,
    steady: bool,
    in_running_order: bool = False,
    then_steady: bool = False,
) -> ColumnPlan:
    """The plan WAIT and Nested WAIT share: ``decodes`` one token each, then the partial
    prefills with what they have left (committed work, listed last so they are the LIFO
    victims, seed-wait.md §9 #12), then ``admit`` whole; ``step_cap`` cuts the requests run
    per step (B read as a per-step request cap, seed-wait.md §9 #15), runs before admits.
    Admissions past the free seats are left out (the host stops at a full engine, base.py
    rule 3): same plan in effect, without sizing requests that cannot start.
    ``in_running_order``: ``decodes`` are listed in running order (RunningColumns.decoding);
    when they are every running request the plan says so (order None: the host's
    all-decode path needs no check that the order lists each request once). ``then_steady``
    (base.Plan), kept only while the requests after this step fit the cap (the host checks
    the budget)."""
    admit = admit[: max(0, cv.max_num_seqs - len(cv.running))]
    order, tokens = decodes, 1
    if len(partial):
        order = np.concatenate((decodes, partial))
        tokens = np.ones(len(order), dtype=np.int64)
        tokens[len(decodes) :] = cv.running.remaining()[partial]
    if step_cap is not None and len(order) + len(admit) > step_cap:
        order = order[:step_cap]
        tokens = tokens if isinstance(tokens, int) else tokens[:step_cap]
        admit = admit[: max(0, step_cap - len(order))]
        steady = then_steady = False
    elif in_running_order and not len(partial) and len(order) == len(cv.running):
        order = None
    if then_steady and step_cap is not None:
        then_steady = len(cv.running) + len(admit) <= step_cap
    return ColumnPlan(
        order,
        tokens,
        admit_requests=[(r, remaining_tokens(r)) for r in admit],
        steady=steady,
        then_steady=then_steady,
    )


# a plan that runs and admits nothing (shared, never written)
NOTHING = ColumnPlan(NO_POSITIONS)


class ThresholdFlushing(ColumnPolicy):
    """The end-of-trace rule WAIT and Nested WAIT share: plan normally; when stuck (no arrival
    for ``flush_after_s``, or past ``trace_end_s``), or when ``on_idle="flush"`` and the plan is
    empty with work left, plan again ignoring thresholds. Subclasses set ``flush_after_s``,
    ``trace_end_s``, ``on_idle``, ``flushes``, ``_last_arrival`` and ``_wq`` (the waiting
    queue, FIFO by arrival, kept by the hooks) and implement ``_plan``.

    Both plan from the running set's columns (policies/columns.py), so the vectorised
    simulator kernel runs them (issue 13); object hosts reach the same rule through
    ``schedule``."""

    flush_after_s: float | None
    trace_end_s: float | None
    on_idle: str
    flushes: int
    _last_arrival: float
    _wq: SortedWaiting

    def _plan(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray, *, flush: bool
    ) -> ColumnPlan:  # pragma: no cover - abstract
        """The plan, given the running positions that decode and those with prefill left."""
        raise NotImplementedError

    def _strict_empty(self, partial: np.ndarray) -> bool:
        """True only when the strict (threshold) plan is known to run and admit nothing
        without making it: :meth:`plan_columns` then makes none (NOTHING, or with
        ``on_idle="flush"`` the flush plan straight away), so ``_plan`` is asked for a strict
        plan only when this is False; False: make it and see (the default)."""
        return False

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        flush = self._stuck(cv) or (self.trace_end_s is not None and cv.now >= self.trace_end_s)
        self._wq.sync(cv)
        rc = cv.running
        decoding, partial = rc.split()
        empty = not flush and self._strict_empty(partial)
        if empty and self.on_idle == "flush":
            flush = bool(cv.num_waiting or len(rc))  # the flush below, without the empty plan
            empty = not flush
        plan = NOTHING if empty else self._plan(cv, decoding, partial, flush=flush)
        if (
            not flush
            and self.on_idle == "flush"
            and not executable(plan, cv)
            and (cv.num_waiting or len(rc))
        ):
            flush = True
            plan = self._plan(cv, decoding, partial, flush=True)
        self.flushes += int(flush)
        return plan

    def _stuck(self, cv: ColumnView) -> bool:
        return stuck(cv, self.flush_after_s, self._last_arrival)

    def on_arrival(self, request: RequestView, now: float) -> None:
        self._last_arrival = max(self._last_arrival, request.arrival_s)
        self._wq.add(request)

    @hears_changes_only
    def on_step(self, report: StepReport) -> None:
        self._wq.on_step(report)


# up to this many decodes, WAIT groups them by (type, stage) in scalars
_FEW = 32


def _latest_stage(group: tuple[tuple[int, int], list[int]]) -> int:
    return -group[0][1]


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
        self._n = np.array(self.thresholds, dtype=np.int64)
        # each running request's type, by RunningColumns.key (-1: not known yet); read from the
        # request when first seen running (a request's type never changes)
        self._type_k = np.full(0, -1, dtype=np.int64)

    def type_of(self, r: RequestView) -> int:
        """Index of the request's type: first ``l'_j >= o`` (§3.2; #7 binning)."""
        j = bisect.bisect_left(self.output_lens, known_output_len(r))
        return min(j, len(self.output_lens) - 1)

    def _types(self, cv: ColumnView, positions: np.ndarray) -> np.ndarray:
        """The type of each running request at ``positions``."""
        keys = cv.running.key[positions]
        self._type_k = per_key(self._type_k, cv.num_keys, -1)
        types = self._type_k[keys]
        if len(types) and types.min() < 0:  # newly running: from the request
            for p in np.flatnonzero(types < 0).tolist():
                key = int(keys[p])
                r = self._wq.known(cv.id_of(key))
                if r is not None:
                    self._type_k[key] = self.type_of(r)
                else:  # the host never reported it: max_tokens, as without a prediction
                    o = int(cv.running.max_tokens[positions[p]])
                    j = bisect.bisect_left(self.output_lens, o)
                    self._type_k[key] = min(j, len(self.output_lens) - 1)
            types = self._type_k[keys]
        return types

    def _note_types(self, cv: ColumnView, requests: list[RequestView], j: int) -> None:
        """Record type ``j`` for ``requests`` (the head of its queue, planned for admission)
        under the keys they will run by, so :meth:`_types` finds them when they run instead
        of reading each newcomer from its request (a type never changes, so a plan the host
        does not carry out leaves nothing wrong behind)."""
        key_of = cv.key_of
        if len(requests) == 1:  # the usual admission: a scalar store, no list
            keys: int | list[int] = key_of(requests[0])
            top = keys
        else:
            keys = [key_of(r) for r in requests]
            top = max(keys)
        tk = self._type_k
        if top >= len(tk) or cv.num_keys > len(tk):
            # an object host may name a request after building the view: room for it too
            tk = self._type_k = per_key(tk, max(cv.num_keys, top + 1), -1)
        tk[keys] = j

    def _all_in_quota(self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray) -> bool:
        """Whether a flush plan runs every decode, each (type, stage) group within its quota
        ``n_j`` (§3.3), nothing cut by ``step_cap``, the budget or the KV (:func:`runs_whole`)."""
        if len(decoding) < 2:
            return False  # nothing to sort
        if self.step_cap is not None and len(decoding) + len(partial) > self.step_cap:
            return False  # the cap may cut the runs: their order matters
        if not runs_whole(cv, decoding, partial):
            return False
        # members per (type, stage) group against the type's quota (one pass, no sort)
        rc = cv.running
        pos = None if len(decoding) == len(rc) else decoding  # every one, in running order
        if cv.num_keys > len(self._type_k):
            self._type_k = per_key(self._type_k, cv.num_keys, -1)
        within = planops.type_stages(rc.output, rc.key, pos, self._type_k, self._n)
        if within < 0:  # newly running requests: their types from the requests, then again
            self._types(cv, decoding)
            within = planops.type_stages(rc.output, rc.key, pos, self._type_k, self._n)
        return within == 1

    def _oldest_first(self, admits: list[RequestView]) -> list[RequestView]:
        """``admits`` oldest first (#14)."""
        if len(admits) > 1:
            admits.sort(key=_age_key)
        return admits

    # -- planning ---------------------------------------------------------------------
    def _strict_empty(self, partial: np.ndarray) -> bool:
        # Algorithm 1's strict plan with no partial prefill and no type at its threshold
        # runs and admits nothing (what _plan_type would compute); a plain loop: it runs on
        # every plan, and map/any chains cost several times more compiled (issue 13)
        if self.gating != "type" or len(partial):
            return False
        for q, n in zip(self._wq.queues, self.thresholds, strict=True):  # noqa: SIM110
            if len(q) >= n:
                return False
        return True

    def _plan(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray, *, flush: bool
    ) -> ColumnPlan:
        if self.gating == "admission":
            return self._plan_admission(cv, decoding, partial, flush)
        return self._plan_type(cv, decoding, partial, flush)

    def _plan_type(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray, flush: bool
    ) -> ColumnPlan:
        """Algorithm 1's type-level gating with per-stage quotas (§3.3)."""
        queues, n = self._wq.queues, self.thresholds
        # (a strict plan that _strict_empty knows empty is never asked for: plan_columns)
        # a type is eligible at its threshold n_j, or with anyone waiting when flushing
        eligible = list(map(bool, queues)) if flush else list(map(ge, map(len, queues), n))
        if flush and self._all_in_quota(cv, decoding, partial):
            # every decode runs and nothing is cut: the order that the stage rule gives them
            # changes nothing, so they stay in running order (no age or group sort)
            dec = runs = decoding
            at = NO_POSITIONS
        else:
            dec = by_age(cv, decoding)
            types = self._types(cv, dec)
            # the age ranks of the eligible decodes; the end-of-run flush: all, every type
            # with anything to do runs (#17)
            at = np.arange(len(dec)) if flush else np.flatnonzero(np.array(eligible)[types])
            runs = NO_POSITIONS
        if 0 < len(at) <= _FEW:  # the same groups in scalars (numpy's per-call cost exceeds it)
            stages: dict[tuple[int, int], list[int]] = {}
            ks, js = cv.running.output[dec].tolist(), types.tolist()
            for p in at.tolist():
                stages.setdefault((js[p], ks[p]), []).append(p)
            out: list[int] = []
            for (j, _k), ps in sorted(stages.items(), key=_latest_stage):
                out.extend(ps[: n[j]])
            runs = dec[out]
        elif len(at):
            # Per-stage quota min(n_j, inv[j][k]), oldest first (§3.3): group the eligible
            # decodes by (type, stage) keeping age order inside a group, keep each group's
            # first n_j, and list groups latest stage first (ties: the group whose oldest
            # member is older first).
            j, k = types[at], cv.running.output[dec[at]]
            group = k * len(n) + j
            s = np.argsort(group, kind="stable")
            start_of, rank = runs_of(group[s])
            kept = rank < self._n[j[s]]
            first = at[s[start_of[kept]]]
            sel = at[s[kept]]
            runs = dec[sel[np.lexsort((sel, first, -k[s[kept]]))]]
        admits: list[RequestView] = []
        for jj, go in enumerate(eligible):
            if go:
                head = self._wq.head(n[jj], jj)
                if head:
                    self._note_types(cv, head, jj)
                    admits.extend(head)
        admits = self._oldest_first(admits)
        # ColumnPlan.steady: a flush plan with nothing waiting that runs every running request
        # repeats until an arrival or a finish: the same (type, stage) groups advance one
        # stage each step, and a type's quota n_j does not change with the stage (§3.3).
        steady = flush and not admits and not len(partial) and len(runs) == len(dec)
        # Plan.then_steady: once nothing waits, the plan is the flush (on_idle) of every
        # decode, steady, while every (type, stage) group is within n_j. It is after this step
        # when every decode runs now (all in quota; each group moves up one stage) and no
        # admission is a recompute: a cohort is at most n_j a type, at stage 1, which no
        # running request shares; finishes only shrink groups. No partial prefill: one
        # finishing now would join stage 1 too.
        then = (
            self.on_idle == "flush"
            and not len(partial)
            and len(runs) == len(dec)
            and not any_recompute(admits)
        )
        return threshold_plan(
            runs,
            partial,
            cv,
            admits,
            self.step_cap,
            steady=steady,
            in_running_order=runs is decoding,
            then_steady=then,
        )

    def _plan_admission(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray, flush: bool
    ) -> ColumnPlan:
        """The authors' Vidur variant (seed-wait.md Appendix A): gate admission only."""
        m = len(self.output_lens)
        occupied = np.bincount(self._types(cv, np.arange(len(cv.running))), minlength=m).tolist()
        quota = []
        for j in range(m):
            limit = self.thresholds[j] * (self.output_lens[j] + 1)
            quota.append(max(0, min(self.thresholds[j], limit - occupied[j])))
        queues = self._wq.queues
        trigger = flush or any(q > 0 and len(queues[j]) >= q for j, q in enumerate(quota))
        admits: list[RequestView] = []
        if trigger:
            for j in range(m):
                admits.extend(self._wq.head(quota[j], j))
        admits = self._oldest_first(admits)
        steady = (
            not cv.num_waiting
            and not len(partial)
            and len(decoding) > 0
            and len(decoding) <= cv.token_budget
        )
        # once nothing waits, nothing triggers an admission and every decode runs (no stage
        # quota here): Plan.then_steady, unless a prefill is still going on
        return threshold_plan(
            by_age(cv, decoding),
            partial,
            cv,
            admits,
            self.step_cap,
            steady=steady,
            then_steady=not len(partial),
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
