"""Vectorised simulation kernel for policies that declare the FCFS token-budget rule.

Why: the engine core (:class:`~harness.engine.core.EngineCore` + a policy object) costs a few
Python operations per running request per step, so near capacity (hundreds of running
requests, a step per arrival) it simulates a few thousand requests/s. This kernel keeps request
state in numpy arrays indexed by trace row and does a step in a fixed number of array
operations.

It is reached through the policy contract, not by policy type: a policy whose plans are
exactly :class:`harness.policies.base.BudgetRule` says so through its ``budget_rule()`` hook
(today ``vllm`` with its defaults and FCFS ``sarathi``), and :func:`fast_budget` admits it only
while that declaration still describes the object (base.declared_rule: a subclass that
overrides planning gets the engine core). The kernel executes that one rule under the host
semantics of base.py:

- run order = decoding requests (running order), then the others (running order), each
  granted its remaining tokens clipped to the budget left;
- KV shortage preempts from the end of that order (recompute, budget refunded), then no
  admission that step (base.py rules 2-3) - done by an exact sequential fallback, rare;
- FCFS admission (preempted first) while budget, ``max_num_seqs`` and KV allow, head-of-line;
- a step with only decodes and no admission is fast-forwarded in closed form (Plan.steady).

One kernel (issue 13: one kernel per policy rule): the step is :meth:`ArrayEngine.execute`
on an engine whose state lives between calls. :func:`fast_simulate` drives one such engine
over a trace (the single-engine simulator); :mod:`harness.engine.cluster_fast` drives several
under the cluster's event loop (load-aware routers). The hosts differ only in what they ask of
the step, not in the rule: when a decode-only step may be fast-forwarded (the single engine:
when nothing was admitted and the step ends before the next arrival; the cluster, like the
engine core it must match step for step: when nothing was planned), how many preempting plans
that schedule nothing it retries, and the prefix of a rejection message.

The loops over the running arrays that numpy does in many small calls (retiring finished
requests, every running request decoding, rule 5 for a few items, the new blocks of an
all-decode step, a policy's block count of the columns, rule 2 and the composition of a step
mixing prefill chunks and decodes, with the prefix it keeps when the KV runs short, the
running set's recount, each step's telemetry row, the kept items when only the last run item
is preempted, a steady run's bound by the free KV blocks, a recompute preemption with its
slot's close, an admission's slot, whether a run order lists every running position once;
rule 5's emitted trace rows are written straight into the chunk log's buffer,
``ChunkLog.room``) run in the optional C extension
:mod:`harness.engine._rows` (``_rows.c``) where the install built it: on ~100 running
requests a numpy call costs 1-5 us and a scalar store ~0.25 us, so each was tens of
microseconds of call overhead a step. So do an affine or context cost model's step time, a
fast-forwarded run's step ends and a lone prefill run's chunks (the completing one too where
its token leaves the request running) (``_step_time``, ``_run_end_times``, ``_chunks``: the
model's own floats, bound in
``ArrayEngine.__init__``). Each has its Python version here (the ``_py`` methods; for the
mixed step, the array pass; the cost model's ``step_time``, ``core.decode_run_ends``,
``core.decode_steps_that_fit``, ``_preempt_tail``, ``_prefill_run``'s loop and
``_lists_each_once_py``), used where
the extension is missing (or was
built before one of its passes was added or changed: ``_rows._ABI``) or under
``HARNESS_PURE_KERNEL=1`` (read at
import); tests/engine/test_rows_c.py checks the two give the same state and token times.

The kernel has no prefix cache: requests with a prefix identity take the engine core. Parity
with the engine core and the reference step is a test (tests/engine/test_fastsim.py,
test_identity.py, tests/cluster/test_cluster.py): identical per-request token times on traces
with preemptions, seat and budget limits.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.core import decode_run_ends, decode_steps_that_fit, fit_problem
from harness.engine.costmodel import CostModel, step_terms
from harness.engine.row_requests import RowMeta, RowRequest, WaitingRows
from harness.engine.simresult import (
    SAMPLE_COLS,
    ChunkLog,
    LivelockWatch,
    SimResult,
    SimulationStalled,
    sample_columns,
)
from harness.engine.waiting_queue import WaitingQueue
from harness.policies.base import (
    KVView,
    Policy,
    StepReport,
    declared_rule,
    reports_changes_only,
)
from harness.policies.columns import (
    EVERY_DECODE,
    ColumnPlan,
    ColumnView,
    RunningColumns,
    column_planner,
    decoding_mask,
    has_hooks,
)
from harness.workload.trace import Trace

_PENDING, _RUNNING, _FINISHED, _REJECTED, _WAITING = 0, 1, 2, 3, 4
# a run item's want that its remaining tokens always clip (execute's "all it has left")
_ALL_LEFT = 1 << 62
_NO_LEFT = 1 << 62  # min_left of an empty batch
_row_of = attrgetter("index")  # a RowRequest's key (ColumnView.key_of): its trace row
_tuple_new = tuple.__new__  # a NamedTuple from a tuple, without its keyword call (_view)
_VIEW_CACHE = 4096  # running-column views ArrayEngine._view keeps (~1 KB each)
_FEW = 4  # run orders up to this long are granted and advanced in scalars
_INTS = (int, np.integer)  # a plan's scalar tokens (a tuple: `int | np.integer` is built per call)
_FEW_GONE = 8  # up to this many slots closed at once are shifted out one by one, in scalars

# every pass of the C extension this module calls, and the version of their arguments and
# results it calls them with (_rows.c's ROWS_ABI)
_ROWS_ABI = 7
_PASSES = (
    "finish",
    "decode",
    "blocks",
    "opening",
    "steps_fit",
    "give",
    "few",
    "grant",
    "preempt",
    "admit",
    "each_once",
    "advance",
    "recount",
    "sample",
    "step_time",
    "run_ends",
    "prefill_chunks",
)
try:  # the optional C extension (setup.py): scalar loops over the running arrays
    from harness.engine import _rows
except ImportError:  # not built (no C compiler at install): the same rules in Python
    _rows = None  # type: ignore[assignment]
if _rows is not None and (
    not all(hasattr(_rows, name) for name in _PASSES) or getattr(_rows, "_ABI", 1) != _ROWS_ABI
):
    _rows = None  # built before one of its passes was added or changed (not rebuilt): Python's
HAVE_C = _rows is not None
USE_C = HAVE_C and os.environ.get("HARNESS_PURE_KERNEL") != "1"
# a steady run's bound by the KV blocks (core.decode_steps_that_fit: ~20 numpy calls a run)
_steps_fit = _rows.steps_fit if USE_C else decode_steps_that_fit  # type: ignore[union-attr]


def fast_budget(policy: Policy, config: EngineConfig) -> int | None:
    """The step budget if this kernel executes ``policy`` exactly, else None: the policy
    declares :class:`~harness.policies.base.BudgetRule` (base.declared_rule).

    The kernel keeps no prefix cache, so it is exact only for requests without a prefix
    identity: a :class:`~harness.workload.trace.Trace` of lengths carries none (nothing can
    hit, whatever ``EngineConfig.prefix_caching`` says); hosts that add identities (sessions)
    run the engine core."""
    rule = declared_rule(policy)
    if rule is None or getattr(policy, "preempt_restarts", False):
        return None  # no rule, or preemption that discards output (engine core only)
    return config.token_budget if rule.budget is None else min(config.token_budget, rule.budget)


def fast_planner(policy: Policy, config: EngineConfig) -> Callable[[ColumnView], ColumnPlan] | None:
    """The column planner this kernel executes ``policy`` by (:meth:`ArrayEngine.execute_plan`),
    or None: a :class:`~harness.policies.columns.ColumnPolicy` planning through
    ``plan_columns`` (columns.column_planner) whose preemptions keep progress; exact for traces
    without prefix identities, as :func:`fast_budget`."""
    if getattr(policy, "preempt_restarts", False):
        return None
    return column_planner(policy)


class Rows:
    """Per trace row state shared by the engines of a run (each row lives in one engine).

    The arrays are written in place, never replaced: ``*_mv`` and ``c_*`` are memoryviews of
    them, made once (the C passes and the scalar paths read those, so a replaced array would
    go unseen there). Not picklable (memoryviews); results leave as :class:`SimResult`."""

    __slots__ = (
        "P",
        "M",
        "Orow",
        "first",
        "last",
        "state",
        "npre",
        "errors",
        "meta",
        "PM",
        "AT",
        "state_mv",
        "Orow_mv",
        "c_rows",
        "c_npre",
        "c_PM",
        "c_AT",
    )

    def __init__(self, P: list[int], M: list[int], meta: RowMeta | None = None) -> None:
        n = len(P)
        self.P = P
        self.M = M
        self.meta = meta  # ids, arrivals, tiers: for request objects (column policies)
        # the lengths, arrivals and TBT SLOs (NaN: none) as arrays, for the C admission pass
        # (copies: P, M and meta are never written after this)
        self.PM = np.array((P, M), dtype=np.int64).reshape(2, n)
        self.AT = (
            None
            if meta is None
            else np.array(
                (meta.arrival, [math.nan if x is None else x for x in meta.tbt]), dtype=np.float64
            ).reshape(2, n)
        )
        self.Orow = np.zeros(n, dtype=np.int64)  # outputs so far (kept across preemptions)
        self.first = np.full(n, np.nan)
        self.last = np.full(n, np.nan)
        self.state = np.zeros(n, dtype=np.int8)
        self.npre = np.zeros(n, dtype=np.int64)
        self.errors: dict[int, str] = {}
        # the same memory for one row at a time from Python: a memoryview's item is a Python
        # int (~60 ns a read or write against ~200 for a numpy scalar's); arrays for the rest
        self.state_mv = memoryview(self.state)
        self.Orow_mv = memoryview(self.Orow)
        # ... and for the C passes: a memoryview's buffer is lent in ~20 ns, a numpy array's
        # in ~120 (an admission passes eight)
        self.c_rows = (self.state_mv, self.Orow_mv, memoryview(self.first), memoryview(self.last))
        self.c_npre = memoryview(self.npre)
        self.c_PM = memoryview(self.PM)
        self.c_AT = None if self.AT is None else memoryview(self.AT)

    def status(self) -> np.ndarray:
        """The results' status column: 1 finished, 2 rejected, 0 otherwise (cancelled)."""
        status = np.zeros(len(self.state), dtype=np.int8)
        status[self.state == _FINISHED] = 1
        status[self.state == _REJECTED] = 2
        return status


class KernelColumns(RunningColumns):
    """:class:`RunningColumns` of the kernel's arrays, whose block count is one C pass."""

    __slots__ = ()

    def block_counts(self, block_size: int) -> tuple[int, int]:
        return _rows.blocks(self.computed, block_size)  # type: ignore[union-attr]


# the columns the kernel's views hand out (module docstring: C where built)
_COLUMNS = KernelColumns if USE_C else RunningColumns


def _lists_each_once_py(order: np.ndarray, n: int) -> bool:
    """Whether ``order`` lists each of the positions ``0 .. n-1`` exactly once. Such a run
    order of one-token decodes that fit the budget and the free KV runs like ``None`` (every
    running request): the order only matters when something is clipped or preempted."""
    if len(order) != n:
        return False
    if n and int(order.min()) < 0:  # a position outside them (bincount would raise)
        return False
    counts = np.bincount(order, minlength=n)
    return len(counts) == n and int(np.count_nonzero(counts)) == n


def _lists_each_once_c(order: np.ndarray, n: int) -> bool:
    """:func:`_lists_each_once_py` in C (``_rows.each_once``) for a plain int64 order."""
    if order.dtype == np.int64 and order.flags.c_contiguous:
        return _rows.each_once(order, n)  # type: ignore[union-attr]
    return _lists_each_once_py(order, n)


lists_each_once = _lists_each_once_c if USE_C else _lists_each_once_py


class ArrayEngine:
    """One engine's requests in numpy arrays and its budget-rule step (module docstring).

    ``steady_by_plan``: fast-forward a decode-only step when no admission was *planned*
    (vllm_v1 plans the waiting head while budget and seats are left and its first chunk fits
    the free KV at planning time, common.admit_list: the engine core's ``Plan.steady``), as
    the cluster's event loop must; else when none was *made* (the single engine: same token
    times, a run may start one step sooner). ``max_stall``: plans in a row that preempt and
    schedule nothing before the step waits for a release (simulate_cluster's
    max_stall_calls). ``planner``: a column policy's ``plan_columns``
    (:func:`fast_planner`), executed by :meth:`execute_plan`; ``budget`` is then the
    engine's token budget. ``hooks``: the policy to tell of arrivals and steps (its request
    objects are :class:`~harness.engine.row_requests.RowRequest`; ``rows.meta`` must be
    set)."""

    def __init__(
        self,
        budget: int,
        config: EngineConfig,
        cost_model: CostModel,
        rows: Rows,
        chunks: ChunkLog,
        n: int,
        *,
        error_prefix: str = "",
        steady_by_plan: bool = True,
        fast_forward: bool = True,
        max_stall: float = math.inf,
        planner: Callable[[ColumnView], ColumnPlan] | None = None,
        hooks: Policy | None = None,
    ) -> None:
        self.budget_cap = budget
        self.planner = planner
        # the policy whose on_arrival / on_step this engine calls (column policies with hooks)
        self.hooks = hooks
        # its on_step reads only the ids (base.hears_changes_only): no report of a step that
        # preempted, admitted and finished nobody (_report)
        self._changes_only = hooks is not None and reports_changes_only(hooks)
        self._finished_rows: list[int] = []  # this step's, kept only for hooks
        self._evicted: list[int] = []  # rows preempted this step (planner engines)
        self._promised = False  # the last plan's then_steady held after its step
        self._again: ColumnPlan | None = None  # the last plan, while it repeats (.repeats)
        self.rows = rows
        self.chunks = chunks
        self.error_prefix = error_prefix
        self.steady_by_plan = steady_by_plan
        self.fast_forward = fast_forward
        self.max_stall = max_stall
        self.bs = config.block_size
        self.total = config.total_blocks
        self.max_seqs = config.max_num_seqs
        self.cost_model = cost_model
        self.use_attn = bool(getattr(cost_model, "uses_prefill_attn", False))
        terms = step_terms(cost_model) if self._step_time_in_c else None
        if terms is not None:  # the model's arithmetic in C (``_rows.step_time``, ``run_ends``)
            self._step_time = partial(_rows.step_time, *terms)  # type: ignore[union-attr]
            self._run_end_times = partial(_rows.run_ends, *terms)  # type: ignore[union-attr]
        # a lone prefill run's chunks, in C under those terms
        self._chunks = None if terms is None else partial(_rows.prefill_chunks, *terms)  # type: ignore[union-attr]
        cap = max(1, min(self.max_seqs, n))  # running never exceeds either
        # prompt, outputs, computed, max_tokens, row; a running request's KV blocks are not
        # kept: between steps they are ceil(computed / block) (a step allocates exactly what
        # it computes), so they are derived where needed
        self.IA = np.zeros((5, cap), np.int64)
        self.FA = np.full((4, cap), np.nan)  # first / last token time, arrival, TBT SLO
        self.cols = (*self.IA, self.FA[0], self.FA[1])  # row views, made once (never move)
        # the same for one slot at a time from Python, and the arrays for the C passes
        # (Rows.state_mv and c_rows say why)
        self.mv = tuple(memoryview(a) for a in self.cols)
        self._IAm, self._FAm = memoryview(self.IA), memoryview(self.FA)
        # _grant_c's outputs (the grants, the kept positions after a lone victim), reused each
        # step (read within it): slices of these instead of a new array or two a step
        self._grants, self._kept = np.empty(cap, np.int64), np.empty(cap, np.int64)
        self._grants_m, self._kept_m = memoryview(self._grants), memoryview(self._kept)
        self.AR = self.FA[2]  # arrival times (column policies read them)
        self.TB = self.FA[3]  # TBT SLOs, NaN: none (column policies read them)
        self.R = 0  # running requests: the first R slots, in running (admission) order
        self.npf = 0  # running requests that are not decoding (prefilling or recomputing)
        self.used = 0
        # plans may admit out of queue order: a queue with removal anywhere
        self.waiting: deque[int] | WaitingQueue[int] = (
            deque() if planner is None else WaitingQueue()
        )
        self._objects: dict[int, RowRequest] = {}  # request objects made so far, by row
        # ColumnView parts (_view): the running columns by (prefilling, running) counts, keyed
        # npf * (cap + 1) + R; the fields that never change
        self._col_views: dict[int, RunningColumns] = {}
        self._npf_stride = cap + 1  # R <= cap: one key per pair
        self._view_fixed: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ())
        if planner is not None:
            self._view_fixed = (
                (self._waiting_tokens, WaitingRows(self.waiting, self.request)),  # type: ignore[arg-type]
                (
                    self.budget_cap,
                    self.max_seqs,
                    len(rows.P),
                    _row_of,
                    rows.meta.ids.__getitem__ if rows.meta is not None else None,
                ),
            )
        self.pm_total = 0  # prompt + max_tokens of live requests
        self.sum_c = 0  # computed tokens of the running requests (kept incrementally)
        # fewest tokens a running request has left to generate (exact): steps until the first
        # finish of a pure decode run, so pure steps skip the per-request finish test
        self.min_left = _NO_LEFT
        self.steady = False  # the last step was a steady plan and finished nobody
        self.preempt_total = 0
        self.finished_total = 0
        self.rejected = 0
        self.steps_total = 0
        self.calls = 0
        self.stall = 0
        # the telemetry rows (SAMPLE_COLS), one column each of a float64 block: one C call
        # writes a row (_sample_c), where ten appends cost ~1 us a step. A full block is kept
        # as it is and a larger one follows (_sample_room: nothing copied)
        self._S = np.empty((len(SAMPLE_COLS), 4096))
        self._Sm = memoryview(self._S)  # for the C passes (Rows.c_rows says why)
        self._S_cols = 4096  # the block's columns (its shape[1], read every step)
        self._ns = 0  # rows in _S
        self._full_blocks: list[np.ndarray] = []

    def add(self, j: int, t: float) -> bool:
        """Queue trace row ``j`` (released to this engine at ``t``); False, and the row
        rejected, if it can never fit (core.fit_problem)."""
        rows = self.rows
        problem = fit_problem(rows.P[j], rows.M[j], self.bs, self.total)
        if problem is not None:
            rows.state_mv[j] = _REJECTED
            rows.errors[j] = self.error_prefix + problem
            self.rejected += 1
            return False
        self.waiting.append(j)
        rows.state_mv[j] = _WAITING
        self.pm_total += rows.P[j] + rows.M[j]
        if self.hooks is not None:
            self.hooks.on_arrival(self.request(j), rows.meta.arrival[j])
        return True

    def request(self, j: int) -> RowRequest:
        """Row ``j``'s request object (made once; forgotten when it finishes)."""
        r = self._objects.get(j)
        if r is None:
            r = self._objects[j] = RowRequest(self.rows, self.rows.meta, j)
        return r

    def _retire(self, keep: np.ndarray) -> None:
        """Compact the running arrays to the rows in ``keep`` (a mask over the first R)."""
        IA, FA = self.IA, self.FA
        gone = np.flatnonzero(~keep)
        if len(gone) <= _FEW_GONE:
            for p in gone[::-1].tolist():
                self._close(p)
            return
        idx = np.flatnonzero(keep)
        k = len(idx)
        IA[:, :k] = IA[:, idx]
        FA[:, :k] = FA[:, idx]
        self.R = k

    def _close(self, p: int) -> None:
        """Remove running slot ``p``: the slots after it shift left (running order kept)."""
        IA, FA, R = self.IA, self.FA, self.R
        IA[:, p : R - 1] = IA[:, p + 1 : R]
        FA[:, p : R - 1] = FA[:, p + 1 : R]
        self.R = R - 1

    def _view(self, t: float, R: int) -> ColumnView:
        """The plan's :class:`ColumnView` of this engine's arrays. Built every plan, so from
        parts made once: the running columns per running count and count of prefilling
        requests (the arrays never move, so a view of the first R slots stays current; the
        entries are ~1 KB, at most :data:`_VIEW_CACHE` of them) and the fields that never
        change; the tuples are made directly (a NamedTuple's keyword call costs ~1 µs more a
        plan)."""
        npf = self.npf
        key = npf * self._npf_stride + R
        running = self._col_views.get(key)
        if running is None:
            if len(self._col_views) >= _VIEW_CACHE:
                self._col_views.clear()
            Pr, Or, Cr, Mr, IDr, _, Lr = self.cols
            running = self._col_views[key] = _tuple_new(
                _COLUMNS,
                (Pr[:R], Or[:R], Cr[:R], Mr[:R], self.AR[:R], npf, IDr[:R], Lr[:R], self.TB[:R]),
            )
        fixed_a, fixed_b = self._view_fixed
        kv = _tuple_new(KVView, (self.bs, self.total, self.used))
        return _tuple_new(ColumnView, (t, running, len(self.waiting), *fixed_a, kv, *fixed_b))

    def _waiting_tokens(self) -> Iterator[int]:
        """Remaining tokens of the waiting rows, host queue order (ColumnView.waiting_tokens)."""
        P, out = self.rows.P, self.rows.Orow_mv
        return (P[j] + out[j] for j in self.waiting)

    def execute_plan(self, t: float, until: float, hold_until: float) -> float | None:
        """One step at ``t`` under the column policy's plan (``planner``), as EngineCore.step
        executes a Plan: rule 1 (the plan's preemptions), rule 2 (clip to remaining tokens and
        budget in run order, KV shortage preempts from the tail of the run order), rule 3 (the
        planned admissions, only if rule 2 preempted nothing; head-of-line), rule 5; a steady
        plan's decode run is fast-forwarded over the steps that start before ``until``
        (``hold_until`` when the plan holds), bounded by the first finish and the KV blocks
        (EngineCore._fast_forward_len), and so is a ``steady_decodes`` plan's over the
        decoding requests (one request, the newest, waiting to prefill); a lone prefill plan
        runs as its prefill run from the first chunk (:meth:`_lone_prefill`). The policy's
        ``on_step`` hears of it as from the engine core, a run in one report (but not of a
        quiet step when it hears only changes, :meth:`_report`). Returns as :meth:`execute`."""
        assert self.planner is not None
        R = self.R
        waiting = self.waiting
        self._evicted.clear()
        self._finished_rows.clear()
        opening = -1  # the all-decode step's new blocks, where a kept promise counted them
        if self._promised:  # the last plan's then_steady: plan EVERY_DECODE without asking
            self._promised = False
            if R and not waiting and self.npf == 0 and self.budget_cap >= R:
                opening = self._opening(R)
                if opening > self.total - self.used:  # they would preempt: the policy decides
                    opening = -1
        again, self._again = self._again, None
        if opening >= 0:
            plan = EVERY_DECODE
        elif again is not None:  # the last plan repeats (ColumnPlan.repeats, set below)
            plan = again
        else:
            plan = self.planner(self._view(t, R))
        finished_before = self.finished_total
        lim = hold_until if plan.hold else until  # a holding plan runs past arrivals
        if plan.prefill_run and self.fast_forward:  # a lone prefill: its run, from chunk 1
            end = self._lone_prefill(plan, t, lim)
            if end is not None:
                return end
        Pr, Or, Cr = self.cols[:3]
        bs = self.bs
        total = self.total
        tok = plan.tokens
        order = plan.order
        if plan.preempt is not None and len(plan.preempt):  # rule 1, in order
            alive = np.ones(R, dtype=bool)
            for v in plan.preempt.tolist():
                if alive[v]:
                    alive[v] = False
                    self._evict(v)
            if order is not None:
                keep = alive[order]
                order = (np.cumsum(alive) - 1)[order[keep]]
                if isinstance(tok, np.ndarray):
                    tok = tok[keep]
            self._retire(alive)
            R = self.R
            self._recount()
        budget = self.budget_cap
        free = total - self.used
        preempted_in_run = False
        pure = False
        sp: np.ndarray | None = None
        sg: np.ndarray | None = None
        one_pass = False  # sp and sg from _grant (rule 5 then applies them in one pass)
        prefill = n_prefill = n_decode = kv_read = 0
        n_sched = 0
        attn = 0.0
        granted: list[tuple[int, int, int]] | None = None  # a few-item step's
        single_left = 0
        if R:
            if (
                self.npf == 0
                and budget >= R
                and not isinstance(tok, np.ndarray)
                and tok >= 1
                and (order is None or lists_each_once(order, R))
            ):  # every running request decodes its one token (in any order: all fit)
                need = opening if opening >= 0 else self._opening(R)
                if need <= free:
                    self.used += need
                    free -= need
                    budget -= R
                    pure = True
                    n_decode = n_sched = R
                    kv_read = self.sum_c + R
            if not pure and (isinstance(tok, np.ndarray) or tok > 0):
                if order is None:
                    order = np.arange(R)
                if len(order) <= _FEW and not self._evicted:  # a few items: in scalars
                    few, left, need, kv, dec, pre, work = self._few_items(order, tok, budget)
                    if need <= free:  # everything fits: rule 2 preempts nothing
                        budget = left
                        kv_read += kv
                        n_decode += dec
                        prefill += pre
                        attn += work
                        self.used += need
                        free -= need
                        n_sched = len(few)
                        n_prefill = n_sched - n_decode
                        if n_sched == 1:
                            single_left = few[0][2]  # > 0: p's row stays in place
                        granted = few
                        order = order[:0]  # done: skip the array pass
                got = self._grant(order, tok, budget) if len(order) else None
                if got is not None:  # rule 2 in one pass (preempting the tail if it must)
                    sp, sg, budget, n_sched, n_decode, prefill, attn, kv_read = got
                    one_pass = True
                    preempted_in_run = sp is not order
                    R = self.R
                    n_prefill = n_sched - n_decode
                    free = total - self.used
                    order = order[:0]  # done: skip the array pass
                if len(order):
                    req = tok if isinstance(tok, np.ndarray) else np.full(len(order), tok, np.int64)
                    Co = Cr[order]
                    Oo = Or[order]
                    rem = Pr[order] + Oo - Co
                    want = np.minimum(np.maximum(req, 0), rem)
                    sp, sg, budget, preempted_in_run = self._run_items(order, want, Co, budget)
                    free = total - self.used
                    if sp is not order:  # the sequential pass ran: its positions, compacted
                        R = self.R
                        Co = Cr[sp]
                        Oo = Or[sp]
                        rem = Pr[sp] + Oo - Co
                    ran, n_decode, prefill, attn, kv_read = self._composition(sg, Co, Oo, rem)
                    n_sched = int(np.count_nonzero(ran))
                    n_prefill = n_sched - n_decode

        # Rule 3: the planned admissions, only if rule 2 preempted nothing; head-of-line.
        R0 = R
        adm_g: list[int] = []
        adm_rows: list[int] = []
        if not preempted_in_run and (plan.admit or plan.admit_requests):
            P_l = self.rows.P
            Orow = self.rows.Orow_mv
            state = self.rows.state_mv
            if plan.admit_requests:
                items = [(r.index, n) for r, n in plan.admit_requests]  # type: ignore[attr-defined]
            else:
                items = [(None, n) for n in plan.admit]
            for j, n in items:
                if j is None:
                    if not waiting:
                        break
                    jj = waiting[0]
                elif state[j] != _WAITING:
                    continue  # not waiting (EngineCore: a plan bug, skipped)
                else:
                    jj = j
                if budget <= 0 or self.max_seqs <= self.R:
                    break
                o_j = Orow[jj]
                g = max(1, min(n, P_l[jj] + o_j, budget))
                if -(-g // bs) > free:
                    break
                free -= self._admit_head(g, j)
                if not adm_g:  # a prefill run's (below): the planned chunk, whether more follow
                    adm_n, adm_more = n, P_l[jj] + o_j - g > (o_j > 0)
                adm_g.append(g)
                adm_rows.append(jj)
                budget -= g
                prefill += g
                n_prefill += 1
                kv_read += g
                attn += g * g / 2
            R = self.R
        preempted = bool(self._evicted)

        if n_sched == 0 and not adm_g:  # nothing scheduled (EngineCore: idle)
            self.stall += 1
            self.steady = False
            if preempted:
                self._recount()
                if self.hooks is not None:
                    self._report(t, t, 0, 0, 0, 0, 0, ())
                if self.stall < self.max_stall:
                    return t  # the preemption changed the state: plan again
            return None  # waits for a release
        dur = self._step_time(prefill, n_decode, kv_read, attn)

        k = 1
        if (
            plan.steady and self.fast_forward and n_prefill == 0 and not preempted and n_sched == R
        ):  # EngineCore._fast_forward_len; step 1's blocks are allocated
            ends = self._decoding_run_ends(t, R, free, n_decode, kv_read, lim)
            if not len(ends):
                ends = [t + dur]
            k = len(ends)
            end = self._finish_run(t, ends, k, R)
        elif (
            plan.steady_decodes
            and self.fast_forward
            and n_prefill == 0
            and not preempted
            and not adm_g
            and self.npf == 1
            and n_sched == R - 1
            and not self._decoding_at(R - 1)  # the newest waits to prefill
            and len(ends := self._decoding_run_ends(t, R - 1, free, n_decode, kv_read, lim)) > 1
        ):  # the same over the decoding requests: the one waiting to prefill is the newest
            k = len(ends)
            end = self._finish_run(t, ends, k, R - 1, -(-self.mv[2][R - 1] // bs))
        else:
            end = self._advance(
                t, t + dur, R0, pure, sp, sg, adm_g, prefill, n_decode, granted, one_pass
            )
        if self.hooks is not None:
            self._report(t, end, k, prefill, n_decode * k, n_prefill, n_decode, adm_rows)
        # the next step's conditions (nothing waits, all decode, blocks fit) are checked then
        self._promised = plan.then_steady and not preempted and self.fast_forward
        if (
            plan.repeats
            and self.fast_forward
            and not preempted
            and not adm_g
            and self.finished_total == finished_before
            and end < lim
        ):
            # ColumnPlan.repeats: nothing came that ends the promise (an arrival unless the
            # plan holds, a finish, a preemption, an admission), so the next step's plan is
            # this one: usually the step a decode run stopped short of for its KV, where
            # rule 2 preempts from the tail of this order. It runs without asking.
            self._again = plan
        if plan.prefill_run and n_prefill and self.fast_forward:
            if single_left and not adm_g:  # a running request's chunk: its next ones
                return self._prefill_run(end, *granted[0][:2], lim)  # type: ignore[index]
            if not n_sched and len(adm_g) == 1 and adm_more:  # an admission ran alone, and
                # its prompt goes on: its slot is R0 (nothing else ran, so nothing left)
                return self._prefill_run(end, R0, adm_n, lim)
        return end

    def _decoding_at(self, p: int) -> bool:
        """base.is_decoding of running slot ``p``, from its scalars (columns.decoding_mask's
        test for one slot)."""
        Pm, Om, Cm = self.mv[0], self.mv[1], self.mv[2]
        o = Om[p]
        return o > 0 and Pm[p] + o - Cm[p] == 1

    def _few_items_c(
        self, order: np.ndarray, tok: np.ndarray | int, budget: int
    ) -> tuple[list[tuple[int, int, int]], int, int, int, int, int, float]:
        """:meth:`_few_items_py` in one pass of the C extension (``_rows.few``); order and
        tokens that are not contiguous int64 arrays (or an int) go to the Python pass, as
        :meth:`_grant_c` leaves them to the array pass."""
        want = tok if isinstance(tok, np.ndarray) else int(tok)
        try:
            return _rows.few(self._IAm, self.R, order, want, budget, self.bs)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            # another dtype or a strided array (lengths that differ: the loop's own error)
            return self._few_items_py(order, tok, budget)

    def _few_items_py(
        self, order: np.ndarray, tok: np.ndarray | int, budget: int
    ) -> tuple[list[tuple[int, int, int]], int, int, int, int, int, float]:
        """Rule 2's grants for a short run order, in scalars (numpy's per-call cost exceeds
        the work below :data:`_FEW` items): each item gets its tokens clipped to its remaining
        and the budget left; items granted nothing are dropped. Returns ``([(position,
        tokens, remaining after them)], budget left, blocks needed, and the step's
        composition with them: KV read, decodes, prefill tokens, attention work)``; nothing
        is allocated."""
        Pr, Or, Cr = self.mv[0], self.mv[1], self.mv[2]
        bs = self.bs
        few = []
        need = kv_read = n_decode = prefill = 0
        attn = 0.0
        toks = tok.tolist() if isinstance(tok, np.ndarray) else [tok] * len(order)
        for p, want in zip(order.tolist(), toks, strict=True):
            c = Cr[p]
            o = Or[p]
            rem = Pr[p] + o - c
            g = min(want, rem, budget)
            if g <= 0:
                continue
            few.append((p, g, rem - g))
            budget -= g
            need += -(-(c + g) // bs) - -(-c // bs)
            kv_read += c + g
            if rem == 1 and o > 0:  # a decode
                n_decode += 1
            else:
                prefill += g
                attn += g * (c + g / 2)
        return few, budget, need, kv_read, n_decode, prefill, attn

    def _lone_prefill(self, plan: ColumnPlan, t: float, lim: float) -> float | None:
        """A ``prefill_run`` plan of one prefilling request (a running position, or one
        admission) whose first chunk fits the free KV and leaves prompt to do, run from that
        chunk on by :meth:`_prefill_run`: the step the rules would make of it (nothing else
        runs, so nothing is clipped or preempted; an admission takes its slot with no KV
        yet, which the chunk allocates) and the chunks after it, told in one report. None
        (nothing done) for any other plan, or one that starts at or after ``lim``: the
        general path runs it."""
        tok = plan.tokens
        if (
            t >= lim
            or type(tok) is not int
            or plan.admit
            or (plan.preempt is not None and len(plan.preempt))
            or plan.order is None
        ):
            return None
        bs, cap, free = self.bs, self.budget_cap, self.total - self.used
        admitted: tuple[int, ...] = ()
        if plan.admit_requests:  # rule 3's one admission (EngineCore: head-of-line)
            if len(plan.order) or len(plan.admit_requests) != 1:
                return None
            r, tok = plan.admit_requests[0]
            j = r.index  # type: ignore[attr-defined]
            rows = self.rows
            if (
                rows.state_mv[j] != _WAITING
                or self.max_seqs <= self.R
                or type(tok) is not int
                or tok < 1
            ):
                return None
            o = rows.Orow_mv[j]
            g = min(tok, rows.P[j] + o, cap)
            if g < 1 or g >= rows.P[j] + o or -(-g // bs) > free:
                return None
            self._admit_head(0, j)
            self.npf += 1  # it joins not decoding
            if rows.M[j] - o < self.min_left:  # as rule 5 counts an admission's tokens left
                self.min_left = rows.M[j] - o
            p = self.R - 1
            admitted = (j,)
        else:  # a running request's next chunk
            if len(plan.order) != 1:
                return None
            p = plan.order.item(0)
            Pm, Om, Cm = self.mv[0], self.mv[1], self.mv[2]
            c = Cm[p]
            o = Om[p]
            rem = Pm[p] + o - c
            g = min(tok, rem, cap)
            if (o > 0 and rem == 1) or g <= 0 or g >= rem or -(-(c + g) // bs) - -(-c // bs) > free:
                return None
        self._promised = plan.then_steady
        return self._prefill_run(t, p, tok, lim, admitted)

    def _prefill_run(
        self, t: float, p: int, tok: int, until: float, admitted: Sequence[int] = ()
    ) -> float:
        """The chunks of position ``p``'s prefill (a ``ColumnPlan.prefill_run``) from its next,
        step by step exactly as :meth:`execute_plan` would run the re-issued plan (the same
        clipping, KV test, advance and telemetry row), without planning again; ``on_step``
        hears of them in one report (as of a steady decode run). Stops at the chunk that
        completes the prompt, at one whose KV does not fit (the policy decides then) and
        before a step that would start at or after ``until`` (the next arrival, or the stop
        time when the plan holds: the arrivals then join the queue after the run, and its
        telemetry rows count the queue as at its start, as a held decode run's row does). A
        chunk that leaves prompt to do emits nothing, so it is advanced here in scalars (what
        :meth:`_advance` does for it); the completing chunk goes through :meth:`_advance`, or
        in C (``_rows.prefill_chunks``) with its token given by :meth:`_give` when that token
        leaves the request running (nothing to retire before its telemetry row).
        ``admitted``: the row admitted into ``p`` by the run's first step
        (:meth:`_lone_prefill`), told in its report."""
        Pm, Om, Cm, Mm = self.mv[:4]
        o = Om[p]
        whole = Pm[p] + o  # tokens to compute; fixed until the prompt is done
        # the completing chunk in C: its token leaves it running, and nobody is to retire
        last_ok = Mm[p] - o > 1 and self.min_left > 0
        bs, cap, total = self.bs, self.budget_cap, self.total
        c = Cm[p]
        nb = -(-c // bs)
        chunks = self._chunks
        self._evicted.clear()
        self._finished_rows.clear()
        t0 = t
        k = tokens = 0
        done = False
        while t < until:
            if chunks is not None:  # the chunks in C (same rows; the completing one if last_ok)
                if self._ns == self._S_cols:
                    self._sample_room()
                t, c2, self.used, kk, last = chunks(
                    self._Sm, self._ns, t, until, c, whole, o, tok, cap, bs, self.used, total,
                    len(self.waiting), self.R, self.preempt_total, last_ok,
                )  # fmt: skip
                if kk:
                    self._ns += kk
                    k += kk
                    tokens += c2 - c + last
                    self.sum_c += c2 - c
                    self.calls += kk
                    self.steps_total += kk
                    c = c2
                    nb = -(-c // bs)
                    if last:  # the completing chunk ran: its token (rule 5, as _advance)
                        Cm[p] = c
                        self._give(((p, last),), t)
                        done = True
                        break
                    if o > 0 and whole - c == 1:  # recomputed up to its last token: decodes
                        self.npf -= 1
                    if t >= until:
                        break
            rem = whole - c
            if o > 0 and rem == 1:  # a recomputed request caught up: it decodes now
                break
            g = min(tok, rem, cap)
            nd = -(-(c + g) // bs) - nb
            if g <= 0 or nd > total - self.used:
                break
            nb += nd
            self.used += nd
            k += 1
            tokens += g
            end = t + self._step_time(g, 0, c + g, g * (c + g / 2))
            if g == rem:  # the prompt is done (p decodes now, or finishes and leaves its slot)
                Cm[p] = c
                t = self._advance(t, end, self.R, False, None, None, [], g, 0, [(p, g)])
                done = True
                break
            c += g
            if o > 0 and whole - c == 1:  # recomputed up to its last token: it decodes now
                self.npf -= 1
            self.sum_c += g
            self.calls += 1
            self.steps_total += 1
            self._sample(end, t, 1, g, 0)
            t = end
        if not done:
            Cm[p] = c
        if k:
            self.stall = 0
            self.steady = False
            if self.hooks is not None:
                self._report(t0, t, k, tokens, 0, 1, 0, admitted)
        return t

    def _step_time(self, prefill: int, n_decode: int, kv_read: int, attn: float) -> float:
        """The cost model's duration of a step of this composition (rule 5). An affine or
        context model's is computed in C instead where the extension is built (``__init__``:
        ``costmodel.step_terms``, the same floats)."""
        if self.use_attn:
            return self.cost_model.step_time(prefill, n_decode, kv_read, prefill_attn=attn)
        return self.cost_model.step_time(prefill, n_decode, kv_read)

    def _run_end_times(
        self, t: float, k_max: int, n_decode: int, kv_read: int, until: float
    ) -> Sequence[float]:
        """The end times of a fast-forwarded decode run (:func:`core.decode_run_ends`); for an
        affine or context model, a list from C instead where the extension is built
        (``__init__``: the same floats)."""
        return decode_run_ends(self.cost_model, t, k_max, n_decode, kv_read, until)

    def _recount_c(self) -> None:
        """:meth:`_recount_py` in one pass of the C extension (``_rows.recount``)."""
        self.min_left, self.npf = _rows.recount(self._IAm, self.R)  # type: ignore[union-attr]

    def _recount_py(self) -> None:
        """``min_left`` and ``npf`` from the arrays (after a change they do not track)."""
        Pr, Or, Cr, Mr = self.cols[:4]
        R = self.R
        self.min_left = int((Mr[:R] - Or[:R]).min()) if R else _NO_LEFT
        self.npf = R - int(np.count_nonzero(decoding_mask(Pr[:R], Or[:R], Cr[:R])))

    def _grant_c(
        self, order: np.ndarray, tok: np.ndarray | int, budget: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int, int, float, int] | None:
        """Rule 2 for run order ``order`` and the step's composition, in one pass of the C
        extension (``_rows.grant``: what :meth:`_run_items`, :meth:`_run_preempting` and
        :meth:`_composition` compute), the KV allocated; when it runs short, the items past the
        kept prefix are preempted (tail first: a lone last one by the pass itself, a longer
        tail here) and the running arrays compacted, as the array pass does. Returns
        ``(scheduled positions, their grants, budget left, scheduled, decodes, prefill tokens,
        attention work, KV read)``: ``order`` itself with every item's grant when nothing was
        preempted (the grants a view of a buffer the next step reuses). None when the plan's
        order and tokens are not contiguous int64 arrays and integers, or name a position
        twice: the array pass then does it all, as it did before (nothing was written). A
        position outside the running set raises IndexError (the array pass read a stale
        column there)."""
        arr = isinstance(tok, np.ndarray)
        if order.dtype != np.int64 or not order.flags.c_contiguous:
            return None
        if arr:
            if tok.dtype != np.int64 or len(tok) != len(order) or not tok.flags.c_contiguous:
                return None
        elif not isinstance(tok, _INTS):
            return None
        rows = self.rows
        state, orow, first, last = rows.c_rows  # (each an argument: a * call costs ~0.2 us)
        got = _rows.grant(  # type: ignore[union-attr]
            self._IAm,
            self._FAm,
            self.R,
            order,
            tok if arr else None,
            0 if arr else tok,
            budget,
            self.bs,
            self.total - self.used,
            self.use_attn,
            self._grants_m,
            self._kept_m,
            state,
            orow,
            first,
            last,
            rows.c_npre,
        )
        if got is None:
            return None
        left, n_sched, n_decode, prefill, attn, kv_read, need, kept, m, blocks, comp, row = got
        self.used += need
        if m >= 0:  # the pass preempted the one victim (the usual shortage)
            self._requeue(row, blocks, comp)
            self.R -= 1
            return self._kept[:m], self._grants[:m], left, n_sched, n_decode, prefill, attn, kv_read
        sg = self._grants[: len(order)]
        if kept < len(order):  # the KV ran short: the tail is preempted (_run_preempting)
            order, sg = self._preempt_tail(order, sg, kept)
        return order, sg, left, n_sched, n_decode, prefill, attn, kv_read

    def _grant_py(
        self, order: np.ndarray, tok: np.ndarray | int, budget: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int, int, float, int] | None:
        """No one-pass rule 2 in Python: the array pass (:meth:`_run_items`) does it."""
        return None

    def _apply(self, sp: np.ndarray, sg: np.ndarray, end: float, one_pass: bool) -> None:
        """Rule 5 for positions ``sp`` granted ``sg`` tokens in a step ending at ``end``: their
        KV grows, and those whose KV then covers prompt and outputs emit a token;
        their trace rows are logged. ``one_pass``: the grants are :meth:`_grant_c`'s (distinct
        plain int64 positions), applied in one C pass (``_rows.advance``, which writes the
        rows into the chunk log)."""
        if one_pass:
            log = self.chunks
            buf, at = log.room(len(sp))
            k, g, self.min_left, self.npf = _rows.advance(  # type: ignore[union-attr]
                self._IAm, self._FAm, self.R, sp, sg, end, buf, at
            )
            self.sum_c += g
            log.wrote(end, k)
            return
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        Cr[sp] += sg
        self.sum_c += int(sg.sum())
        hit = sp[Cr[sp] == Pr[sp] + Or[sp]]
        Or[hit] += 1
        Lr[hit] = end
        fh = Fr[hit]
        Fr[hit] = np.where(np.isnan(fh), end, fh)
        if len(hit):
            self.chunks.add_step(end, IDr[hit])

    def _report(
        self,
        t: float,
        end: float,
        k: int,
        prefill: int,
        decode_tokens: int,
        n_prefill: int,
        n_decode: int,
        admitted: Sequence[int],
    ) -> None:
        """The policy's ``on_step`` (EngineCore.step's StepReport), ids from the rows; none
        for a step that preempted, admitted and finished nobody when the policy hears only of
        those (``_changes_only``)."""
        fin = self._finished_rows
        if self._changes_only and not (admitted or fin or self._evicted):
            return
        ids = self.rows.meta.ids
        assert self.hooks is not None
        self.hooks.on_step(
            _tuple_new(  # StepReport's fields in order, without its keyword call
                StepReport,
                (
                    t,  # start_s
                    end - t,  # duration_s
                    k,  # num_steps
                    prefill,  # prefill_tokens
                    decode_tokens,
                    n_prefill,  # num_prefill_seqs
                    n_decode,  # num_decode_seqs
                    self.used,  # kv_used_blocks
                    tuple([ids[j] for j in self._evicted]) if self._evicted else (),  # preempted
                    tuple([ids[j] for j in admitted]) if admitted else (),  # admitted
                    tuple([ids[j] for j in fin]) if fin else (),
                ),
            )
        )

    def _decoding_run_ends(
        self, t: float, R: int, free: int, n_decode: int, kv_read: int, until: float
    ) -> Sequence[float]:
        """The end times of a decode run of the first ``R`` running requests (step 1's
        blocks allocated, ``free`` blocks left): EngineCore._fast_forward_len's bounds, the
        fewest tokens any running request has left (a parked one after them included: at
        or before the first finish), the KV blocks and ``until``; none when the first two
        allow one step."""
        if self.min_left <= 1:
            return ()
        k_max = _steps_fit(self.cols[2][:R], self.min_left, self.bs, free)
        return self._run_end_times(t, k_max, n_decode, kv_read, until) if k_max > 1 else ()

    def _finish_run(
        self, t: float, ends: Sequence[float], k: int, R: int, parked: int | None = None
    ) -> float:
        """Advance a pure decode run of ``k`` steps of the first ``R`` running requests (step
        1's blocks allocated) and record it. ``parked``: the blocks of the one request after
        them, which waits to prefill (ColumnPlan.steady_decodes), else None: they are every
        running request."""
        end = float(ends[-1])
        self.calls += 1
        self.stall = 0
        if k > 1:
            # the running requests hold every used block (the first R, and the parked one)
            self.used = self._decode(R, k, end, True, ends) + (parked or 0)
        else:
            self._decode(R, 1, end, False)
        self.sum_c += R * k
        if parked is None:
            self.min_left -= k
        else:  # the waiting one's tokens left did not move: all of them read again
            self._recount()
        finished = self.min_left <= 0 and self._finish()
        self._sample(end, t, k, 0, R * k)
        self.steps_total += k
        # the plan was steady (over every running request) and nothing else happened
        self.steady = parked is None and not finished
        return end

    def _advance(
        self,
        t: float,
        end: float,
        R0: int,
        pure: bool,
        sp: np.ndarray | None,
        sg: np.ndarray | None,
        adm_g: list[int],
        prefill: int,
        n_decode: int,
        few: Sequence[tuple[int, ...]] | None = None,
        one_pass: bool = False,
    ) -> float:
        """Rule 5 for one step from ``t`` to ``end``: advance what ran (``pure``: every one of
        the first ``R0`` decoded; ``few``: ``(p, g, ...)``, position p got g tokens, nothing
        was preempted (:meth:`_give`: a short run order); else positions ``sp`` got ``sg``
        tokens; then the admissions in slots ``R0`` on got ``adm_g``), sample, retire the
        finished, record the step."""
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        self.calls += 1
        self.stall = 0
        if few is not None:
            self._give(few, end)
        elif pure:
            self._decode(R0, 1, end, False)  # its rows logged before anything moves
            self.sum_c += R0
            self.min_left -= 1
        elif sp is not None and len(sp):
            self._apply(sp, sg, end, one_pass)
        if adm_g:  # they join not decoding (no KV yet), then get their first chunks
            self.npf += len(adm_g)
            self._give(list(enumerate(adm_g, start=R0)), end)
        if sp is not None and not (one_pass and len(sp) and not adm_g):
            # the array pass ran (pure, few and admissions keep them exactly; a one-pass
            # _apply recounted, unless admissions joined after it)
            self._recount()  # (finishing below removes decoding requests only: npf holds)
        if self.min_left <= 0:
            self._finish()
        self.steps_total += 1
        self._sample(end, t, 1, prefill, n_decode)
        self.steady = False
        return end

    def _decode_c(
        self, R: int, k: int, end: float, blocks: bool, ends: Sequence[float] = ()
    ) -> int:
        """:meth:`_decode_py` in one pass of the C extension (``_rows.decode``: it writes the
        rows into the chunk log's buffer itself)."""
        log = self.chunks
        buf, at = log.room(R * k)
        held = _rows.decode(self._IAm, self._FAm, R, k, end, self.bs, buf, at)  # type: ignore[union-attr]
        if k == 1:
            log.wrote(end, R)
        else:
            log.wrote_run(ends, R)
        return held

    def _decode_py(
        self, R: int, k: int, end: float, blocks: bool, ends: Sequence[float] = ()
    ) -> int:
        """Each of the first ``R`` running requests computes and emits ``k`` tokens, the last
        at ``end`` (``ends``: the ``k`` steps' ends when ``k > 1``), recorded in the chunk
        log; with ``blocks``, returns the KV blocks they then hold (else 0: the caller keeps
        ``used`` itself)."""
        self.IA[1:3, :R] += k  # outputs and computed tokens (adjacent rows: one call)
        self.cols[6][:R] = end
        if R:
            if k == 1:
                self.chunks.add_step(end, self.cols[4][:R])
            else:
                self.chunks.add_run(ends, self.cols[4][:R])  # ChunkLog copies the rows
        if not blocks:
            return 0
        return int(((self.cols[2][:R] + (self.bs - 1)) // self.bs).sum())

    def _opening_c(self, R: int) -> int:
        """:meth:`_opening_py` in the C extension (``_rows.opening``)."""
        return _rows.opening(self._IAm, R, self.bs)  # type: ignore[union-attr]

    def _opening_py(self, R: int) -> int:
        """How many of the first ``R`` running requests open a KV block by decoding one more
        token (their computed tokens fill whole blocks): the new blocks of an all-decode step."""
        return int(np.count_nonzero(self.cols[2][:R] % self.bs == 0))

    def _give_c(self, items: Sequence[tuple[int, ...]], end: float) -> None:
        """:meth:`_give_py` in one pass of the C extension (``_rows.give``)."""
        log = self.chunks
        buf, at = log.room(len(items))
        k, g, npf, m = _rows.give(self._IAm, self._FAm, items, end, buf, at)  # type: ignore[union-attr]
        self.sum_c += g
        self.npf += npf
        if m < self.min_left:
            self.min_left = m
        log.wrote(end, k)

    def _give_py(self, items: Sequence[tuple[int, ...]], end: float) -> None:
        """Rule 5 in scalars for ``(position p, g tokens, ...)`` items of a step ending at
        ``end``: p's KV grows by g, and a request whose KV then covers its prompt and output
        emits a token at ``end``; ``npf`` and ``min_left`` are kept exactly (a request counted
        in ``npf`` before the step is one that was not decoding)."""
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        hits: list[int] = []
        for p, g, *_ in items:
            c = int(Cr[p]) + g
            Cr[p] = c
            self.sum_c += g
            o = int(Or[p])
            prompt = int(Pr[p])
            was_decoding = o > 0 and prompt + o - c + g == 1
            if c == prompt + o:
                o += 1
                Or[p] = o
                Lr[p] = end
                if Fr[p] != Fr[p]:
                    Fr[p] = end
                hits.append(int(IDr[p]))
            self.npf += was_decoding - (o > 0 and prompt + o - c == 1)
            m = int(Mr[p]) - o
            if m < self.min_left:
                self.min_left = m
        if hits:
            self.chunks.add_step(end, hits)

    def _finish_c(self) -> bool:
        """:meth:`_finish_py` in one pass of the C extension (``_rows.finish``)."""
        rows = self.rows
        state, orow, first, last = rows.c_rows  # (arguments each: _grant_c says why)
        got = _rows.finish(  # type: ignore[union-attr]
            self._IAm, self._FAm, self.R, self.bs, state, orow, first, last
        )
        if got is None:
            return False
        self.R, fin, blocks, pm, c, self.min_left = got
        self.used -= blocks
        self.pm_total -= pm
        self.sum_c -= c
        self.finished_total += len(fin)
        self._forget(fin)
        return True

    def _finish_py(self) -> bool:
        """Retire the running requests that reached max_tokens; refresh ``min_left``."""
        R = self.R
        IA, FA = self.IA, self.FA
        Or, Mr = self.cols[1], self.cols[3]
        left = Mr[:R] - Or[:R]
        done = left <= 0
        gone = done.nonzero()[0]
        if len(gone) == 0:
            return False
        rows = self.rows
        if len(gone) <= _FEW_GONE:  # the usual case: scalar reads, one shift of the tails each
            state, Orow, first, last = rows.state, rows.Orow, rows.first, rows.last
            bs = self.bs
            fin = []
            for p in gone[::-1].tolist():  # from the tail: the positions before stay put
                pr, o, c, m, j = IA[:, p].tolist()
                fin.append(j)
                state[j] = _FINISHED
                Orow[j] = o
                first[j] = FA[0, p]
                last[j] = FA[1, p]
                self.used -= -(-c // bs)
                self.pm_total -= pr + m
                self.sum_c -= c
                IA[:, p : R - 1] = IA[:, p + 1 : R]
                FA[:, p : R - 1] = FA[:, p + 1 : R]
                R -= 1
                left[p] = _NO_LEFT
            self.R = R
            self.finished_total += len(fin)
            self.min_left = int(left.min())  # _NO_LEFT when they were the last ones
            fin.reverse()  # running order
            self._forget(fin)
            return True
        out = IA[:, gone]  # the finished requests' columns, one gather
        ids = out[4]
        rows.state[ids] = _FINISHED
        rows.Orow[ids] = out[1]
        rows.first[ids], rows.last[ids] = FA[:2, gone]
        pr, _, c, m, _ = out.sum(axis=1).tolist()
        self.used -= int(((out[2] + (self.bs - 1)) // self.bs).sum())
        self.pm_total -= pr + m
        self.sum_c -= c
        self._retire(~done)
        self.finished_total += len(ids)
        R = self.R
        self.min_left = int((Mr[:R] - Or[:R]).min()) if R else _NO_LEFT
        self._forget(ids.tolist())
        return True

    def _forget(self, fin: list[int]) -> None:
        """The finished rows ``fin`` (running order): reported to the policy with the step,
        their request objects dropped."""
        if self.hooks is not None:
            self._finished_rows.extend(fin)
        if self._objects:
            for j in fin:
                self._objects.pop(j, None)

    def _run_items(
        self, order: np.ndarray, want: np.ndarray, comp: np.ndarray, budget: int
    ) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Rule 2 for run items ``order`` (running positions in run order) wanting ``want``
        tokens (already clipped to their remaining), ``comp`` their computed tokens: each is
        granted its want clipped to the budget left, and the KV for it is allocated; when it
        does not all fit, :meth:`_run_preempting` preempts from the tail. Returns ``(scheduled
        positions, their tokens, budget left, preempted any)``: ``order`` itself (all of it,
        zero grants included) when everything fit."""
        if int(want.sum()) <= budget:
            grant = want
        else:  # the sequential clip: budget left before an item = budget - sum of earlier wants
            before = np.cumsum(want) - want
            grant = np.minimum(want, np.maximum(budget - before, 0))
        bs = self.bs
        need = (comp + grant + (bs - 1)) // bs - (comp + (bs - 1)) // bs
        tot = int(need.sum())
        if tot <= self.total - self.used:
            self.used += tot
            return order, grant, budget - int(grant.sum()), False
        return self._run_preempting(order, grant, need, budget)

    def _composition(
        self, sg: np.ndarray, comp: np.ndarray, out: np.ndarray, rem: np.ndarray
    ) -> tuple[np.ndarray, int, int, float, int]:
        """The step's composition, the cost model's input (EngineCore.step): of the items
        granted ``sg`` tokens (``comp`` computed, ``out`` output, ``rem`` remaining before the
        step), a decode is one token of a request whose KV covers all but its last token; the
        rest are prefill chunks. Returns ``(granted mask, decodes, prefill tokens, prefill
        attention work, KV tokens read)``."""
        d = (out > 0) & (rem == 1)
        ran = sg > 0
        n_decode = int(np.count_nonzero(d & ran))
        pg = sg[~d]
        attn = float((pg * (comp[~d] + pg / 2)).sum()) if self.use_attn else 0.0
        return ran, n_decode, int(pg.sum()), attn, int((comp + sg)[ran].sum())

    def _run_preempting(
        self, order: np.ndarray, grant: np.ndarray, need: np.ndarray, budget: int
    ) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Rule 2 for a run whose KV does not fit (base.py rule 2; EngineCore.step's
        sequential pass), in closed form: item by item, a KV shortage preempts (recompute)
        from the tail of ``order`` until the item fits, or the item itself. Victims come from
        the tail and the items before them keep their grants, so the pass keeps the longest
        prefix of ``order`` whose KV need fits in the free blocks plus all the blocks the rest
        hold, and preempts the rest, the tail first. ``grant``: the items' tokens (the budget's
        clip, which a prefix does not change), ``need``: their new blocks. The running arrays
        are then compacted. Returns ``(scheduled positions after compaction, their tokens,
        budget left, True)``; ``self.used`` is updated."""
        bs = self.bs
        need = np.where(grant > 0, need, 0)  # an item given nothing allocates nothing
        held = (self.cols[2][order] + (bs - 1)) // bs
        # fits[k]: the first k items' need <= free + what the items from k on hold
        spent = np.concatenate(([0], np.cumsum(need)))
        freed = np.concatenate((np.cumsum(held[::-1])[::-1], [0]))
        k = int(np.count_nonzero(spent <= (self.total - self.used) + freed)) - 1
        self.used += int(need[:k].sum())
        sp, sg = self._preempt_tail(order, grant, k)
        return sp, sg, budget - int(grant[:k].sum()), True

    def _preempt_tail(
        self, order: np.ndarray, grant: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Preempt the run items past the first ``k`` of ``order`` (the tail first, as rule
        2's sequential pass meets them) and compact the running arrays; returns the kept
        items granted anything, as positions after compaction, and their grants."""
        g = grant[:k]
        ran = g > 0
        if k == len(order) - 1:  # one victim (the usual): its slot closed, the later shift
            v = int(order[k])
            kept = order[:k][ran]
            if not (kept == v).any():  # (an array-pass order may name it twice: below)
                self._preempt(v)
                return kept - (kept > v), g[ran]
        for v in order[k:][::-1].tolist():
            self._evict(v)
        alive = np.ones(self.R, dtype=bool)
        alive[order[k:]] = False
        sp = (np.cumsum(alive) - 1)[order[:k][ran]]
        self._retire(alive)
        return sp, g[ran]

    def _evict(self, v: int) -> None:
        """Recompute-preempt running slot ``v`` (base.py rules 1-2): its KV freed, its progress
        kept in the rows, its row at the front of waiting. The slot is left for the caller
        to compact away (``_retire``)."""
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        rows = self.rows
        comp = int(Cr[v])
        row = int(IDr[v])
        rows.Orow[row] = Or[v]
        rows.first[row] = Fr[v]
        rows.last[row] = Lr[v]
        rows.npre[row] += 1
        rows.state[row] = _WAITING
        self._requeue(row, -(-comp // self.bs), comp)

    def _requeue(self, row: int, blocks: int, comp: int) -> None:
        """A preempted request's KV blocks and computed tokens given back, its trace row at
        the front of waiting, counted and told to the policy (:meth:`_report`)."""
        self.used -= blocks
        self.sum_c -= comp
        self.waiting.appendleft(row)
        self.preempt_total += 1
        self._evicted.append(row)

    def _preempt_py(self, v: int) -> None:
        """Recompute-preempt running slot ``v`` and close it (the later slots shift left)."""
        self._evict(v)
        self._close(v)

    def _preempt_c(self, v: int) -> None:
        """:meth:`_preempt_py` in one pass of the C extension (``_rows.preempt``)."""
        rows = self.rows
        state, orow, first, last = rows.c_rows  # (arguments each: _grant_c says why)
        blocks, comp, row = _rows.preempt(  # type: ignore[union-attr]
            self._IAm, self._FAm, self.R, v, self.bs, state, orow, first, last, rows.c_npre
        )
        self._requeue(row, blocks, comp)
        self.R -= 1

    def _admit_head_c(self, g: int, j: int | None = None) -> int:
        """:meth:`_admit_head_py` with the slot written in C (``_rows.admit``)."""
        rows = self.rows
        head = j is None
        if head:
            j = self.waiting[0]
        state, orow, first, last = rows.c_rows  # (arguments each: _grant_c says why)
        nd = _rows.admit(  # type: ignore[union-attr]
            self._IAm, self._FAm, self.R, j, g, self.bs, state, orow, first, last, rows.c_PM,
            rows.c_AT,
        )  # fmt: skip
        if head:  # off the queue once admitted (an error above leaves it queued)
            self.waiting.popleft()
        else:
            self.waiting.remove(j)
        self.R += 1
        self.used += nd
        return nd

    def _admit_head_py(self, g: int, j: int | None = None) -> int:
        """Move the waiting head (or waiting row ``j``) into running slot ``R`` with a first
        chunk of ``g`` tokens (allocated, not yet computed); returns the blocks it took."""
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        rows = self.rows
        R = self.R
        if j is None:
            j = self.waiting.popleft()
        else:
            self.waiting.remove(j)
        nd = -(-g // self.bs)
        rows.state[j] = _RUNNING
        Pr[R] = rows.P[j]
        Or[R] = rows.Orow[j]
        Cr[R] = 0
        Mr[R] = rows.M[j]
        IDr[R] = j
        Fr[R] = rows.first[j]
        Lr[R] = rows.last[j]
        if rows.meta is not None:
            self.AR[R] = rows.meta.arrival[j]
            tbt = rows.meta.tbt[j]
            self.TB[R] = math.nan if tbt is None else tbt
        self.R = R + 1
        self.used += nd
        return nd

    @property
    def samples(self) -> dict[str, np.ndarray]:
        """The telemetry columns so far (SAMPLE_COLS): new numpy arrays of the types of
        :func:`new_samples`'s (read after a run: each access copies them)."""
        return sample_columns([*self._full_blocks, self._S[:, : self._ns]])

    def _sample_room(self) -> None:
        """A new sample block after a full one, twice its columns (a short run stays small;
        pages are touched only as rows are written); the full one is kept as it is (copying
        it into the larger block cost ~0.2 s a million steps and twice its pages; blocks of
        a fixed 64k rows fragmented the heap: +35 MiB at the summary's peak)."""
        self._full_blocks.append(self._S[:, : self._ns])
        self._S_cols *= 2
        self._S = np.empty((len(SAMPLE_COLS), self._S_cols))
        self._Sm = memoryview(self._S)
        self._ns = 0

    def _sample_c(self, end: float, t: float, k: int, prefill: int, decode: int) -> None:
        """:meth:`_sample_py` in one call of the C extension (``_rows.sample``)."""
        if self._ns == self._S_cols:
            self._sample_room()
        n = self._ns
        _rows.sample(  # type: ignore[union-attr]
            self._Sm,
            n,
            end,
            t,
            k,
            prefill,
            decode,
            self.used,
            self.bs,
            self.total,
            len(self.waiting),
            self.R,
            self.preempt_total,
        )
        self._ns = n + 1

    def _sample_py(self, end: float, t: float, k: int, prefill: int, decode: int) -> None:
        """One telemetry row (SAMPLE_COLS) for the step(s) from ``t`` to ``end``."""
        if self._ns == self._S_cols:
            self._sample_room()
        n = self._ns
        used = self.used
        self._S[:, n] = (
            end,
            k,
            end - t,
            prefill,
            decode,
            used * self.bs,
            used / self.total,
            len(self.waiting),
            self.R,
            self.preempt_total,
        )
        self._ns = n + 1

    def execute(self, t: float, until: float) -> float | None:
        """One step at ``t`` under the budget rule (pass 1: the running requests, pass 2: FCFS
        admission), fast-forwarding a steady decode run over the steps that start before
        ``until``; the step's end, ``t`` to plan again after a preemption that scheduled
        nothing, or None when nothing can run before a release."""
        Pr, Or, Cr, Mr, IDr, Fr, Lr = self.cols
        rows = self.rows
        bs = self.bs
        total = self.total
        R = self.R
        budget = self.budget_cap
        self._evicted.clear()
        used = self.used
        free0 = free = total - used
        waiting = self.waiting
        preempted_any = False
        pure = False
        sp: np.ndarray | None = None
        sg: np.ndarray | None = None
        one_pass = False  # sp and sg from _grant (rule 5 then applies them in one pass)
        prefill = n_decode = kv_read = 0
        attn = 0.0
        if R:
            Cv = Cr[:R]
            if self.npf == 0 and budget >= R:
                tot_need = self._opening(R)
                if tot_need <= free:
                    used += tot_need
                    free -= tot_need
                    budget -= R
                    pure = True
                    n_decode = R
                    kv_read = self.sum_c + R
            if not pure:
                Ov = Or[:R]
                rem = Pr[:R] + Ov - Cv
                dec = (Ov > 0) & (rem == 1)
                n_dec_all = int(np.count_nonzero(dec))
                if n_dec_all == R:
                    ordp = np.arange(R)
                else:
                    ordp = np.concatenate((np.flatnonzero(dec), np.flatnonzero(~dec)))
                # each wants all it has left (the budget clips): one C pass, preempting the
                # tail when the KV runs short (the array pass where the extension is missing)
                got = self._grant(ordp, _ALL_LEFT, budget)
                if got is not None:
                    sp, sg, budget, _, n_decode, prefill, attn, kv_read = got
                    one_pass = True
                    preempted_any = sp is not ordp
                else:
                    sp, sg, budget, preempted_any = self._run_items(
                        ordp, rem[ordp], Cv[ordp], budget
                    )
                used = self.used
                free = total - used
                R = self.R
                if len(sp) and not one_pass:
                    Co = Cr[sp]
                    Oo = Or[sp]
                    _, n_decode, prefill, attn, kv_read = self._composition(
                        sg, Co, Oo, Pr[sp] + Oo - Co
                    )

        # The policy's plan is steady (Plan.steady: all decode, nothing admitted) when no
        # admission is planned: vllm_v1 plans the waiting head while budget and seats are
        # left and its first chunk fits the free KV at planning time (common.admit_list).
        steady_plan = pure
        if pure and self.steady_by_plan and waiting and budget > 0 and self.max_seqs - R > 0:
            j = waiting[0]
            rj = rows.P[j] + rows.Orow_mv[j]
            g = rj if rj < budget else budget
            if -(-g // bs) <= free0:
                steady_plan = False

        # ---- pass 2: FCFS admissions (head-of-line) --------------------------------------------
        R0 = R
        adm_g: list[int] = []
        self.R = R
        self.used = used
        if not preempted_any and waiting:
            seats = self.max_seqs - R
            P_l = rows.P
            Orow = rows.Orow_mv
            while waiting and budget > 0 and seats > 0:
                j = waiting[0]
                rj = P_l[j] + Orow[j]
                g = rj if rj < budget else budget
                if -(-g // bs) > free:
                    break
                free -= self._admit_head(g)
                adm_g.append(g)
                budget -= g
                seats -= 1
                prefill += g
                kv_read += g
                attn += g * g / 2
            R = self.R

        if n_decode == 0 and prefill == 0:  # nothing scheduled (cluster._execute's idle)
            self.stall += 1
            self.steady = False
            if preempted_any:
                self.min_left = int((Mr[:R] - Or[:R]).min()) if R else _NO_LEFT
            if preempted_any and self.stall < self.max_stall:
                return t  # the preemption changed the state: plan again
            return None  # waits for a release
        dur = self._step_time(prefill, n_decode, kv_read, attn)

        by_plan = self.steady_by_plan
        if steady_plan and not by_plan:  # the single engine: nothing admitted, a later step
            steady_plan = self.fast_forward and not adm_g and t + dur < until
        if steady_plan:  # EngineCore._fast_forward_len; step 1's blocks are allocated
            ends = self._decoding_run_ends(t, R, free, n_decode, kv_read, until)
            if len(ends) > 1 or by_plan:
                return self._finish_run(t, ends if len(ends) else [t + dur], len(ends) or 1, R)

        return self._advance(
            t, t + dur, R0, pure, sp, sg, adm_g, prefill, n_decode, one_pass=one_pass
        )

    # the C passes where the extension is built, unless HARNESS_PURE_KERNEL=1 (module docstring)
    _finish = _finish_c if USE_C else _finish_py
    _decode = _decode_c if USE_C else _decode_py
    _give = _give_c if USE_C else _give_py
    _few_items = _few_items_c if USE_C else _few_items_py
    _opening = _opening_c if USE_C else _opening_py
    _grant = _grant_c if USE_C else _grant_py
    _recount = _recount_c if USE_C else _recount_py
    _preempt = _preempt_c if USE_C else _preempt_py
    _admit_head = _admit_head_c if USE_C else _admit_head_py
    _sample = _sample_c if USE_C else _sample_py
    _step_time_in_c = USE_C  # an affine or context model's step time (__init__)


def row_meta(trace: Trace, arrival: list[float], M: list[int], config: EngineConfig) -> RowMeta:
    """The request fields each trace row gets as a request (both simulator hosts): its tier
    and the tier's priority and SLOs (priority 0, no SLOs for a tier the trace does not
    list), and the output length as prediction when policies may know it
    (``EngineConfig.known_output_lengths``)."""
    df = trace.df
    tiers = df["tier"].tolist()
    by = {t.name: (t.priority, t.ttft_slo_s, t.tbt_slo_s) for t in trace.tiers}
    fields = [by.get(t, (0, None, None)) for t in tiers]
    return RowMeta(
        ids=df["request_id"].tolist(),
        arrival=arrival,
        tier=tiers,
        priority=[f[0] for f in fields],
        ttft=[f[1] for f in fields],
        tbt=[f[2] for f in fields],
        predicted=M if config.known_output_lengths else None,
    )


def fast_simulate(
    trace: Trace,
    policy: Policy,
    cost_model: CostModel,
    config: EngineConfig,
    *,
    stop_at_s: float | None = None,
    chunk_sink: Any = None,
    chunk_flush_rows: int = 2_000_000,
    fast_forward: bool = True,
    max_stall_calls: int = 1000,
    on_interrupt: str = "raise",
) -> Any:
    """Same contract and result as :func:`harness.engine.simulate.simulate`: one
    :class:`ArrayEngine` driven over the trace, releases at their arrival times; the budget
    rule (:func:`fast_budget`) or a column policy's plans (:func:`fast_planner`)."""
    budget_cap = fast_budget(policy, config)
    planner = None
    if budget_cap is None:
        planner = fast_planner(policy, config)
        if planner is None:
            raise ValueError(f"no fast kernel for policy {getattr(policy, 'name', policy)!r}")
        budget_cap = config.token_budget
    wall0 = time.perf_counter()
    df = trace.df
    n = len(df)
    arr_l = df["arrival_s"].to_numpy(dtype=float).tolist()
    P = df["prompt_len"].to_numpy(dtype=np.int64).tolist()
    M = df["output_len"].to_numpy(dtype=np.int64).tolist()
    rows = Rows(P, M, row_meta(trace, arr_l, M, config) if planner is not None else None)
    chunks = ChunkLog(chunk_sink, chunk_flush_rows)
    eng = ArrayEngine(
        budget_cap,
        config,
        cost_model,
        rows,
        chunks,
        n,
        steady_by_plan=False,
        fast_forward=fast_forward,
        # the engine core's loop retries preempting plans that schedule nothing this often
        max_stall=max_stall_calls if planner is not None else math.inf,
        planner=planner,
        hooks=policy if planner is not None and has_hooks(policy) else None,
    )
    stop = math.inf if stop_at_s is None else float(stop_at_s)
    add, waiting = eng.add, eng.waiting
    # the plan's step takes the stop time too (a holding plan runs up to it): positional, as
    # a partial's keyword merge cost ~0.4 us a plan
    planned = planner is not None
    execute = eng.execute_plan if planned else eng.execute
    calls = 0  # plans, including those that scheduled nothing
    watch = LivelockWatch(chunks)
    i = 0
    t = 0.0
    interrupted = False
    stalled = ""
    try:
        while True:
            while i < n and arr_l[i] <= t:
                add(i, t)
                i += 1
            if eng.R == 0 and not waiting:
                if i >= n:
                    break
                t = arr_l[i]
                if t >= stop:
                    break
                continue
            if t >= stop:
                break
            nxt = arr_l[i] if i < n else math.inf
            calls += 1
            lim = nxt if nxt < stop else stop
            end = execute(t, lim, stop) if planned else execute(t, lim)
            if eng.preempt_total >= watch.next_at:
                watch.check(
                    eng.preempt_total,
                    i < n,
                    f"policy {getattr(policy, 'name', policy)!r} with {len(waiting)} waiting and "
                    f"{eng.R} running requests",
                )
            if end is not None:
                t = end  # the step's end, or the same time to plan again after a preemption
            elif i < n:
                t = max(t, nxt)
            else:
                raise SimulationStalled(
                    f"policy {getattr(policy, 'name', policy)!r} scheduled nothing with "
                    f"{len(waiting)} waiting and {eng.R} running requests and no arrival left"
                )
    except KeyboardInterrupt:
        if on_interrupt == "raise":
            raise
        interrupted = True  # keep what was simulated; the caller writes it
    except SimulationStalled as e:
        if on_interrupt == "raise":
            raise
        stalled = str(e)  # the same: the caller writes the run, then reports the stall

    # Requests still running at stop_at_s keep what they produced (cancelled).
    R = eng.R
    ids = eng.IA[4, :R]
    rows.Orow[ids] = eng.IA[1, :R]
    rows.first[ids] = eng.FA[0, :R]
    rows.last[ids] = eng.FA[1, :R]
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else chunks.arrays()
    if chunk_sink is not None:
        chunks.flush()
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__),
        first_s=rows.first,
        last_s=rows.last,
        out_tokens=rows.Orow.copy(),
        status=rows.status(),
        errors=rows.errors,
        preemptions=rows.npre,
        samples=eng.samples,
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=t,
        num_steps=eng.steps_total,
        num_calls=calls,
        wall_s=time.perf_counter() - wall0,
        counters={
            "preemptions_total": eng.preempt_total,
            "num_rejected": eng.rejected,
            "num_finished": eng.finished_total,
            "unfinished": int(n - eng.finished_total - eng.rejected),
            "kernel": "fast",
            "interrupted": interrupted,
            "stalled": stalled,
        },
    )


__all__ = ["ArrayEngine", "Rows", "fast_budget", "fast_planner", "fast_simulate"]
