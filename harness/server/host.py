"""The built-in OpenAI-compatible engine server: the engine core run in wall-clock time.

Why: ``harness replay`` needs a target on a machine with no GPU, and every policy should be
exercised over real HTTP exactly as a live engine would be (design.md "One flow"). The same
:class:`~harness.engine.core.EngineCore` as the simulator runs here; only "advance to t"
differs (style-examples.md take-away 6: one core, two clocks).

Wall-clock host (one engine-loop task):

1. If there is no work, wait on an :class:`asyncio.Event` set by the next arrival (no
   polling). The first step after idle starts at the arrival's model time (the wake-up
   latency delays that step's tokens, never the schedule).
2. ``outcome = core.step(m)`` at model time ``m``; then sleep until the wall time of
   ``m + duration_s`` on an *absolute* schedule: wall = ``t0 + model / speed``. Steps run
   back to back in model time (the next one starts at ``m + duration_s``) however late the
   loop woke, so lateness never accumulates into drift; it is recorded (``harness:
   step_lateness_seconds``). Only if the loop falls more than ``max_catchup_s`` behind does
   it resynchronise to "now" (counted in ``/harness/stats``).
3. At the step's end the tokens sampled in it (policies/base.py host rule 5) are written:
   directly by the engine loop on the hot path, or by the request's HTTP handler (faults,
   slow readers; see :class:`RequestStream`). If a handler is behind when several tokens are
   pending it sends them in one chunk, as vLLM's output collector merges deltas for a slow
   consumer.

Arrivals wait in an inbox stamped with their model arrival time; a step at model time ``m``
sees only those with ``arrival <= m``, so a late-running step never swallows a request that
arrived after its modeled start (the simulator's ``ARRIVAL < STEP_START`` event order). With
the same arrivals the host therefore takes exactly the simulator's decisions
(``harness.server.fidelity.engine_match`` checks this per request).

Model time vs wall time: the core and the policy see model seconds; the client sees wall
seconds = model / ``speed``. SLOs arriving in ``vllm_xargs`` are client (wall) seconds and
are multiplied by ``speed`` for the policy, so ``--speed`` compresses the whole timeline
consistently.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE in vLLM's chunk format,
or one JSON body when ``stream`` is false), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus, vLLM names), ``GET /harness/stats`` (lateness statistics for benchmarks) and
``POST /harness/stats/reset``, ``GET /harness/faults`` (the injected-fault log as JSON),
``GET /harness/requests`` (per-request model times, with ``record_requests``).
The ``x-request-id`` header names the request (as in vLLM) and is what the fault log records.
With ``api_key`` set, every path but ``/health`` and ``/metrics`` needs
``Authorization: Bearer <key>`` (401 otherwise); those two stay open as in vLLM so probes and
the metrics sampler work.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness import clock
from harness.server.config import HIGH_WATER, ServerConfig, engine_kwargs, log
from harness.server.metrics import ServerMetrics
from harness.server.protocol import (
    DONE,
    ParsedRequest,
    RequestError,
    StreamEncoder,
)
from harness.workload.tiers import Tier, default_tiers, parse_tiers


@dataclass(slots=True)
class RequestStream:
    """One request's hand-off between the engine loop and its HTTP handler.

    Two modes. *Handler mode*: the engine loop appends ``(tokens, modeled time)`` to
    ``pending`` and wakes the handler task, which writes. *Direct mode* (a streaming request
    with nothing pending, no fault due and a socket that keeps up): the engine loop writes the
    chunk to the transport itself, synchronously, at the step's end. Direct mode is the hot
    path: it saves a task switch per token, which is what keeps emission within ~1 ms of the
    modeled schedule at >10k tokens/s (benchmarks/bench_server.py). The handler takes over
    for faults, a slow reader (> ``HIGH_WATER`` bytes queued) and the end of the stream.
    """

    rid: str
    max_tokens: int
    arrival_wall: float
    produced: int = 0  # tokens the engine has sampled
    pending: list[tuple[int, float]] = field(default_factory=list)  # (n tokens, wall target)
    finished: bool = False
    failed: str | None = None
    waiter: asyncio.Future | None = None
    first_wall: float | None = None
    last_wall: float | None = None
    sent: int = 0  # tokens written to the client
    hold_at: int = -1  # the handler must act before token #hold_at (a fault); -1 = none
    tail_written: bool = False  # final chunk, usage and [DONE] are out
    direct: bool = False
    transport: Any = None
    framed: bool = True  # HTTP/1.1 chunked framing for direct writes
    enc: StreamEncoder | None = None
    include_usage: bool = False
    debug: bool = False
    host: EngineHost | None = None

    def push(self, n: int, t_sched: float) -> None:
        self.produced += n
        if self.direct and (self.hold_at < 0 or self.sent + n <= self.hold_at):
            try:
                self._write_direct(n, t_sched)
            except Exception as e:  # never let one socket take the engine loop down
                self.direct = False
                self.fail(f"write failed: {type(e).__name__}: {e}")
            return
        self.pending.append((n, t_sched))
        self._wake()

    def chunk_bytes(self, n: int, t_sched: float) -> tuple[bytes, bool]:
        """The SSE bytes for the next ``n`` tokens (plus the tail when they are the last)."""
        enc = self.enc
        assert enc is not None
        s = self.sent
        done = s + n >= self.max_tokens
        data = enc.token_chunk(s, n, done, t_sched if self.debug else None)
        if s == 0 and enc.chat:
            data = enc.role_chunk() + data
        if done:
            if self.include_usage:
                data += enc.usage_chunk(s + n)
            data += DONE
        return data, done

    def mark_sent(self, n: int, t_sched: float, t: float, done: bool) -> None:
        """Bookkeeping after a write: lateness, TTFT/ITL histograms, tail flag."""
        host = self.host
        assert host is not None
        host.emit_lateness.add(t - t_sched)
        met = host.metrics
        if met is not None:
            met.generation_tokens.inc(n)
            if self.sent == 0:
                met.ttft.observe(t - self.arrival_wall)
            else:
                met.itl.observe(t - (self.last_wall or t))
        if self.sent == 0:
            self.first_wall = t
        self.last_wall = t
        self.sent += n
        if done:
            self.tail_written = True

    def _write_direct(self, n: int, t_sched: float) -> None:
        tr = self.transport
        if tr is None or tr.is_closing():
            self.direct = False
            self.fail("client disconnected")
            return
        data, done = self.chunk_bytes(n, t_sched)
        if self.framed:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        tr.write(data)
        self.mark_sent(n, t_sched, clock.now(), done)
        if done or self.sent == self.hold_at or tr.get_write_buffer_size() > HIGH_WATER:
            self.direct = False
            self._wake()

    def finish(self) -> None:
        self.finished = True
        self._wake()

    def fail(self, reason: str) -> None:
        self.failed = reason
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _ready(self) -> bool:
        return bool(
            self.pending
            or self.tail_written
            or self.failed is not None
            or (self.finished and not self.direct)
            or (self.hold_at >= 0 and self.sent == self.hold_at)
        )

    async def wait(self) -> None:
        """Return once the handler has something to do (see :meth:`_ready`)."""
        while not self._ready():
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None


class _Lateness:
    """Growable buffer of lateness samples (s); cheap appends on the hot path."""

    def __init__(self) -> None:
        self._buf = array("d")
        self.add = self._buf.append

    @property
    def n(self) -> int:
        return len(self._buf)

    def stats(self) -> dict[str, float | int]:
        a = np.frombuffer(self._buf, dtype=np.float64) if len(self._buf) else np.empty(0)
        if not len(a):
            return {"count": 0}
        p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
        return {
            "count": int(len(a)),
            "mean_ms": float(a.mean() * 1e3),
            "p50_ms": float(p50 * 1e3),
            "p99_ms": float(p99 * 1e3),
            "p99.9_ms": float(p999 * 1e3),
            "max_ms": float(a.max() * 1e3),
        }

    def reset(self) -> None:
        del self._buf[:]


class EngineHost:
    """Runs one :class:`EngineCore` in wall-clock time and feeds the request streams."""

    def __init__(self, cfg: ServerConfig) -> None:
        from harness.engine.core import EngineConfig, EngineCore
        from harness.engine.costmodel import get_cost_model
        from harness.policies.registry import make_policy

        self.cfg = cfg
        self.speed = cfg.speed
        policy = make_policy(cfg.policy, **cfg.policy_params)
        cost = get_cost_model(cfg.cost_model)
        self.engine_config = EngineConfig(**engine_kwargs(cfg))
        self.core = EngineCore(policy, cost, self.engine_config)
        self.tiers: dict[str, Tier] = {
            t.name: t for t in (parse_tiers(cfg.tiers) if cfg.tiers else default_tiers())
        }
        self.streams: dict[str, RequestStream] = {}
        self.t0 = clock.now()
        self._next_model: float | None = None
        self._inbox: deque[tuple[RequestStream, int, int, dict[str, Any]]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.error: str | None = None
        self.steps = 0
        self.resyncs = 0
        self.step_lateness = _Lateness()
        self.emit_lateness = _Lateness()
        self.metrics: ServerMetrics | None = None
        self._preempt_seen = 0
        # (request_id, arrival, first token, last token, preemptions) in model seconds, per
        # finished request, when cfg.record_requests (fidelity checks; grows with the run).
        self.records: list[tuple[str, float, float | None, float | None, int]] | None = (
            [] if cfg.record_requests else None
        )

    # -- time ------------------------------------------------------------------------------
    def model_now(self, wall: float | None = None) -> float:
        return ((clock.now() if wall is None else wall) - self.t0) * self.speed

    def wall_of(self, model_s: float) -> float:
        return self.t0 + model_s / self.speed

    # -- requests --------------------------------------------------------------------------
    def unique_id(self, wanted: str | None) -> str:
        rid = wanted or uuid.uuid4().hex
        if rid in self.streams:
            rid = f"{rid}-{uuid.uuid4().hex[:8]}"
        return rid

    def submit(self, rid: str, req: ParsedRequest, identity: Any = None) -> RequestStream:
        """Add a validated request to the core; :class:`RequestError` if it can never fit.
        ``identity`` (a PromptIdentity) lets the core's prefix cache match its tokens."""
        if self.error is not None:
            raise RequestError(f"engine failed: {self.error}", None, status=500)
        tier = self.tiers.get(req.tier) if req.tier is not None else None
        ttft = req.ttft_slo_s if req.ttft_slo_s is not None else (tier and tier.ttft_slo_s)
        tbt = req.tbt_slo_s if req.tbt_slo_s is not None else (tier and tier.tbt_slo_s)
        prio = req.priority if req.priority is not None else (tier.priority if tier else 0)
        problem = self.core.fit_problem(req.prompt_len, req.max_tokens)
        if problem is not None:  # the simulator's rejection rule (EngineCore.fit_problem)
            raise RequestError(f"request rejected: {problem}", "max_tokens")
        wall = clock.now()
        kw = {
            "arrival_s": self.model_now(wall),
            "predicted_output_len": req.predicted_output_len,
            "tier": req.tier or "default",
            "priority": int(prio),
            "ttft_slo_s": None if ttft is None else ttft * self.speed,
            "tbt_slo_s": None if tbt is None else tbt * self.speed,
            "identity": identity,
        }
        st = RequestStream(rid=rid, max_tokens=req.max_tokens, arrival_wall=wall)
        self._inbox.append((st, req.prompt_len, req.max_tokens, kw))
        self.streams[rid] = st
        self._wake.set()
        return st

    def _admit_arrivals(self, m: float) -> None:
        """Hand the core every arrival stamped at or before model time ``m``, in order.

        Why an inbox: when the loop runs a step late (catching up on the absolute schedule),
        requests that reached the server after the step's modeled start must not join it;
        the simulator orders events ``(time, ARRIVAL < STEP_START)`` (simulate.py) and so does
        this host.
        """
        inbox = self._inbox
        core = self.core
        while inbox and inbox[0][3]["arrival_s"] <= m:
            st, plen, mtok, kw = inbox.popleft()
            if self.streams.get(st.rid) is st:  # not released while waiting in the inbox
                core.add_request(st.rid, plen, mtok, **kw)

    def release(self, st: RequestStream) -> None:
        """The handler is done with ``st``: abort it in the core if it is still running."""
        if self.streams.pop(st.rid, None) is not None and not st.finished:
            with contextlib.suppress(KeyError, ValueError):
                self.core.abort(st.rid)
            if self.metrics is not None:
                self.metrics.success_abort.inc()

    # -- loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = clock.now()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a core/policy bug: fail every stream loudly, keep serving 500s
            log.exception("engine loop failed")
            self.error = f"{type(e).__name__}: {e}"
            for st in list(self.streams.values()):
                st.fail(self.error)

    async def _loop(self) -> None:
        core = self.core
        now = clock.now
        sleep = asyncio.sleep
        inbox = self._inbox
        while True:
            if not core.has_work() and not inbox:
                self._next_model = None
                self._wake.clear()
                await self._wake.wait()
                continue
            wall = now()
            m = self._next_model
            if m is None:
                # Idle until now: the step starts at the first arrival, as simulated (the
                # wake-up latency only delays its tokens' emission, never the schedule).
                m = inbox[0][3]["arrival_s"] if inbox else self.model_now(wall)
            if wall - self.wall_of(m) > self.cfg.max_catchup_s:
                self.resyncs += 1
                m = self.model_now(wall)
            if not core.has_work() and inbox[0][3]["arrival_s"] > m:
                m = inbox[0][3]["arrival_s"]  # idle until the next arrival, as simulated
            self._admit_arrivals(m)
            if not core.has_work():
                continue
            out = core.step(m)
            if out.idle:
                # The policy holds every request back (e.g. a WAIT threshold): re-ask it after
                # an arrival or after one step's worth of time, whichever comes first.
                self._next_model = None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.idle_recheck_s())
                continue
            self.steps += 1
            end_m = m + out.duration_s
            target = self.wall_of(end_m)
            delay = target - now() - self.cfg.spin_s
            if delay > 0:
                await sleep(delay)  # wakes up to ~1 ms late (epoll timeouts are whole ms)
            while now() < target:  # the last stretch: yield to handlers until the target
                await sleep(0)
            late = now() - target
            self.step_lateness.add(late)
            met = self.metrics
            if met is not None:
                met.step_lateness.observe(max(late, 0.0))
            streams = self.streams
            n_each = out.tokens_each
            for r in out.sampled:
                st = streams.get(r.request_id)
                if st is not None:
                    st.push(n_each, target)
            for r in out.finished:
                st = streams.get(r.request_id)
                if st is not None:
                    st.finish()
                if self.records is not None:
                    self.records.append(
                        (
                            r.request_id,
                            r.arrival_s,
                            r.first_token_s,
                            r.last_token_s,
                            r.num_preemptions,
                        )
                    )
            if met is not None:
                rep = out.report
                if rep is not None and rep.prefill_tokens:
                    met.prompt_tokens.inc(rep.prefill_tokens)
                pre = int(core.preemptions_total)
                if pre > self._preempt_seen:
                    met.preemptions.inc(pre - self._preempt_seen)
                    self._preempt_seen = pre
            self._next_model = end_m

    def idle_recheck_s(self) -> float:
        """Wall seconds before re-asking a policy that scheduled nothing while work waits."""
        last = self.core.last_step_s or 0.01
        return max(last, 1e-3) / self.speed

    def kv_capacity_tokens(self) -> int:
        return int(self.engine_config.capacity_tokens)

    def gauges(self) -> tuple[int, int, float]:
        c = self.core
        return int(c.num_running), int(c.num_waiting), float(c.kv_usage)

    def queued(self) -> list[tuple[int, int]]:
        """(prompt_len, max_tokens) of requests accepted but not yet handed to the core: a
        router must count them, or a burst within one step all lands on one engine."""
        return [(plen, mtok) for _st, plen, mtok, _kw in self._inbox]

    def stats(self) -> dict[str, Any]:
        return {
            "cpu_s": time.process_time(),  # this process's CPU time: cost per token in benches
            "tokens_emitted": self.emit_lateness.n,
            "steps": self.steps,
            "resyncs": self.resyncs,
            "in_flight": len(self.streams),
            "speed": self.speed,
            "step_lateness": self.step_lateness.stats(),
            "emit_lateness": self.emit_lateness.stats(),
        }
