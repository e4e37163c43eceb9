"""A routed cluster on array engines: the event loop without engine-core objects (issue 16, speed).

Why: a load-aware router (least outstanding tokens, session affinity, prefix-aware) reads the
engines' state at every call, so the cluster cannot be routed up front
(:mod:`harness.engine.cluster_split`) and runs on :mod:`harness.engine.cluster`'s event loop,
whose engine cores cost a few Python operations per running request per step (2.6k calls/s
at 100k calls over 8 replicas). Here each engine is the vectorised kernel's
:class:`~harness.engine.fastsim.ArrayEngine` - the same step code the single-engine simulator
drives, not a copy (issue 13: one kernel per policy rule) - and the loop keeps the event
loop's rules exactly, so routers see the same load views at the same instants and every call
gets the same engine and the same token times (tests/cluster/test_cluster.py):

- events keyed ``(time, priority, seq)``: releases (trace rows in arrival order) before
  engine step starts (seq = engine index) at equal times;
- a step executes at its start; a plan the engine core would fast-forward (every running
  request decodes, no admission planned: vLLM's ``Plan.steady``) runs identical decode steps
  up to the next release, bounded by the first finish and the KV blocks
  (``EngineCore._fast_forward_len``);
- an engine whose last step was steady and that nothing touched since is *deferred*: its
  closed-form run is executed only at its natural end, or when a call is routed to it (then
  the steps starting before that instant); while deferred its load view is the run's start
  state with outstanding tokens counted down per started step (``cluster._Engine``);
- one engine step is one iteration of the budget rule (base.BudgetRule, base.py rules 1-5),
  ``ArrayEngine.execute``: decodes first, then prefills, clipped to the budget; KV shortage
  preempts from the end of that order, then no admission; FCFS head-of-line admission while
  budget, seats and KV allow. The engines fast-forward on the plan (``steady_by_plan``) and
  give up planning again after ``max_stall_calls`` preempting plans that schedule nothing,
  as the engine core under the event loop does.

Used when it is exact: a plain trace (no sessions, agents or session options, so there are
no prefix identities and every release is a known arrival), every engine's policy declares
the budget rule (:func:`harness.engine.fastsim.fast_budget`), no stop time, and a router
that keeps the base ``on_finish`` (none of the registered ones track finishes). Anything
else runs on :mod:`harness.engine.cluster`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.engine.cluster import EngineSpec
from harness.engine.cluster_split import is_plain, merged_result
from harness.engine.core import decode_steps_that_fit, fit_problem
from harness.engine.fastsim import ArrayEngine, Rows, fast_budget
from harness.engine.simresult import (
    ChunkLog,
    SimResult,
    SimulationStalled,
    no_cyclic_gc,
)
from harness.routers.base import RouteCall, Router
from harness.workload.session_options import SessionOptions
from harness.workload.trace import Trace

_MAX_STALL = 1000  # simulate_cluster's max_stall_calls default


class _ClusterEngine(ArrayEngine):
    """The kernel's array engine plus what the event loop adds: its index, pending step and
    version, a deferred steady run (module docstring); also its EngineLoad for routers."""

    def __init__(
        self,
        index: int,
        spec: EngineSpec,
        budget: int,
        rows: Rows,
        chunks: ChunkLog,
        clock: list[float],
        n: int,
    ) -> None:
        super().__init__(
            budget,
            spec.config,
            spec.cost_model,
            rows,
            chunks,
            n,
            error_prefix=f"{spec.name}: ",
            steady_by_plan=True,
            max_stall=_MAX_STALL,
        )
        self.index_ = index
        self.spec = spec
        self.clock = clock
        self.pending: float | None = None
        self.version = 0
        # deferred run: (start, step starts, step ends, batch size)
        self.deferred: tuple[float, np.ndarray, np.ndarray, int] | None = None

    # -- EngineLoad (cluster._Engine's definitions) -------------------------------------------
    @property
    def index(self) -> int:
        return self.index_

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return self.R

    @property
    def outstanding_tokens(self) -> int:
        left = self.pm_total - self.sum_c
        d = self.deferred
        if d is not None:  # steps of the deferred run that started before now
            left -= d[3] * int(np.searchsorted(d[1], self.clock[0], side="left"))
        return left

    @property
    def kv_usage(self) -> float:
        return self.used / self.total

    def cached_tokens(self, identity: Any) -> int:
        return 0  # plain rows carry no prompt identity

    # -- helpers ------------------------------------------------------------------------------
    def _run_ends(self, t: float) -> tuple[np.ndarray, int] | None:
        """Step ends of the longest steady decode run from ``t`` (first finish, KV blocks:
        ``EngineCore._fast_forward_len``'s bounds), with step 1's blocks not yet allocated;
        None when shorter than two steps."""
        R = self.R
        k_max = self.min_left
        if k_max < 2:
            return None
        Cv = self.IA[2, :R]
        need1 = int(np.count_nonzero(Cv % self.bs == 0))
        free = self.total - self.used
        if need1 > free:
            return None
        k = decode_steps_that_fit(Cv, k_max, self.bs, free - need1)
        if k < 2:
            return None
        i = np.arange(k)
        kv = self.sum_c + R
        durs = self.cost_model.step_times(np.zeros(k), np.full(k, R), kv + i * R)
        return t + np.cumsum(durs), k

    # -- cluster operations -------------------------------------------------------------------
    def touch(self, t: float) -> float | None:
        """Something reaches the engine at ``t``: execute its deferred run up to ``t``; the
        new pending step time if one was pushed (else None)."""
        nxt = None
        d = self.deferred
        if d is not None:
            self.deferred = None
            nxt = self._apply_run(d[0], d[2], t)
        self.steady = False
        return nxt

    def step(self, t: float, until: float) -> float | None:
        """The engine's pending step at ``t`` (cluster._Cluster.step): execute a deferred
        run, defer a steady one, or execute one step fast-forwarding up to ``until``; the
        next pending step time, or None when idle until a release."""
        self.pending = None
        d = self.deferred
        if d is not None:
            self.deferred = None
            return self._apply_run(d[0], d[2], t)
        if self.steady and self.R:
            got = self._run_ends(t)
            if got is not None:
                ends, k = got
                starts = np.empty(k)
                starts[0] = t
                starts[1:] = ends[:-1]
                self.deferred = (t, starts, ends, self.R)
                return float(ends[-1])
        return self.execute(t, until)

    def _apply_run(self, t: float, ends: np.ndarray, until: float) -> float:
        """Execute the steady decode run from ``t`` with step ends ``ends``: the steps that
        start strictly before ``until`` (at least one)."""
        k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
        k = max(1, min(k, len(ends)))
        R = self.R
        # step 1's blocks (a block each for the decodes at a block boundary)
        self.used += self._opening(R)
        return self._finish_run(t, ends[:k], k, R)


def routed_budgets(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    options: SessionOptions | None,
    stop_at_s: float | None,
) -> list[int] | None:
    """Every engine's step budget when the array engines are exact for this cluster (module
    docstring), else None."""
    if stop_at_s is not None or not is_plain(engines, trace, options):
        return None
    if len(engines) > 1 and (router is None or type(router).on_finish is not Router.on_finish):
        return None
    budgets = []
    for s in engines:
        b = fast_budget(s.policy, s.config)
        if b is None:
            return None
        budgets.append(b)
    return budgets


def simulate_routed(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    budgets: Sequence[int],
    *,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None = None,
    chunk_flush_rows: int = 2_000_000,
) -> tuple[SimResult, list[SimResult], np.ndarray]:
    """The routed cluster on array engines (module docstring): the merged result (trace rows),
    each engine's own (telemetry, counters), as :func:`cluster_split.simulate_split`, and the
    engine index of every trace row (-1: never routed)."""
    wall0 = time.perf_counter()
    df = trace.df
    n = len(df)
    arr = df["arrival_s"].to_numpy(dtype=float)
    order = np.argsort(arr, kind="stable").tolist()  # releases: (time, trace row)
    arr_l = arr.tolist()
    P = df["prompt_len"].to_numpy(np.int64).tolist()
    M = df["output_len"].to_numpy(np.int64).tolist()
    rids = df["request_id"].astype(str).tolist()
    tiers = df["tier"].astype(str).tolist()
    rows = Rows(P, M)
    engine_of = np.full(n, -1, dtype=np.int64)
    chunks = ChunkLog(chunk_sink, chunk_flush_rows)
    clock = [0.0]
    engs = [
        _ClusterEngine(i, s, b, rows, chunks, clock, n)
        for i, (s, b) in enumerate(zip(engines, budgets, strict=True))
    ]
    ne = len(engs)
    heap: list[tuple[float, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    route = router.route if router is not None and ne > 1 else None
    num_deferred = 0
    inf = math.inf
    pos = 0
    t = 0.0
    with no_cyclic_gc():
        while True:
            ta = arr_l[order[pos]] if pos < n else inf
            if heap and heap[0][0] < ta:  # a step start (releases first at equal times)
                t, k, version = pop(heap)
                e = engs[k]
                if version != e.version:
                    continue
                was = e.deferred
                nxt = e.step(t, ta)
                if e.deferred is not None and was is None:
                    num_deferred += 1
                if nxt is not None:
                    e.version += 1
                    e.pending = nxt
                    push(heap, (nxt, k, e.version))
                continue
            if ta == inf:
                break
            t = ta
            j = order[pos]
            pos += 1
            if route is None:
                k = 0
            else:
                clock[0] = t
                k = route(RouteCall(rids[j], P[j], M[j], tiers[j], rids[j]), engs, t)
                if not 0 <= k < ne:
                    raise ValueError(f"router {router.name!r} chose engine {k} of {ne}")  # type: ignore[union-attr]
            e = engs[k]
            engine_of[j] = k
            if fit_problem(P[j], M[j], e.bs, e.total) is not None:
                e.add(j, t)  # records the rejection
                continue
            nxt = e.touch(t)
            if nxt is not None:
                e.version += 1
                e.pending = nxt
                push(heap, (nxt, k, e.version))
            e.add(j, t)
            if e.pending is None:
                e.version += 1
                e.pending = t
                push(heap, (t, k, e.version))
    for e in engs:
        if e.R or e.waiting:
            raise SimulationStalled(
                f"engine {e.spec.name!r}: policy {getattr(e.spec.policy, 'name', '?')!r} "
                f"scheduled nothing with {len(e.waiting)} waiting and {e.R} running requests "
                "and no release left"
            )
    samples = [e.samples for e in engs]  # each a copy of the engine's columns: once
    end = max([t, *[float(s["t_s"][-1]) for s in samples if len(s["t_s"])]])
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else chunks.arrays()
    if chunk_sink is not None:
        chunks.flush()
    status = rows.status()
    parts = []
    for e, s in zip(engs, samples, strict=True):
        parts.append(
            SimResult(
                policy=getattr(e.spec.policy, "name", type(e.spec.policy).__name__),
                first_s=np.zeros(0),
                last_s=np.zeros(0),
                out_tokens=np.zeros(0, np.int64),
                status=np.zeros(0, np.int8),
                errors={},
                preemptions=np.zeros(0, np.int64),
                samples=s,
                chunk_req=None,
                chunk_t=None,
                end_s=float(s["t_s"][-1]) if len(s["t_s"]) else 0.0,
                num_steps=e.steps_total,
                num_calls=e.calls,
                wall_s=0.0,
                counters={
                    "preemptions_total": e.preempt_total,
                    "num_rejected": e.rejected,
                    "num_finished": e.finished_total,
                    "core_calls": e.calls,
                },
            )
        )
    merged = merged_result(
        parts, rows.first, rows.last, rows.Orow, status, rows.errors, rows.npre,
        chunk_req, chunk_t, end, wall0, deferred_runs=num_deferred,
    )  # fmt: skip
    return merged, parts, engine_of


__all__ = ["routed_budgets", "simulate_routed"]
