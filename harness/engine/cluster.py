"""A cluster in virtual time: N engine cores on one clock, a router, sessions (issue 16).

:func:`simulate_cluster` runs a trace through N :class:`~harness.engine.core.EngineCore`
instances, each with its own name, policy, cost model and :class:`EngineConfig` (replicas
behind a router, and/or the agents of an agent graph). Every row of the trace is a call of a
session (a plain row is a session of one call), replayed with the live replay's session rules
(:mod:`harness.engine.vsessions`), so ``harness simulate`` and ``harness replay`` of one session
trace write comparable run directories.

Routing (harness/routers/base.py): decided once per call at its release. A call naming an
``agent`` served by engines of that agent goes to that agent's engine (the router picks among
them when the agent has several); any other call goes to the router over the engines that
serve no agent. A router sees engines only through :class:`EngineLoad` views, which read
counters (outstanding tokens: prompt + max_tokens of live requests, kept incrementally, minus
their computed tokens, summed over the running batch at most once per engine state and only
when a router reads it).

Event order (simulate.py's rules, style-examples take-away 5), keyed ``(time, priority, seq)``:
releases (``RELEASE``, seq = trace row) < patience deadlines < engine step starts (seq =
engine index). A step is atomic: a call released while an engine is mid-step joins its
waiting queue and is seen by the engine's next step. Each engine has at most one pending
step; the next one of all engines comes from a heap of step times, so no per-event work
grows with the number of engines.

Speed without changing answers (Plan.steady): a step fast-forwards identical decode steps up
to the next known release; with sessions also up to the next step start of any other
engine (a call released by a finish can come no earlier). An engine whose policy promised a
steady decode run and that nothing has touched since is not stepped at every other engine's
event. Its run is *deferred*: the closed-form run length (first finish, KV boundary, stop;
the same bound :meth:`EngineCore.step` computes) gives the time of its next decision, and
the core executes the run only then, or earlier when a call is routed to it or one of its
calls is abandoned (then exactly the steps that start before that instant, as the
single-engine simulator cuts a run at an arrival). While deferred, its load view is the
state at the run's start with outstanding tokens counted down per elapsed step.
With one engine and a plain trace this is the single-engine simulator's loop (same token
times: a test). ``harness simulate`` runs a plain trace on faster exact kernels where it can:
routed up front when the router is load-blind (cluster_split.py), else these rules over array
engines when every policy declares the budget rule (cluster_fast.py); both tested equal.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore, StepOutcome, decode_steps_that_fit
from harness.engine.costmodel import CostModel
from harness.engine.simresult import (
    ChunkLog,
    LivelockWatch,
    SimulationStalled,
    new_samples,
    no_cyclic_gc,
)
from harness.engine.vsessions import RELEASE, STEP, Row, SessionDriver
from harness.policies.base import Policy
from harness.results import schema
from harness.routers.base import RouteCall, Router
from harness.workload.session_options import SessionOptions
from harness.workload.sessions import Session, sessions_from_frame
from harness.workload.trace import Trace


@dataclass(frozen=True)
class EngineSpec:
    """One engine of a cluster: a replica (``agent`` None) or an engine of agent ``agent``."""

    name: str
    policy: Policy
    cost_model: CostModel
    config: EngineConfig
    agent: str | None = None


@dataclass
class ClusterResult:
    """What a cluster run produced: the session driver's rows/records, per-engine telemetry,
    token times (None when streamed to a sink) and counters."""

    driver: SessionDriver
    engines: list[str]
    samples: list[dict[str, Any]]
    chunk_req: np.ndarray | None
    chunk_t: np.ndarray | None
    end_s: float
    wall_s: float
    counters: dict[str, Any] = field(default_factory=dict)
    per_engine: list[dict[str, Any]] = field(default_factory=list)


class _Spy:
    """The engine's policy, remembering whether its last plan was ``steady``."""

    __slots__ = ("policy", "steady")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.steady = False

    def schedule(self, view: Any) -> Any:
        plan = self.policy.schedule(view)
        self.steady = plan.steady
        return plan

    def on_arrival(self, r: Any, now: float) -> None:
        self.policy.on_arrival(r, now)

    def on_step(self, report: Any) -> None:
        self.policy.on_step(report)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


class _Engine:
    """One engine core plus its cluster state; also its :class:`EngineLoad` view."""

    def __init__(self, index: int, spec: EngineSpec, clock: list[float], chunks: ChunkLog) -> None:
        self.index_ = index
        self.spec = spec
        self.name = spec.name
        self.spy = _Spy(spec.policy)
        self.core = EngineCore(self.spy, spec.cost_model, spec.config)  # type: ignore[arg-type]
        self.clock = clock
        self.pm_total = 0  # prompt + max_tokens of live requests
        self.computed: int | None = None  # their computed tokens (None: changed since read)
        self.version = 0
        self.pending: float | None = None  # time of the pending step, None when idle
        self.steady = False  # last plan steady, run untouched since: may be deferred
        self.deferred: tuple[float, np.ndarray, int] | None = None  # (start, step starts, n)
        self.stall = 0
        self.watch = LivelockWatch(chunks)  # the cluster's token log: no token anywhere
        self.samples = new_samples()
        self.steps = 0
        self.calls = 0

    # -- EngineLoad -------------------------------------------------------------------------
    @property
    def index(self) -> int:
        return self.index_

    @property
    def num_waiting(self) -> int:
        return self.core.num_waiting

    @property
    def num_running(self) -> int:
        return self.core.num_running

    @property
    def outstanding_tokens(self) -> int:
        computed = self.computed
        if computed is None:  # summed once per engine state, only when a router asks
            computed = self.computed = sum(r.num_computed_tokens for r in self.core.running)
        left = self.pm_total - computed
        d = self.deferred
        if d is not None:  # steps of the deferred run that started before now
            left -= d[2] * int(np.searchsorted(d[1], self.clock[0], side="left"))
        return left

    @property
    def kv_usage(self) -> float:
        return self.core.kv_usage

    def cached_tokens(self, identity: Any) -> int:
        if identity is None:
            return 0
        return self.core.cached_tokens(identity)


def _note_cache(row: Row, r: Any, core: EngineCore) -> None:
    """Record the attempt's prefix-cache lookup at its first admission (vLLM's per-request
    ``num_cached_tokens`` against its prompt: harness.results.prefix_hits); left NaN with no
    prefix cache or when it was never admitted."""
    if core.prefix_cache is None:
        return
    if r.num_cached_tokens >= 0:
        row.cache_queries, row.cache_hits = r.num_prompt_tokens, r.num_cached_tokens
    elif r.first_token_s is not None or r.num_computed_tokens > 0:  # admitted, no identity
        row.cache_queries, row.cache_hits = r.num_prompt_tokens, 0


def _deferrable(e: _Engine, t: float, stop: float) -> tuple[np.ndarray, float, int] | None:
    """The steady decode run an untouched engine would execute from ``t`` (the bounds of
    :meth:`EngineCore.step`'s fast-forward: first finish, KV blocks, stop): its step starts,
    its end and its batch size; None when shorter than two steps or needing a preemption."""
    core = e.core
    run = core.running
    n = len(run)
    if n == 0:
        return None
    k_max = min(r.max_tokens - r.num_output_tokens for r in run)
    if k_max < 2:
        return None
    bs = core.block_size
    comp = np.fromiter((r.num_computed_tokens for r in run), dtype=np.int64, count=n)
    need1 = int(np.count_nonzero(comp % bs == 0))  # step 1's new blocks (for comp + 1 tokens)
    free = core.total_blocks - core.used_blocks
    if need1 > free:
        return None
    k = decode_steps_that_fit(comp, k_max, bs, free - need1)
    if k < 2:
        return None
    i = np.arange(k)
    durs = core.cost_model.step_times(np.zeros(k), np.full(k, n), int(comp.sum()) + n + i * n)
    ends = t + np.cumsum(durs)
    starts = np.concatenate(([t], ends[:-1]))
    k = int(np.searchsorted(starts, stop, side="left"))  # steps starting before the stop
    if k < 2:
        return None
    return starts[:k], float(ends[k - 1]), n


class _Cluster:
    """The event loop (module docstring)."""

    def __init__(
        self,
        trace: Trace,
        specs: Sequence[EngineSpec],
        router: Router | None,
        options: SessionOptions,
        *,
        stop_at_s: float | None,
        chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None,
        chunk_flush_rows: int,
        fast_forward: bool,
        max_stall_calls: int,
    ) -> None:
        if not specs:
            raise ValueError("a cluster needs at least one engine")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique: {names}")
        self.trace = trace
        self.router = router
        self.options = options
        self.stop = math.inf if stop_at_s is None else float(stop_at_s)
        self.fast_forward = fast_forward
        self.max_stall = max_stall_calls
        self.clock = [0.0]
        self.chunks = ChunkLog(chunk_sink, chunk_flush_rows)
        self.engines = [_Engine(i, s, self.clock, self.chunks) for i, s in enumerate(specs)]
        self.replicas = [e for e in self.engines if e.spec.agent is None]
        self.by_agent: dict[str, list[_Engine]] = {}
        for e in self.engines:
            if e.spec.agent is not None:
                self.by_agent.setdefault(e.spec.agent, []).append(e)
        self.sessions: list[Session] = sessions_from_frame(trace.df)
        self._check_routing()
        self.tier_info = {t.name: t for t in trace.tiers}
        self.ev: list[tuple[float, int, int, int, Callable[[Any, float], None], Any]] = []
        self.steps: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.num_deferred = 0
        self.next_release = math.inf
        self.live: dict[int, Row] = {}  # req -> row, while in an engine
        self.route_calls: dict[int, RouteCall] = {}
        self.driver = SessionDriver(
            self.sessions, options, push=self.push, send=self.send, deadline=self.deadline
        )
        multi = any(len(s.calls) > 1 or s.system for s in self.sessions)
        self.with_identity = multi and any(e.core.prefix_cache is not None for e in self.engines)
        self.generated = options.history == "reply"
        # Plain mode: every release is a known arrival, so a step may fast-forward up to the
        # next one; otherwise (calls released by finishes, retries, deadlines, session slots)
        # a step is executed alone and steady runs are deferred (exact either way).
        self.dynamic = (
            multi
            or options.max_retries > 0
            or options.patience_s is not None
            or options.max_active_sessions is not None
        )

    def _check_routing(self) -> None:
        agents = {c.agent for s in self.sessions for c in s.calls if c.agent is not None}
        if self.by_agent:
            missing = sorted(a for a in agents if a not in self.by_agent)
            if missing:
                raise ValueError(
                    f"the trace's agents {missing} have no engine "
                    f"(engines serve {sorted(self.by_agent)})"
                )
        plain_calls = any(
            c.agent is None or c.agent not in self.by_agent for s in self.sessions for c in s.calls
        )
        if plain_calls and not self.replicas:
            raise ValueError("calls without an agent need engines that serve no agent")
        multi = len(self.replicas) > 1 or any(len(v) > 1 for v in self.by_agent.values())
        if multi and self.router is None:
            raise ValueError("several engines serve the same calls: give a router")

    # -- events -----------------------------------------------------------------------------
    def push(
        self, t: float, prio: int, seq: int, fn: Callable[[Any, float], None], arg: Any
    ) -> None:
        self.seq += 1
        heapq.heappush(self.ev, (t, prio, seq, self.seq, fn, arg))

    def push_step(self, e: _Engine, t: float) -> None:
        e.version += 1
        e.pending = t
        heapq.heappush(self.steps, (t, STEP, e.index_, e.version))

    # -- calls ------------------------------------------------------------------------------
    def send(self, row: Row, t: float) -> str | None:
        """Route a released call and queue it in its engine; the reason if it can never fit."""
        call = row.call
        cands = self.by_agent.get(call.agent, self.replicas) if call.agent else self.replicas
        rc = None
        identity = None
        if self.with_identity:
            from harness.workload.token_identity import call_identity

            identity = call_identity(row.session.session, call, generated_replies=self.generated)
        if len(cands) == 1:
            e = cands[0]
        else:
            assert self.router is not None
            rc = RouteCall(
                request_id=row.request_id,
                prompt_len=row.prompt_len,
                max_tokens=row.output_len,
                tier=row.tier or "default",
                session_id=row.session.session.session_id,
                identity=identity,
            )
            self.clock[0] = t
            k = self.router.route(rc, cands, t)
            if not 0 <= k < len(cands):
                raise ValueError(f"router {self.router.name!r} chose engine {k} of {len(cands)}")
            e = cands[k]
        core = e.core
        problem = core.fit_problem(row.prompt_len, row.output_len)
        if problem is not None:
            return f"{e.name}: {problem}"
        self.touch(e, t)
        tr = self.tier_info.get(row.tier) if row.tier is not None else None
        core.add_request(
            row.request_id,
            row.prompt_len,
            row.output_len,
            arrival_s=t,
            tier=row.tier or "default",
            priority=tr.priority if tr else 0,
            ttft_slo_s=tr.ttft_slo_s if tr else None,
            tbt_slo_s=tr.tbt_slo_s if tr else None,
            index=row.req,
            identity=identity,
        )
        row.engine = e.index_
        self.live[row.req] = row
        if rc is not None:
            self.route_calls[row.req] = rc
        e.pm_total += row.prompt_len + row.output_len
        e.computed = None
        if e.pending is None:
            self.push_step(e, t)
        return None

    def touch(self, e: _Engine, t: float) -> None:
        """Something happens to ``e`` at ``t``: execute its deferred run up to ``t``."""
        if e.deferred is not None:
            start = e.deferred[0]
            e.deferred = None
            self._execute(e, start, t, t)
        e.steady = False

    def deadline(self, row: Row, t: float) -> None:
        """Patience ran out at ``t``: abandon unless the first token came in time."""
        if row.done:
            return
        e = self.engines[row.engine] if row.engine >= 0 else None
        if e is not None:
            r = e.core.get(row.request_id)
            if r is not None:
                if r.first_token_s is not None and r.first_token_s <= t:
                    return
                self.touch(e, t)
                _note_cache(row, r, e.core)
                e.pm_total -= r.num_prompt_tokens + r.max_tokens
                e.core.abort(row.request_id)
                e.computed = None
                if e.pending is None and e.core.has_work():
                    self.push_step(e, t)
            self.live.pop(row.req, None)
            rc = self.route_calls.pop(row.req, None)
            if rc is not None and self.router is not None:
                self.router.on_finish(rc, e.index_, t)
        self.driver.abandon(row, t)

    # -- steps ------------------------------------------------------------------------------
    def step(self, e: _Engine, t: float) -> None:
        e.pending = None
        if e.deferred is not None:  # the deferred run's natural end: execute it, then plan
            start = e.deferred[0]
            e.deferred = None
            self._execute(e, start, t, t)
            return
        if e.steady and self.fast_forward:
            got = _deferrable(e, t, self.stop)
            if got is not None:
                starts, end, n = got
                self.push_step(e, end)
                e.deferred = (t, starts, n)
                self.num_deferred += 1
                return
        until: float | None = None
        if self.fast_forward:
            until = self.stop
            if self.next_release < until:
                until = self.next_release
            # A release not yet known comes from a finish in a step not yet executed: after
            # the next step start of another engine (the heap's head), so up to there no
            # call can reach this engine unseen.
            if self.dynamic and self.steps and self.steps[0][0] < until:
                until = self.steps[0][0]
        self._execute(e, t, until, self.stop if until is not None else None)

    def _execute(self, e: _Engine, t: float, until: float | None, hold: float | None) -> None:
        """One ``core.step`` at ``t`` (fast-forwarding up to ``until``, a ``hold`` plan up to
        ``hold``) and its outcome."""
        core = e.core
        out: StepOutcome = core.step(t, fast_forward_until=until, hold_until=hold)
        if core.preemptions_total >= e.watch.next_at:  # a livelock ends the run (simresult)
            e.watch.check(
                core.preemptions_total,
                self.next_release < math.inf,
                f"engine {e.name!r}: policy {getattr(e.spec.policy, 'name', '?')!r} with "
                f"{core.num_waiting} waiting and {core.num_running} running requests",
            )
        e.computed = None
        e.calls += 1
        if out.idle:
            e.stall += 1
            e.steady = False
            if out.preempted and e.stall < self.max_stall:
                self.push_step(e, t)  # the preemption changed the state: plan again
            elif core.has_work():
                e.pending = None  # waits for a release (a stall if none comes)
            return
        e.stall = 0
        end = out.end_s
        sampled = out.sampled
        if self.options.patience_s is not None and out.num_steps == 1:
            live = self.live
            rows = [
                r.index
                for r in sampled
                if not (r.first_token_s == end and live[r.index].deadline < end)
            ]
        else:
            rows = [r.index for r in sampled]
        if out.num_steps == 1:
            self.chunks.add_step(end, rows)
        else:
            self.chunks.add_run(out.step_ends, rows)
        for r in out.finished:
            e.pm_total -= r.num_prompt_tokens + r.max_tokens
            row = self.live[r.index]
            if r.first_token_s > row.deadline:
                continue  # finished after the user left: the deadline event abandons it
            del self.live[r.index]
            row.preemptions = r.num_preemptions
            _note_cache(row, r, core)
            self.driver.attempt_done(row, r.first_token_s, r.last_token_s, r.num_output_tokens)
            rc = self.route_calls.pop(r.index, None)
            if rc is not None and self.router is not None:
                self.router.on_finish(rc, e.index_, end)
        rep = out.report
        s = e.samples
        s["t_s"].append(end)
        s["num_steps"].append(out.num_steps)
        s["step_duration_s"].append(out.duration_s)
        s["prefill_tokens"].append(rep.prefill_tokens)
        s["decode_tokens"].append(rep.decode_tokens)
        used = core.used_blocks
        s["kv_used_tokens"].append(used * core.block_size)
        s["kv_usage"].append(used / core.total_blocks)
        s["num_waiting"].append(core.num_waiting)
        s["num_running"].append(core.num_running)
        s["preemptions_total"].append(core.preemptions_total)
        e.steps += out.num_steps
        e.steady = (
            e.spy.steady
            and not out.finished
            and not out.preempted
            and not out.admitted
            and rep.num_prefill_seqs == 0
            and len(sampled) == core.num_running
        )
        self.push_step(e, end)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> float:
        sessions = self.sessions
        ns = len(sessions)
        arr = [s.arrival_s for s in sessions]
        first = [min(c.req for c in s.calls) for s in sessions]
        ev, steps, stop, driver = self.ev, self.steps, self.stop, self.driver
        engines = self.engines
        pop = heapq.heappop
        i = 0
        t = 0.0
        inf = math.inf
        while True:
            ta = arr[i] if i < ns else inf
            key = (ta, RELEASE, first[i] if i < ns else 0)
            src = 0
            if ev and ev[0][:3] < key:
                key = ev[0][:3]
                src = 1
            self.next_release = key[0]
            if steps and steps[0][:3] < key:
                key = steps[0][:3]
                src = 2
            t_next = key[0]
            if t_next >= stop or t_next == inf:
                break
            t = t_next
            self.clock[0] = t
            if src == 0:
                driver.arrive(sessions[i], t)
                i += 1
            elif src == 1:
                _, _, _, _, fn, arg = pop(ev)
                fn(arg, t)
            else:
                _, _, k, version = pop(steps)
                e = engines[k]
                if version == e.version:
                    self.step(e, t)
        stalled = [e for e in engines if e.core.has_work() and e.pending is None]
        if stalled and t < stop and i >= ns and not ev:
            e = stalled[0]
            raise SimulationStalled(
                f"engine {e.name!r}: policy {getattr(e.spec.policy, 'name', '?')!r} scheduled "
                f"nothing with {e.core.num_waiting} waiting and {e.core.num_running} running "
                "requests and no release left"
            )
        for e in engines:  # deferred runs the stop cut: execute the steps that start before it
            if e.deferred is not None:
                start = e.deferred[0]
                e.deferred = None
                self._execute(e, start, stop, stop)
        return self.end_time(t)

    def end_time(self, t: float) -> float:
        """The run's end: ``t`` or the last step end of any engine, the later."""
        ends = [e.samples["t_s"][-1] for e in self.engines if len(e.samples["t_s"])]
        return max([t, *ends])


def simulate_cluster(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None = None,
    *,
    options: SessionOptions | None = None,
    stop_at_s: float | None = None,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None = None,
    chunk_flush_rows: int = 2_000_000,
    fast_forward: bool = True,
    max_stall_calls: int = 1000,
    on_stall: str = "raise",
) -> ClusterResult:
    """Run ``trace`` through a cluster of engines on one virtual clock (module docstring).

    ``engines``: one :class:`EngineSpec` each (unique names; ``agent`` set for the engines of
    an agent graph). ``router``: picks among several engines that may serve a call (required
    then; a harness.routers.base.Router). ``options``: the session rules (patience,
    retries, max active sessions, max context, history mode), as ``harness replay``'s
    :class:`~harness.loadgen.sessions.SessionOptions`; plain traces need none.
    ``stop_at_s``: stop the clock there (in-flight calls are cancelled, unreleased ones leave
    no row). ``chunk_sink(req, t)`` receives token times as produced (else kept in memory).

    Returns a :class:`ClusterResult`: request rows (one per attempt; ``req`` = trace row,
    retries numbered after the trace), session records, per-engine telemetry and counters.
    Raises ValueError for a cluster that cannot route the trace (an agent with no engine,
    several engines and no router) and SimulationStalled when a policy stops scheduling (or
    livelocks); with ``on_stall="return"`` the run ends there instead, in-flight calls
    cancelled, and ``counters["stalled"]`` holds the message (for the run writer).
    """
    wall0 = time.perf_counter()
    cl = _Cluster(
        trace,
        engines,
        router,
        options or SessionOptions(),
        stop_at_s=stop_at_s,
        chunk_sink=chunk_sink,
        chunk_flush_rows=chunk_flush_rows,
        fast_forward=fast_forward,
        max_stall_calls=max_stall_calls,
    )
    stalled = ""
    with no_cyclic_gc():
        try:
            end = cl.run()
        except SimulationStalled as exc:
            if on_stall == "raise":
                raise
            stalled = str(exc)
            end = cl.end_time(cl.clock[0])

    def produced(row: Row) -> tuple[float, float, int]:
        r = cl.engines[row.engine].core.get(row.request_id) if row.engine >= 0 else None
        if r is None:
            return math.nan, math.nan, 0
        _note_cache(row, r, cl.engines[row.engine].core)
        f = math.nan if r.first_token_s is None else r.first_token_s
        last = math.nan if r.last_token_s is None else r.last_token_s
        return f, last, r.num_output_tokens

    cl.driver.cancel_rest(end, produced)
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else cl.chunks.arrays()
    if chunk_sink is not None:
        cl.chunks.flush()
    per_engine = []
    for e in cl.engines:
        c = e.core
        per_engine.append(
            {
                "name": e.name,
                "agent": e.spec.agent,
                "num_steps": c.num_steps_total,
                "core_calls": e.calls,
                "num_finished": c.num_finished,
                "num_rejected": c.num_rejected,
                "preemptions_total": c.preemptions_total,
                "prefix_cache_queries": c.prefix_cache_queries,
                "prefix_cache_hits": c.prefix_cache_hits,
            }
        )
    rows = cl.driver.rows
    return ClusterResult(
        driver=cl.driver,
        engines=[e.name for e in cl.engines],
        samples=[e.samples for e in cl.engines],
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=end,
        wall_s=time.perf_counter() - wall0,
        counters={
            "num_calls": len(rows),
            "num_finished": sum(1 for r in rows if r.ok),
            "num_failed": sum(1 for r in rows if not r.ok),
            "calls_sent": cl.driver.calls_sent,
            "num_steps": sum(p["num_steps"] for p in per_engine),
            "core_calls": sum(p["core_calls"] for p in per_engine),
            "preemptions_total": sum(p["preemptions_total"] for p in per_engine),
            "deferred_runs": cl.num_deferred,
            "prefix_cache_queries": sum(p["prefix_cache_queries"] for p in per_engine),
            "prefix_cache_hits": sum(p["prefix_cache_hits"] for p in per_engine),
            "stalled": stalled,
        },
        per_engine=per_engine,
    )


def samples_table(res: ClusterResult) -> pa.Table:
    """SAMPLES rows of every engine (``source="engine"``, ``engine`` = its name), by time."""
    return engine_samples_table(res.engines, res.samples)


def engine_samples_table(names: Sequence[str], samples: Sequence[dict[str, Any]]) -> pa.Table:
    """SAMPLES rows from per-engine telemetry columns, ``engine`` = the engine's name."""
    parts: dict[str, list[np.ndarray]] = {}
    engine_col: list[np.ndarray] = []
    for name, s in zip(names, samples, strict=True):
        m = len(s["t_s"])
        for k, v in s.items():
            parts.setdefault(k, []).append(np.asarray(v))
        engine_col.append(np.full(m, name, dtype=object))
    cols: dict[str, Any] = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.argsort(cols["t_s"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}
    m = len(order)
    cols["engine"] = pa.array(np.concatenate(engine_col)[order] if m else [], type=pa.string())
    cols["source"] = pa.array(["engine"] * m, type=pa.string())
    for f in schema.SAMPLES:
        if f.name not in cols:
            cols[f.name] = pa.nulls(m, type=f.type)
    return pa.table({f.name: cols[f.name] for f in schema.SAMPLES}, schema=schema.SAMPLES)


__all__ = [
    "ClusterResult",
    "EngineSpec",
    "engine_samples_table",
    "samples_table",
    "simulate_cluster",
]
