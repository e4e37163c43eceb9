"""A routed cluster on array engines: the event loop without engine-core objects (issue 16, speed).

Why: a load-aware router (least outstanding tokens, session affinity, prefix-aware) reads the
engines' state at every call, so the cluster cannot be routed up front
(:mod:`harness.engine.cluster_split`) and runs on :mod:`harness.engine.cluster`'s event loop,
whose engine cores cost a few Python operations per running request per step (2.6k calls/s
at 100k calls over 8 replicas). Here each engine keeps its requests in numpy arrays, the
layout of the vectorised kernel (:mod:`harness.engine.fastsim`), and the loop keeps the event
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
- one engine step is one iteration of the budget rule (base.BudgetRule, base.py rules 1-5):
  decodes first, then prefills, clipped to the budget; KV shortage preempts from the end of
  that order, then no admission; FCFS head-of-line admission while budget, seats and KV allow.

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
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.engine.cluster import EngineSpec
from harness.engine.core import decode_steps_that_fit, fit_problem
from harness.engine.fastsim import fast_budget
from harness.engine.simresult import (
    ChunkLog,
    SimResult,
    SimulationStalled,
    new_samples,
    no_cyclic_gc,
)
from harness.loadgen.sessions import SessionOptions
from harness.routers.base import RouteCall, Router
from harness.workload.trace import Trace

_PENDING, _RUNNING, _FINISHED, _REJECTED, _WAITING = 0, 1, 2, 3, 4
_MAX_STALL = 1000  # simulate_cluster's max_stall_calls default
_NO_LEFT = 1 << 62  # min_left of an empty batch


class _Rows:
    """Per trace row state shared by the engines (each row lives in one engine)."""

    __slots__ = ("P", "M", "Orow", "first", "last", "state", "npre", "errors")

    def __init__(self, P: list[int], M: list[int]) -> None:
        n = len(P)
        self.P = P
        self.M = M
        self.Orow = np.zeros(n, dtype=np.int64)  # outputs so far (kept across preemptions)
        self.first = np.full(n, np.nan)
        self.last = np.full(n, np.nan)
        self.state = np.zeros(n, dtype=np.int8)
        self.npre = np.zeros(n, dtype=np.int64)
        self.errors: dict[int, str] = {}


class _ArrayEngine:
    """One engine in arrays (fastsim's layout) plus its cluster state; also its EngineLoad."""

    def __init__(
        self,
        index: int,
        spec: EngineSpec,
        budget: int,
        rows: _Rows,
        chunks: ChunkLog,
        clock: list[float],
        n: int,
    ) -> None:
        cfg = spec.config
        self.index_ = index
        self.spec = spec
        self.budget_cap = budget
        self.rows = rows
        self.chunks = chunks
        self.clock = clock
        self.bs = cfg.block_size
        self.total = cfg.total_blocks
        self.max_seqs = cfg.max_num_seqs
        self.cost_model = spec.cost_model
        self.use_attn = bool(getattr(spec.cost_model, "uses_prefill_attn", False))
        cap = max(1, min(self.max_seqs, n))
        self.IA = np.zeros((6, cap), np.int64)  # prompt, outputs, computed, max_tokens, blocks, row
        self.FA = np.full((2, cap), np.nan)  # first / last token time
        self.cols = (*self.IA, *self.FA)  # row views, made once (the arrays never move)
        self.R = 0
        self.npf = 0  # running requests that are not decoding
        self.used = 0
        self.waiting: deque[int] = deque()
        self.pm_total = 0  # prompt + max_tokens of live requests
        self.sum_c = 0  # computed tokens of the running requests (kept incrementally)
        self.min_left = _NO_LEFT  # fewest tokens a running request has left to generate
        self.pending: float | None = None
        self.version = 0
        self.steady = False
        # deferred run: (start, step starts, step ends, batch size)
        self.deferred: tuple[float, np.ndarray, np.ndarray, int] | None = None
        self.preempt_total = 0
        self.finished_total = 0
        self.rejected = 0
        self.steps_total = 0
        self.calls = 0
        self.stall = 0
        self.samples = new_samples()
        sm = self.samples
        self._appends = tuple(
            sm[c].append
            for c in (
                "t_s",
                "num_steps",
                "step_duration_s",
                "prefill_tokens",
                "decode_tokens",
                "kv_used_tokens",
                "kv_usage",
                "num_waiting",
                "num_running",
                "preemptions_total",
            )
        )

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
    def _retire(self, keep: np.ndarray) -> None:
        """Compact the running arrays to the rows in ``keep`` (a mask over the first R)."""
        IA, FA, R = self.IA, self.FA, self.R
        gone = np.flatnonzero(~keep)
        if len(gone) <= 8:
            for p in gone[::-1].tolist():
                IA[:, p : R - 1] = IA[:, p + 1 : R]
                FA[:, p : R - 1] = FA[:, p + 1 : R]
                R -= 1
            self.R = R
            return
        idx = np.flatnonzero(keep)
        k = len(idx)
        IA[:, :k] = IA[:, idx]
        FA[:, :k] = FA[:, idx]
        self.R = k

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

    def add(self, j: int, t: float) -> bool:
        """Queue trace row ``j`` (already routed here); False if it can never fit."""
        rows = self.rows
        problem = fit_problem(rows.P[j], rows.M[j], self.bs, self.total)
        if problem is not None:
            rows.state[j] = _REJECTED
            rows.errors[j] = f"{self.spec.name}: {problem}"
            self.rejected += 1
            return False
        self.waiting.append(j)
        rows.state[j] = _WAITING
        self.pm_total += rows.P[j] + rows.M[j]
        return True

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
        return self._execute(t, until)

    def _apply_run(self, t: float, ends: np.ndarray, until: float) -> float:
        """Execute the steady decode run from ``t`` with step ends ``ends``: the steps that
        start strictly before ``until`` (at least one)."""
        k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
        k = max(1, min(k, len(ends)))
        R = self.R
        grow = self.IA[2, :R] % self.bs == 0  # step 1's blocks
        self.IA[4, :R] += grow
        self.used += int(np.count_nonzero(grow))
        return self._finish_run(t, ends[:k], k, R)

    def _finish_run(self, t: float, ends: np.ndarray, k: int, R: int) -> float:
        """Advance a pure decode run of ``k`` steps (step 1's blocks allocated) and record it."""
        IA, FA = self.IA, self.FA
        Or, Cr, NBr, IDr = IA[1], IA[2], IA[4], IA[5]
        bs = self.bs
        end = float(ends[-1])
        self.calls += 1
        self.stall = 0
        if k > 1:
            Cv = Cr[:R]
            Cv += k
            Or[:R] += k
            nb = (Cv + (bs - 1)) // bs
            self.used += int(nb.sum() - NBr[:R].sum())
            NBr[:R] = nb
            FA[1, :R] = end
            self.chunks.add_run(ends, IDr[:R].copy())
        else:
            Cr[:R] += 1
            Or[:R] += 1
            FA[1, :R] = end
            self.chunks.add_step(end, IDr[:R].copy())
        self.sum_c += R * k
        self.min_left -= k
        finished = self.min_left <= 0 and self._finish()
        self._sample(end, t, k, 0, R * k)
        self.steps_total += k
        self.steady = not finished  # the plan was steady; nothing else happened
        return end

    def _finish(self) -> bool:
        """Retire the running requests that reached max_tokens; refresh ``min_left``."""
        R = self.R
        IA, FA = self.IA, self.FA
        Or, Mr = IA[1], IA[3]
        left = Mr[:R] - Or[:R]
        done = left <= 0
        gone = done.nonzero()[0]
        if len(gone) == 0:
            return False
        rows = self.rows
        if len(gone) == 1:  # the usual case: scalar reads, one shift of the tails
            p = int(gone[0])
            pr, o, c, m, nb, j = IA[:, p].tolist()
            rows.state[j] = _FINISHED
            rows.Orow[j] = o
            rows.first[j] = FA[0, p]
            rows.last[j] = FA[1, p]
            self.used -= nb
            self.pm_total -= pr + m
            self.sum_c -= c
            IA[:, p : R - 1] = IA[:, p + 1 : R]
            FA[:, p : R - 1] = FA[:, p + 1 : R]
            self.R = R - 1
            self.finished_total += 1
            left[p] = _NO_LEFT
            self.min_left = int(left.min())  # _NO_LEFT when it was the last one
            return True
        ids = IA[5, :R][done]
        rows.state[ids] = _FINISHED
        rows.Orow[ids] = Or[:R][done]
        rows.first[ids] = FA[0, :R][done]
        rows.last[ids] = FA[1, :R][done]
        self.used -= int(IA[4, :R][done].sum())
        self.pm_total -= int((IA[0, :R][done] + IA[3, :R][done]).sum())
        self.sum_c -= int(IA[2, :R][done].sum())
        self._retire(~done)
        self.finished_total += len(ids)
        R = self.R
        self.min_left = int((IA[3, :R] - IA[1, :R]).min()) if R else _NO_LEFT
        return True

    def _sample(self, end: float, t: float, k: int, prefill: int, decode: int) -> None:
        a_t, a_k, a_d, a_p, a_dec, a_kv, a_use, a_w, a_r, a_pre = self._appends
        used = self.used
        a_t(end)
        a_k(k)
        a_d(end - t)
        a_p(prefill)
        a_dec(decode)
        a_kv(used * self.bs)
        a_use(used / self.total)
        a_w(len(self.waiting))
        a_r(self.R)
        a_pre(self.preempt_total)

    def _execute(self, t: float, until: float) -> float | None:
        """One engine-core step at ``t`` under the budget rule (fastsim's pass 1 and 2), with
        the core's fast-forward up to ``until``."""
        Pr, Or, Cr, Mr, NBr, IDr, Fr, Lr = self.cols
        rows = self.rows
        bs = self.bs
        total = self.total
        R = self.R
        budget = self.budget_cap
        used = self.used
        free0 = free = total - used
        waiting = self.waiting
        preempted_any = False
        pure = False
        sp: np.ndarray | None = None
        sg: np.ndarray | None = None
        prefill = n_decode = kv_read = 0
        attn = 0.0
        if R:
            Cv = Cr[:R]
            if self.npf == 0 and budget >= R:
                grow = Cv % bs == 0
                tot_need = int(np.count_nonzero(grow))
                if tot_need <= free:
                    NBr[:R] += grow
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
                remo = rem[ordp]
                tot_rem = int(remo.sum())
                if tot_rem <= budget:
                    grant = remo
                else:
                    cum = np.cumsum(remo)
                    grant = np.minimum(remo, np.maximum(budget - cum + remo, 0))
                Co = Cv[ordp]
                need = (Co + grant + (bs - 1)) // bs - NBr[ordp]
                tot_need = int(need.sum())
                if tot_need <= free:
                    NBr[ordp] += need
                    used += tot_need
                    free -= tot_need
                    budget -= int(grant.sum())
                    sp, sg = ordp, grant
                else:
                    # Exact sequential semantics, preemption from the tail (base.py rule 2).
                    alive = np.ones(R, dtype=bool)
                    order = ordp.tolist()
                    sched: dict[int, int] = {}
                    budget = self.budget_cap
                    for pos, rj in zip(order[:], remo.tolist(), strict=True):
                        if not alive[pos]:
                            continue
                        g = rj if rj < budget else budget
                        if g <= 0:
                            continue
                        nd = -(-(int(Cr[pos]) + g) // bs) - int(NBr[pos])
                        if nd > free:
                            while nd > free and order:
                                v = order.pop()
                                if not alive[v]:
                                    continue
                                got = sched.pop(v, None)
                                if got is not None:
                                    budget += got
                                alive[v] = False
                                used -= int(NBr[v])
                                row = int(IDr[v])
                                rows.Orow[row] = Or[v]
                                rows.first[row] = Fr[v]
                                rows.last[row] = Lr[v]
                                rows.npre[row] += 1
                                rows.state[row] = _WAITING
                                self.sum_c -= int(Cr[v])
                                waiting.appendleft(row)
                                self.preempt_total += 1
                                free = total - used
                                preempted_any = True
                                if v == pos:
                                    break
                            if not alive[pos]:
                                continue
                        NBr[pos] += nd
                        used += nd
                        free -= nd
                        sched[pos] = g
                        budget -= g
                    newpos = np.cumsum(alive) - 1
                    sp = newpos[np.fromiter(sched.keys(), dtype=np.int64, count=len(sched))]
                    sg = np.fromiter(sched.values(), dtype=np.int64, count=len(sched))
                    self.used = used
                    self._retire(alive)
                    R = self.R
                if len(sp):
                    Co = Cr[sp]
                    d = (Or[sp] > 0) & (Pr[sp] + Or[sp] - Co == 1)
                    pos_g = sg > 0
                    n_decode = int(np.count_nonzero(d & pos_g))
                    prefill = int(sg[~d].sum())
                    if self.use_attn:
                        pg = sg[~d]
                        attn = float((pg * (Co[~d] + pg / 2)).sum())
                    kv_read = int((Co + sg)[pos_g].sum())

        # The policy's plan is steady (Plan.steady: all decode, nothing admitted) when no
        # admission is planned: vllm_v1 plans the waiting head while budget and seats are
        # left and its first chunk fits the free KV at planning time (common.admit_list).
        steady_plan = pure
        if pure and waiting and budget > 0 and self.max_seqs - R > 0:
            j = waiting[0]
            rj = rows.P[j] + int(rows.Orow[j])
            g = rj if rj < budget else budget
            if -(-g // bs) <= free0:
                steady_plan = False

        # ---- pass 2: FCFS admissions (head-of-line) --------------------------------------------
        R0 = R
        adm_g: list[int] = []
        if not preempted_any and waiting:
            seats = self.max_seqs - R
            P_l = rows.P
            M_l = rows.M
            while waiting and budget > 0 and seats > 0:
                j = waiting[0]
                oj = int(rows.Orow[j])
                rj = P_l[j] + oj
                g = rj if rj < budget else budget
                nd = -(-g // bs)
                if nd > free:
                    break
                waiting.popleft()
                rows.state[j] = _RUNNING
                used += nd
                free -= nd
                Pr[R] = P_l[j]
                Or[R] = oj
                Cr[R] = 0
                Mr[R] = M_l[j]
                NBr[R] = nd
                IDr[R] = j
                Fr[R] = rows.first[j]
                Lr[R] = rows.last[j]
                R += 1
                adm_g.append(g)
                budget -= g
                seats -= 1
                prefill += g
                kv_read += g
                attn += g * g / 2
        self.R = R
        self.used = used

        if n_decode == 0 and prefill == 0:  # nothing scheduled (cluster._execute's idle)
            self.stall += 1
            self.steady = False
            if preempted_any:
                self.min_left = int((Mr[:R] - Or[:R]).min()) if R else _NO_LEFT
            if preempted_any and self.stall < _MAX_STALL:
                return t  # the preemption changed the state: plan again
            return None  # waits for a release
        if self.use_attn:
            dur = self.cost_model.step_time(prefill, n_decode, kv_read, prefill_attn=attn)
        else:
            dur = self.cost_model.step_time(prefill, n_decode, kv_read)

        if steady_plan:  # EngineCore._fast_forward_len; step 1's blocks are allocated
            k_max = self.min_left
            if k_max > 1:
                k_max = decode_steps_that_fit(Cr[:R], k_max, bs, free)
            if k_max > 1:
                i = np.arange(k_max)
                durs = self.cost_model.step_times(
                    np.zeros(k_max), np.full(k_max, n_decode), kv_read + i * n_decode
                )
                ends = t + np.cumsum(durs)
                k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
                k = max(1, min(k, k_max))
                return self._finish_run(t, ends[:k], k, R)
            return self._finish_run(t, np.array([t + dur]), 1, R)

        self.calls += 1
        self.stall = 0
        end = t + dur
        if pure:
            Cr[:R0] += 1
            Or[:R0] += 1
            Lr[:R0] = end
            samp_ids = IDr[:R0].copy()
            self.sum_c += R0
            self.min_left -= 1
        elif sp is not None and len(sp):
            Cr[sp] += sg
            self.sum_c += int(sg.sum())
            hit = sp[Cr[sp] == Pr[sp] + Or[sp]]
            Or[hit] += 1
            Lr[hit] = end
            fh = Fr[hit]
            Fr[hit] = np.where(np.isnan(fh), end, fh)
            samp_ids = IDr[hit]
        else:
            samp_ids = None
        if samp_ids is not None and len(samp_ids):
            self.chunks.add_step(end, samp_ids)
        if adm_g:
            hits: list[int] = []
            left = self.min_left
            for q, g in enumerate(adm_g, start=R0):
                Cr[q] = g
                self.sum_c += g
                o = int(Or[q])
                if g == Pr[q] + o:
                    o += 1
                    Or[q] = o
                    Lr[q] = end
                    if Fr[q] != Fr[q]:
                        Fr[q] = end
                    hits.append(int(IDr[q]))
                m = int(Mr[q]) - o
                if m < left:
                    left = m
            self.min_left = left
            if hits:
                self.chunks.add_step(end, hits)
            self.npf += len(adm_g) - len(hits)
        if not pure:
            self.min_left = int((Mr[:R] - Or[:R]).min()) if R else _NO_LEFT
        if self.min_left <= 0:
            self._finish()
        R = self.R
        if not pure:
            v = Or[:R]
            self.npf = R - int(np.count_nonzero((v > 0) & (Pr[:R] + v - Cr[:R] == 1)))
        self.steps_total += 1
        self._sample(end, t, 1, prefill, n_decode)
        self.steady = False
        return end


def routed_budgets(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    options: SessionOptions | None,
    stop_at_s: float | None,
) -> list[int] | None:
    """Every engine's step budget when the array engines are exact for this cluster (module
    docstring), else None."""
    if stop_at_s is not None or any(s.agent is not None for s in engines):
        return None
    df = trace.df
    if "session_id" in df.columns or "agent" in df.columns:
        return None
    if options is not None and options != SessionOptions():
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
    rows = _Rows(P, M)
    engine_of = np.full(n, -1, dtype=np.int64)
    chunks = ChunkLog(chunk_sink, chunk_flush_rows)
    clock = [0.0]
    engs = [
        _ArrayEngine(i, s, b, rows, chunks, clock, n)
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
    end = max([t, *[e.samples["t_s"][-1] for e in engs if len(e.samples["t_s"])]])
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else chunks.arrays()
    if chunk_sink is not None:
        chunks.flush()
    status = np.zeros(n, dtype=np.int8)
    status[rows.state == _FINISHED] = 1
    status[rows.state == _REJECTED] = 2
    parts = []
    for e in engs:
        parts.append(
            SimResult(
                policy=getattr(e.spec.policy, "name", type(e.spec.policy).__name__),
                first_s=np.zeros(0),
                last_s=np.zeros(0),
                out_tokens=np.zeros(0, np.int64),
                status=np.zeros(0, np.int8),
                errors={},
                preemptions=np.zeros(0, np.int64),
                samples=e.samples,
                chunk_req=None,
                chunk_t=None,
                end_s=e.samples["t_s"][-1] if len(e.samples["t_s"]) else 0.0,
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
    merged = SimResult(
        policy="+".join(sorted({p.policy for p in parts})),
        first_s=rows.first,
        last_s=rows.last,
        out_tokens=rows.Orow,
        status=status,
        errors=rows.errors,
        preemptions=rows.npre,
        samples={},
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=end,
        num_steps=sum(p.num_steps for p in parts),
        num_calls=sum(p.num_calls for p in parts),
        wall_s=time.perf_counter() - wall0,
        counters={
            "num_finished": int((status == 1).sum()),
            "num_rejected": int((status == 2).sum()),
            "preemptions_total": sum(e.preempt_total for e in engs),
            "deferred_runs": num_deferred,
        },
    )
    return merged, parts, engine_of


__all__ = ["routed_budgets", "simulate_routed"]
