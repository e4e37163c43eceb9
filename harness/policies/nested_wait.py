"""Nested WAIT: threshold batching when output lengths are unknown (seed-wait.md §4).

Every prompt enters segment 1; a prompt that has generated ``l'_i`` tokens without finishing
moves on to segment ``i+1`` (binomial thinning, §4.2), so the scheduler only ever observes
"finished or not" and never reads an output length. Segment ``i`` has threshold ``n_i``: it
runs only when at least ``n_i`` prompts wait at its first stage, and then runs at most
``n_i`` prompts per stage. Segments run as a prefix ``1..i*`` (§4.3 prefix rule); later
segments are paused with their KV kept. Thresholds and the safety-buffer memory of Eq. (14)
come from :func:`harness.policies.thresholds.nested_thresholds`.

Decisions on the spec's ambiguities (seed-wait.md §9):

* #2/#8 stages: vLLM semantics (the prefill emits token 1); stage ``k`` = output tokens so
  far; segment ``i`` holds stages ``l'_{i-1} .. l'_i - 1`` with cumulative boundaries
  ``edges = (l'_1, ..., l'_m)`` and ``l'_0 = 0``; stage 0 (waiting for prefill) is in
  segment 1. A prompt longer than ``l'_m`` stays in the last segment.
* #11 mixed prompt lengths: one instance, thresholds on counts; the host's real per-token KV
  accounting is the memory check (option b).
* #12 memory: with ``memory_guard`` (default) stage-0 admission shrinks so that every
  resident prompt's KV at the end of its current segment (``prompt + l'_i`` tokens, the most
  it can reach before it pauses at the next boundary) plus each admitted prompt's
  ``prompt + l'_1`` fits the KV cache (the spec's "production mode"). Run order is "latest
  stage first, partial prefills last", so a remaining shortage (paused prompts advancing into
  a later segment) evicts the most recently admitted prompt (LIFO, §1.4) as a last resort.
* Batch limit ``B``: ``step_cap`` caps the requests *run per step* (the paper's and the
  authors' reading, seed-wait.md §9 #15), separately from the host's ``max_num_seqs``, which
  counts every request holding KV, paused ones included.
* #14 FIFO by arrival inside every queue. #17 end of run and ``on_idle``: as in WAIT
  (``trace_end_s``, ``flush_after_s``; ``on_idle="wait"`` is the paper, ``"flush"`` never stalls).
* The policy never reads ``predicted_output_len``, nor ``max_tokens`` for a decision
  (non-predictive, §1.2): only to say how long a plan repeats (``steady``, ``then_steady``:
  speed hints for the simulator that change no plan).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.policies import planops
from harness.policies.base import RequestView, blocks_for
from harness.policies.columns import ColumnPlan, ColumnView
from harness.policies.common import SortedWaiting
from harness.policies.registry import register
from harness.policies.wait import (
    ThresholdFlushing,
    _age_key,
    any_recompute,
    by_age,
    int_thresholds,
    runs_of,
    runs_whole,
    threshold_plan,
)


@register("nested-wait")
class NestedWaitPolicy(ThresholdFlushing):
    """Nested WAIT (seed-wait.md §4.3, Algorithm 2).

    ``edges``: ascending cumulative segment boundaries ``l'_1 < ... < l'_m`` in output tokens.
    ``thresholds``: ``n_i`` per segment (usually descending, ``n_{i+1}/n_i >= p_i``, Eq. 12).
    """

    def __init__(
        self,
        edges: Sequence[int] = (50, 100, 150, 200, 250, 300, 350, 400, 450, 500),
        thresholds: Sequence[float] = (66, 43, 32, 24, 17, 11, 7, 4, 2, 1),
        *,
        flush_after_s: float | None = 1.0,
        on_idle: str = "flush",
        trace_end_s: float | None = None,
        memory_guard: bool = True,
        step_cap: int | None = None,
        seg_caps: Sequence[int] | None = None,
    ) -> None:
        if on_idle not in ("flush", "wait"):
            raise ValueError("on_idle must be 'flush' or 'wait'")
        if step_cap is not None and step_cap < 1:
            raise ValueError("nested-wait: step_cap must be >= 1")
        self.memory_guard = bool(memory_guard)
        self.step_cap = None if step_cap is None else int(step_cap)
        self.guard_deferred = 0  # admissions the memory guard held back (summed over steps)
        if seg_caps is not None and len(seg_caps) != len(edges):
            raise ValueError("nested-wait: seg_caps needs one cap per segment")
        self.seg_caps = None if seg_caps is None else [max(1, int(c)) for c in seg_caps]
        self.on_idle = on_idle
        self.trace_end_s = trace_end_s
        if len(edges) != len(thresholds) or not edges:
            raise ValueError("nested-wait: edges and thresholds need the same non-zero length")
        if list(edges) != sorted(edges) or len(set(edges)) != len(edges) or edges[0] < 1:
            raise ValueError("nested-wait: edges must be strictly ascending and >= 1")
        self.edges = [int(x) for x in edges]
        self.thresholds = int_thresholds(thresholds)
        self.flush_after_s = flush_after_s
        self.flushes = 0
        self._last_arrival = float("-inf")
        self._wq = SortedWaiting(_age_key)  # waiting, FIFO by arrival (#14), kept by the hooks
        # segment of every stage up to the last edge (a look-up: it runs per request per step)
        self._seg = [self._segment_of(k) for k in range(self.edges[-1] + 1)]
        m = len(self.edges)
        self._first = [self.first_stage(i) for i in range(m)]
        self._first_a = np.array(self._first, dtype=np.int64)
        self._seg_a = np.array(self._seg, dtype=np.int64)
        self._edge_a = np.array(self.edges, dtype=np.int64)
        self._n = np.array(self.thresholds, dtype=np.int64)
        self._n_stage = self._n[self._seg_a]  # n_i of each stage's segment (_every_decode)
        # min(n[lo .. hi]) for every segment pair (0 when hi < lo: never fits)
        self._min_n = np.array(
            [[min(self.thresholds[lo : hi + 1] or [0]) for hi in range(m)] for lo in range(m)],
            dtype=np.int64,
        )

    def _segment_of(self, num_output_tokens: int) -> int:
        return min(bisect.bisect_right(self.edges, num_output_tokens), len(self.edges) - 1)

    def segment_of(self, num_output_tokens: int) -> int:
        """Segment index (0-based) of a prompt at stage ``k`` = output tokens so far (§4.2)."""
        seg = self._seg
        return seg[num_output_tokens] if 0 <= num_output_tokens < len(seg) else seg[-1]

    def _segments(self, stages: np.ndarray) -> np.ndarray:
        """``segment_of`` of each stage in ``stages``."""
        return self._seg_a[np.minimum(stages, len(self._seg_a) - 1)]

    def first_stage(self, i: int) -> int:
        """First stage of segment ``i`` (0-based): 0, then ``l'_{i}`` (§4.3)."""
        return 0 if i == 0 else self.edges[i - 1]

    def _strict_empty(self, partial: np.ndarray) -> bool:
        # segment 1 misses its threshold: the prefix rule runs nothing
        return not len(partial) and self.seg_caps is None and len(self._wq) < self.thresholds[0]

    def _plan(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray, *, flush: bool
    ) -> ColumnPlan:
        m = len(self.edges)
        n = self.thresholds
        num_waiting = len(self._wq)
        # (segment 1 under its threshold, no prefill: plan_columns makes no strict plan)
        unsorted = self._flush_in_running_order(flush, decoding)
        if unsorted and self.seg_caps is None:
            plan = self._every_decode(cv, decoding, partial)
            if plan is not None:
                return plan
        # A flush plan usually runs every decode: the group counts (what the prefix rule, the
        # quotas and the steady check read) do not depend on the order inside a stage, so
        # they are built from running order first; only when a quota cuts a group (its
        # oldest go first) or the host would cut the run (runs_whole) is age order needed.
        dec = decoding if unsorted else by_age(cv, decoding)
        groups = (_StagesInScalars if len(dec) <= _FEW else _StagesInArrays)(self, cv, dec)
        # prompts at each segment's first stage: waiting ones for segment 1
        at_first = [num_waiting, *groups.at_first_stages()]
        # Entry quota per segment: n_i, or with ``seg_caps`` (the authors' code, seed-wait.md
        # App. A) min(n_i, cap_i - prompts inside segment i past its first stage).
        quota = list(n)
        if self.seg_caps is not None:
            inside = groups.past_first_stage()
            inside[0] += len(partial)
            quota = [max(0, min(n[i], self.seg_caps[i] - inside[i])) for i in range(m)]
        # Prefix rule: the largest i* such that every segment 1..i* meets its threshold.
        with_work = groups.segments() | ({0} if num_waiting else set()) if flush else set()
        active = 0
        for i in range(m):
            if at_first[i] >= quota[i] or (flush and i in with_work):
                active = i + 1
            elif not flush:
                break
        runs = groups.runs(active, quota)
        if unsorted and (len(runs) < len(dec) or not runs_whole(cv, decoding, partial)):
            dec = by_age(cv, decoding)  # the same counts, in the stage rule's order
            groups = (_StagesInScalars if len(dec) <= _FEW else _StagesInArrays)(self, cv, dec)
            runs = groups.runs(active, quota)
        steady = (
            flush
            and not num_waiting
            and not len(partial)
            and self.seg_caps is None
            and self.step_cap is None
            and len(runs) == len(dec) > 0
            and self._counts_fit_ahead(
                np.bincount(groups.stage), int((cv.running.max_tokens[dec] - groups.stage).min())
            )
        )
        return self._admitting(cv, runs, partial, active, quota, steady)

    def _every_decode(
        self, cv: ColumnView, decoding: np.ndarray, partial: np.ndarray
    ) -> ColumnPlan | None:
        """A flush plan's usual case, from the decodes per stage alone: when no stage holds more
        than its segment's ``n_i`` (§4.3, the quotas without ``seg_caps``), every decode runs
        (every segment with work is active), and when the host cuts none of them
        (:func:`runs_whole`) the stage rule's order changes nothing, so they run in running
        order, as in WAIT's flush. None otherwise: the stage groups decide."""
        rc = cv.running
        # stages past the last edge have the last segment's n (_n_stage's last entry); steady
        # (nothing waiting, no prefill) also needs the groups to fit the segments ahead, and
        # then_steady (no prefill: all decode) to fit them until they empty
        steady_asks = not len(self._wq) and not len(partial)
        promise_asks = self.on_idle == "flush" and not len(partial)
        within = planops.stage_groups(
            rc.output,
            rc.max_tokens,
            None if len(decoding) == len(rc) else decoding,  # every one, in running order
            self._n_stage,
            self._seg_a,
            self._min_n,
            steady_asks | (promise_asks << 1),
        )
        if not within or not runs_whole(cv, decoding, partial):
            return None
        held = bool(within & 4)
        return self._admitting(cv, decoding, partial, 1, self.thresholds, within & 2, True, held)

    def _admitting(
        self,
        cv: ColumnView,
        runs: np.ndarray,
        partial: np.ndarray,
        active: int,
        quota: list[int],
        steady: bool,
        in_running_order: bool = False,
        held: bool | None = None,
    ) -> ColumnPlan:
        """The plan: ``runs``, the partial prefills, then segment 1's entrants (oldest first,
        its entry quota, when segment 1 is ``active``) within the memory guard
        (``in_running_order``: as threshold_plan's; ``held``: :meth:`_then_steady`'s)."""
        cands = self._wq.head(quota[0]) if active >= 1 else []
        if self.step_cap is not None:  # runs first (threshold_plan cuts them)
            ran = min(len(runs) + len(partial), self.step_cap)
            cands = cands[: max(0, self.step_cap - ran)]
        # the host admits at most the free seats (base.py rule 3): plan no more, so a full
        # engine (every seat held, the overload case) skips the guard's pass over running
        cands = cands[: max(0, cv.max_num_seqs - len(cv.running))]
        if self.memory_guard and cands:
            cands = self._guard(cv, cands)
        return threshold_plan(
            runs,
            partial,
            cv,
            cands,
            self.step_cap,
            steady=bool(steady),
            in_running_order=in_running_order,
            then_steady=self._then_steady(cv, runs, partial, cands, held),
        )

    def _then_steady(
        self,
        cv: ColumnView,
        runs: np.ndarray,
        partial: np.ndarray,
        admits: list[RequestView],
        held: bool | None,
    ) -> bool:
        """Plan.then_steady: once nothing waits, the plan is the flush (``on_idle``) of every
        decode, steady, while every stage group is within its segment's ``n_i`` (the prefix
        rule then activates every segment with work, §4.3). It is at every later step when
        every running request decodes now and the groups after this step, admissions at
        stage 1 included, keep within the quotas of each segment they reach until they empty
        (:func:`planops.stage_groups_hold`; groups only shrink as their members finish). Not
        with a partial prefill (finishing, it would join stage 1), a recompute admission (its
        stage is its outputs'), ``seg_caps`` (quotas that move with the counts) or a
        ``step_cap`` (whose plans this policy never calls steady). The horizon reads
        ``max_tokens``: a speed hint, like ``steady``'s, that changes no plan.

        ``held``: whether the running groups hold (:meth:`_every_decode` asks
        ``stage_groups`` on its pass), None if not known. The admissions are then a group of
        their own (every running request decodes, so none is at stage 0 now or at stage 1
        after this step), and a lone one always holds: every ``n_i`` is at least 1."""
        if (
            self.on_idle != "flush"
            or self.seg_caps is not None
            or self.step_cap is not None  # its plans are never steady (_plan)
            or len(partial)
            or len(runs) != len(cv.running)
            or len(admits) != cv.num_waiting  # some left waiting: the host would ask again
            or held is False
        ):
            return False
        if any_recompute(admits):
            return False
        rc = cv.running
        if held is None:
            return planops.stage_groups_hold(
                rc.output, rc.max_tokens, None, _max_tokens(admits), self._seg_a, self._min_n
            )
        return len(admits) < 2 or planops.stage_groups_hold(
            planops.NOBODY, planops.NOBODY, None, _max_tokens(admits), self._seg_a, self._min_n
        )

    def _counts_fit_ahead(self, counts: np.ndarray, horizon: int) -> bool:
        """ColumnPlan.steady for a flush plan that runs every request with nothing waiting: it
        repeats until the next arrival or finish (``horizon`` steps away) if every stage group
        (``counts``: decodes per stage), advancing together, also fits the quota ``n_i`` of each
        segment it enters before then (quotas are per segment, §4.3; with ``seg_caps`` they
        move with the counts, never steady)."""
        return planops.counts_fit_ahead(counts, horizon, self._seg_a, self._min_n)

    def _flush_in_running_order(self, flush: bool, decoding: np.ndarray) -> bool:
        """Whether a plan builds its stage groups from running order first (:meth:`_plan`):
        flush plans, where every decode usually runs, without a step cap that could cut them."""
        return flush and len(decoding) > 1 and self.step_cap is None

    def _guard(self, cv: ColumnView, cands: list[RequestView]) -> list[RequestView]:
        """Admit only while every prompt's KV at the end of its current segment fits
        (seed-wait.md §9 #12, production mode: shrink the stage-0 admission)."""
        bs = max(1, cv.kv.block_size)
        rc = cv.running
        # blocks_for(prompt + l'_i), i = each running request's segment
        committed = planops.segment_blocks(rc.prompt, rc.output, self._seg_a, self._edge_a, bs)
        room = cv.kv.total_blocks - committed
        out: list[RequestView] = []
        for r in cands:
            need = blocks_for(
                r.num_prompt_tokens + self.edges[self.segment_of(r.num_output_tokens)], bs
            )
            if need > room:
                break
            room -= need
            out.append(r)
        self.guard_deferred += len(cands) - len(out)
        return out

    def params(self) -> dict[str, Any]:
        return {
            "edges": self.edges,
            "thresholds": self.thresholds,
            "flush_after_s": self.flush_after_s,
            "on_idle": self.on_idle,
            "trace_end_s": self.trace_end_s,
            "memory_guard": self.memory_guard,
            "step_cap": self.step_cap,
            "seg_caps": self.seg_caps,
        }


def _max_tokens(requests: list[RequestView]) -> np.ndarray:
    return np.array([r.max_tokens for r in requests], dtype=np.int64)


# Up to this many decodes, the stage groups are built in scalars: a group is a handful of
# requests (one per stage at low load), and a dict of them costs less than the numpy calls
# that would sort them; above it (hundreds running, overload) arrays cost less.
_FEW = 32


class _StagesInScalars:
    """The decodes ``dec`` (oldest first) grouped by stage k (output tokens so far), oldest
    first inside a group (§4.3): what the prefix rule and the run order read."""

    def __init__(self, pol: NestedWaitPolicy, cv: ColumnView, dec: np.ndarray) -> None:
        self.pol = pol
        self.stage = cv.running.output[dec]  # in dec's order
        stages: dict[int, list[int]] = {}
        for p, k in zip(dec.tolist(), self.stage.tolist(), strict=True):
            stages.setdefault(k, []).append(p)
        self.stages = stages
        seg, last = pol._seg, len(pol._seg) - 1
        self.stage_seg = {k: seg[k if k < last else last] for k in stages}  # segment_of

    def at_first_stages(self) -> list[int]:
        """Decodes at the first stage of segments 2.. (l'_1, l'_2, ...)."""
        return [len(self.stages.get(k, ())) for k in self.pol._first[1:]]

    def past_first_stage(self) -> list[int]:
        """Per segment, the decodes in it past its first stage (segment 1: all)."""
        inside = [0] * len(self.pol.edges)
        first = self.pol._first
        for k, ps in self.stages.items():
            i = self.stage_seg[k]
            if k != first[i] or i == 0:
                inside[i] += len(ps)
        return inside

    def segments(self) -> set[int]:
        """The segments with a decode in them."""
        return set(self.stage_seg.values())

    def runs(self, active: int, quota: list[int]) -> np.ndarray:
        """Latest stage first, each stage of segments ``< active`` its first ``n_i`` (a
        segment's first stage: its entry quota)."""
        first, n = self.pol._first, self.pol.thresholds
        out: list[int] = []
        for k in sorted(self.stages, reverse=True):
            i = self.stage_seg[k]
            if i < active:
                take = quota[i] if (i > 0 and k == first[i]) else n[i]
                out.extend(self.stages[k][:take])
        return np.array(out, dtype=np.int64)


class _StagesInArrays:
    """:class:`_StagesInScalars` in arrays: the decodes sorted by stage, latest first, stable
    (so oldest first inside a stage), each one's rank in its stage group."""

    def __init__(self, pol: NestedWaitPolicy, cv: ColumnView, dec: np.ndarray) -> None:
        self.pol = pol
        self.dec = dec
        self.stage = cv.running.output[dec]  # in dec's order
        self.order = np.argsort(-self.stage, kind="stable")
        self.ks = self.stage[self.order]
        _, self.rank = runs_of(self.ks)
        self.seg = pol._segments(self.ks)

    def at_first_stages(self) -> list[int]:
        neg = -self.ks  # ascending
        firsts = -self.pol._first_a[1:]
        return (
            np.searchsorted(neg, firsts, side="right") - np.searchsorted(neg, firsts, side="left")
        ).tolist()

    def past_first_stage(self) -> list[int]:
        past = (self.seg == 0) | (self.ks != self.pol._first_a[self.seg])
        return np.bincount(self.seg[past], minlength=len(self.pol.edges)).tolist()

    def segments(self) -> set[int]:
        return set(np.flatnonzero(np.bincount(self.seg)).tolist())

    def runs(self, active: int, quota: list[int]) -> np.ndarray:
        seg, pol = self.seg, self.pol
        if quota == pol.thresholds:  # entry quotas are n_i too: one quota per segment
            take = pol._n[seg]
        else:
            entry = (seg > 0) & (self.ks == pol._first_a[seg])
            take = np.where(entry, np.array(quota, dtype=np.int64)[seg], pol._n[seg])
        keep = self.rank < take
        if active < len(pol.edges):  # segments from ``active`` on do not run
            keep &= seg < active
        return self.dec[self.order[keep]]
