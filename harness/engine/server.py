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
   slow readers; see :class:`_Stream`). If a handler is behind when several tokens are
   pending it sends them in one chunk, as vLLM's output collector merges deltas for a slow
   consumer.

Arrivals wait in an inbox stamped with their model arrival time; a step at model time ``m``
sees only those with ``arrival <= m``, so a late-running step never swallows a request that
arrived after its modeled start (the simulator's ``ARRIVAL < STEP_START`` event order). With
the same arrivals the host therefore takes exactly the simulator's decisions
(``server_fidelity.engine_match`` checks this per request).

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
import hmac
import json
import logging
import socket
import time
import uuid
from array import array
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness import clock
from harness.engine.costmodel import DEFAULT_COST_MODEL
from harness.engine.server_faults import (
    FaultLog,
    FaultPlan,
    FaultSpec,
    choose_fault,
    parse_faults,
)
from harness.engine.server_metrics import ServerMetrics
from harness.engine.server_protocol import (
    DONE,
    ParsedRequest,
    RequestError,
    StreamEncoder,
    error_body,
    parse_request,
)
from harness.workload.tiers import Tier, default_tiers, parse_tiers

log = logging.getLogger("harness.serve")

DEFAULT_MODEL = "harness-builtin"


class ServerConfig(BaseModel):
    """Everything ``harness serve`` / :func:`embedded` take; validated, never mutated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field("vllm", description="registered policy name (harness policies)")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="policy kwargs")
    cost_model: str = Field(DEFAULT_COST_MODEL, description="cost-model preset or JSON path")
    kv_tokens: int | None = Field(None, ge=1, description="KV capacity in tokens; None=preset")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="extra EngineConfig fields (block_size, ...)"
    )
    speed: float = Field(1.0, gt=0, description="wall seconds = model seconds / speed")
    model: str = Field(DEFAULT_MODEL, description="model name served and echoed")
    api_key: str | None = Field(None, description="required Bearer token; None = open")
    faults: str | None = Field(None, description="fault spec, see server_faults")
    fault_log: Path | None = Field(None, description="JSONL file recording injected faults")
    tiers: str | None = Field(None, description="tier spec to resolve SLOs from a tier name")
    record_requests: bool = Field(
        False, description="keep per-request model times for GET /harness/requests"
    )
    spin_s: float = Field(
        1e-3,
        ge=0,
        description="end each step's sleep this early and yield-spin to the exact target "
        "(epoll rounds timeouts up to whole ms)",
    )
    max_catchup_s: float = Field(
        0.25, gt=0, description="wall lateness (s) beyond which the loop resynchronises"
    )

    @field_validator("faults")
    @classmethod
    def _check_faults(cls, v: str | None) -> str | None:
        parse_faults(v)
        return v

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, v: str | None) -> str | None:
        if v is not None:
            parse_tiers(v)
        return v


HIGH_WATER = 1 << 18  # bytes queued in a socket before direct writes hand over to the handler


def engine_kwargs(cfg: ServerConfig) -> dict[str, Any]:
    """EngineConfig keywords, with KV capacity resolved exactly as ``harness simulate`` does
    (SimulateConfig.engine_config): ``kv_tokens`` if given, else the cost-model preset's GPU
    memory / weights / KV bytes per token, else unbounded. Same flags, same engine."""
    from harness.engine.costmodel import HARDWARE
    from harness.engine.simulate import UNBOUNDED_KV_TOKENS

    kw = dict(cfg.engine)
    if cfg.kv_tokens is not None:
        kw["kv_tokens"] = cfg.kv_tokens
    elif not {"num_blocks", "kv_tokens", "gpu_mem_gib"} & set(kw):
        hw = HARDWARE.get(cfg.cost_model.partition(":")[0], {})
        if hw.get("gpu_mem_gib") and hw.get("kv_bytes_per_token"):
            kw.update(hw)
        else:
            kw["kv_tokens"] = UNBOUNDED_KV_TOKENS
    return kw


@dataclass(slots=True)
class _Stream:
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
        self.streams: dict[str, _Stream] = {}
        self.t0 = clock.now()
        self._next_model: float | None = None
        self._inbox: deque[tuple[_Stream, int, int, dict[str, Any]]] = deque()
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

    def submit(self, rid: str, req: ParsedRequest) -> _Stream:
        """Add a validated request to the core; :class:`RequestError` if it can never fit."""
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
        }
        st = _Stream(rid=rid, max_tokens=req.max_tokens, arrival_wall=wall)
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

    def release(self, st: _Stream) -> None:
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


# -- HTTP layer ----------------------------------------------------------------------------
HOST_KEY = web.AppKey("host", EngineHost)
CFG_KEY = web.AppKey("cfg", ServerConfig)
FAULTS_KEY = web.AppKey("faults", FaultLog)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
SPEC_KEY = web.AppKey("fault_spec", FaultSpec)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
}
_OPEN_PATHS = frozenset({"/health", "/metrics"})


def _json_error(message: str, *, param: str | None = None, status: int = 400) -> web.Response:
    return web.json_response(error_body(message, param=param, code=status), status=status)


@web.middleware
async def _auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    key = request.app[CFG_KEY].api_key
    if key is not None and request.path not in _OPEN_PATHS:
        got = request.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
            return _json_error("invalid or missing API key", status=401)
    return await handler(request)


async def _read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise RequestError("request body is not valid JSON", None) from None


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    app = request.app
    host = app[HOST_KEY]
    cfg = app[CFG_KEY]
    try:
        req = parse_request(await _read_json(request), chat=chat)
        wanted = request.headers.get("x-request-id")
        if wanted is not None and not 0 < len(wanted) <= 256:
            raise RequestError("x-request-id must be 1..256 characters", "x-request-id")
        rid = host.unique_id(wanted)
        plan = choose_fault(app[SPEC_KEY], rid, req.max_tokens)
        if plan is not None and plan.kind == "error":
            _log_fault(app, rid, plan)
            return _json_error("injected fault: internal server error", status=500)
        st = host.submit(rid, req)
    except RequestError as e:
        return _json_error(e.message, param=e.param, status=e.status)
    prefix = "chatcmpl-" if chat else "cmpl-"
    enc = StreamEncoder(
        chat=chat,
        rid=rid if rid.startswith(prefix) else prefix + rid,
        model=cfg.model,
        prompt_len=req.prompt_len,
        continuous=req.continuous_usage,
    )
    try:
        if plan is not None and plan.kind == "slow_first":
            _log_fault(app, rid, plan)
            await asyncio.sleep(plan.duration_s)
        if req.stream:
            return await _stream(request, host, st, req, enc, plan)
        return await _unary(request, host, st, enc, plan)
    finally:
        host.release(st)


def _log_fault(app: web.Application, rid: str, plan: FaultPlan) -> None:
    app[FAULTS_KEY].record(rid, plan)
    app[METRICS_KEY].fault(plan.kind)


async def _unary(
    request: web.Request, host: EngineHost, st: _Stream, enc: StreamEncoder, plan: FaultPlan | None
) -> web.StreamResponse:
    while not st.finished and st.failed is None:
        st.pending.clear()
        await st.wait()
    if st.failed is not None:
        return _json_error(f"engine failed: {st.failed}", status=500)
    _observe_done(request.app[METRICS_KEY], st, clock.now())
    body = json.dumps(enc.full_response(st.produced)).encode()
    if plan is not None and plan.kind == "stall":
        _log_fault(request.app, st.rid, plan)
        await asyncio.sleep(plan.duration_s)
    if plan is not None and plan.kind in ("drop", "malformed"):
        _log_fault(request.app, st.rid, plan)
        if plan.kind == "drop":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)  # never reaches the closed socket
        body = body[: len(body) // 2]
    return web.Response(body=body, content_type="application/json")


def _observe_done(met: ServerMetrics, st: _Stream, t: float) -> None:
    met.e2e.observe(t - st.arrival_wall)
    met.success_length.inc()


async def _stream(
    request: web.Request,
    host: EngineHost,
    st: _Stream,
    req: ParsedRequest,
    enc: StreamEncoder,
    plan: FaultPlan | None,
) -> web.StreamResponse:
    app = request.app
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    if request.version >= (1, 1):
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    write = resp.write
    try:
        await write(b"")  # send the headers now, as vLLM does, before the first token
        st.transport = request.transport
        st.framed = resp.chunked
        st.enc = enc
        st.include_usage = req.include_usage
        st.debug = req.debug_timing
        st.host = host
        if plan is not None and plan.kind != "slow_first":
            st.hold_at = plan.at_token
        while True:
            if st.failed is not None:
                if request.transport is not None:
                    request.transport.close()
                return resp
            if st.hold_at >= 0 and st.sent == st.hold_at:
                assert plan is not None
                st.hold_at = -1
                _log_fault(app, st.rid, plan)
                if plan.kind == "drop":
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if plan.kind == "malformed":
                    await write(enc.malformed_chunk())
                elif plan.kind == "stall":
                    await asyncio.sleep(plan.duration_s)
                continue
            if st.tail_written:
                break
            if st.pending:
                n = 0
                t_first = st.pending[0][1]
                limit = st.hold_at - st.sent if st.hold_at > st.sent else 1 << 62
                while st.pending and n < limit:
                    k, t_k = st.pending[0]
                    take = min(k, limit - n)
                    n += take
                    if take == k:
                        st.pending.pop(0)
                    else:
                        st.pending[0] = (k - take, t_k)
                data, done = st.chunk_bytes(n, t_first)
                await write(data)
                st.mark_sent(n, t_first, clock.now(), done)
                continue
            tr = request.transport
            if not st.finished and tr is not None and tr.get_write_buffer_size() <= HIGH_WATER:
                st.direct = True  # nothing pending, no fault due: the engine loop writes
            await st.wait()
            st.direct = False
        await resp.write_eof()
        _observe_done(app[METRICS_KEY], st, clock.now())
    except (ConnectionResetError, ConnectionError, RuntimeError):
        # The client went away (or the transport closed under us): the engine aborts it.
        pass
    finally:
        st.direct = False
    return resp


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[CFG_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": cfg.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "harness",
                    "root": cfg.model,
                    "max_model_len": int(request.app[HOST_KEY].kv_capacity_tokens()),
                }
            ],
        }
    )


async def _health(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    if host.error is not None:
        return web.Response(status=503, text=host.error)
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _stats(request: web.Request) -> web.Response:
    s = request.app[HOST_KEY].stats()
    s["faults"] = request.app[FAULTS_KEY].counts()
    return web.json_response(s)


async def _requests(request: web.Request) -> web.Response:
    recs = request.app[HOST_KEY].records
    if recs is None:
        return _json_error("start the server with record_requests (--record-requests)", status=404)
    keys = ("request_id", "arrival_s", "first_token_s", "last_token_s", "num_preemptions")
    return web.json_response([dict(zip(keys, r, strict=True)) for r in recs])


async def _faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[FAULTS_KEY].events)


async def _stats_reset(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    host.step_lateness.reset()
    host.emit_lateness.reset()
    return web.json_response({"ok": True})


def check_config(cfg: ServerConfig) -> None:
    """Build policy, cost model and engine once so bad input fails before binding a port."""
    EngineHost(cfg)


def create_app(cfg: ServerConfig | None = None, **kw: Any) -> web.Application:
    """Build the aiohttp application (engine loop starts with the app, stops on cleanup)."""
    cfg = cfg if cfg is not None else ServerConfig(**kw)
    app = web.Application(middlewares=[_auth_middleware], client_max_size=64 * 2**20)
    host = EngineHost(cfg)
    cap = host.kv_capacity_tokens()
    block = getattr(host.engine_config, "block_size", 16)
    metrics = ServerMetrics(
        model=cfg.model,
        read_gauges=host.gauges,
        cache_info={
            "block_size": str(block),
            "num_gpu_blocks": str(cap // block if block else 0),
            "kv_cache_size_tokens": str(cap),
            "policy": cfg.policy,
            "cost_model": cfg.cost_model,
        },
    )
    host.metrics = metrics
    app[HOST_KEY] = host
    app[CFG_KEY] = cfg
    app[METRICS_KEY] = metrics
    app[FAULTS_KEY] = FaultLog(cfg.fault_log)
    app[SPEC_KEY] = parse_faults(cfg.faults)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/harness/stats", _stats)
    app.router.add_post("/harness/stats/reset", _stats_reset)
    app.router.add_get("/harness/faults", _faults)
    app.router.add_get("/harness/requests", _requests)

    async def _on_startup(app: web.Application) -> None:
        app[HOST_KEY].start()

    async def _on_cleanup(app: web.Application) -> None:
        await app[HOST_KEY].stop()
        app[FAULTS_KEY].close()

    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app


async def start_server(
    cfg: ServerConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Start ``cfg``'s app on ``host:port`` (0 = a free port); return the runner and base URL."""
    app = create_app(cfg)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        await runner.cleanup()
        raise
    site = web.SockSite(runner, sock)
    await site.start()
    real_port = sock.getsockname()[1]
    h = f"[{host}]" if ":" in host else host
    return runner, f"http://{h}:{real_port}"


def embedded(
    policy: str = "vllm",
    cost_model: str = DEFAULT_COST_MODEL,
    kv_tokens: int | None = None,
    speed: float = 1.0,
    faults: str | None = None,
    *,
    process: bool = False,
    **kw: Any,
) -> contextlib.AbstractAsyncContextManager[str]:
    """Run the built-in server on a free 127.0.0.1 port; yield its base URL.

    ``process=False`` serves from this event loop (tests reach into the app). ``process=True``
    serves from a spawned child process, so that a load generator in this process and the
    engine loop never delay each other: measured with `harness replay --trace lmsys --rate 50`
    on 2 cores, the in-loop server pushed the client's send lag p99 to 256 ms, which marks the
    run invalid. Only built-in (importable) policies work in a child process.

    Extra keywords are :class:`ServerConfig` fields (``model``, ``api_key``, ``fault_log``,
    ``tiers``, ``engine``, ``policy_params``...). The server stops when the block exits.
    Bad settings raise :class:`ValueError` (one line) here, before the block is entered.
    """
    cfg = make_config(
        policy=policy, cost_model=cost_model, kv_tokens=kv_tokens, speed=speed, faults=faults, **kw
    )
    return _embedded_process(cfg) if process else _embedded(cfg)


def _child_main(cfg_json: str, conn: Any) -> None:
    """Entry point of the server child process: start, report the URL, serve until SIGTERM."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    cfg = ServerConfig.model_validate_json(cfg_json)

    async def main() -> None:
        runner, url = await start_server(cfg, "127.0.0.1", 0)
        conn.send(url)
        conn.close()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(SystemExit):
        asyncio.run(main())


@contextlib.asynccontextmanager
async def _embedded_process(cfg: ServerConfig) -> AsyncIterator[str]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child_main, args=(cfg.model_dump_json(), child), name="harness-serve", daemon=True
    )
    proc.start()
    child.close()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, parent.poll, 120):
            raise RuntimeError("the built-in server did not start within 120 s")
        try:
            url = parent.recv()
        except EOFError:
            raise RuntimeError(
                f"the built-in server exited during start-up (exit code {proc.exitcode})"
            ) from None
        yield url
    finally:
        parent.close()
        proc.terminate()
        await loop.run_in_executor(None, proc.join, 10)
        if proc.is_alive():
            proc.kill()
            await loop.run_in_executor(None, proc.join, 5)


def make_config(**kw: Any) -> ServerConfig:
    """A validated :class:`ServerConfig` whose policy, cost model and engine all build;
    any problem is a one-line :class:`ValueError`."""
    from pydantic import ValidationError

    try:
        cfg = ServerConfig(**kw)
        check_config(cfg)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "config"
        msg = str(err.get("msg", e)).removeprefix("Value error, ")
        raise ValueError(f"{where}: {msg}") from None
    return cfg


@contextlib.asynccontextmanager
async def _embedded(cfg: ServerConfig) -> AsyncIterator[str]:
    runner, url = await start_server(cfg, "127.0.0.1", 0)
    try:
        yield url
    finally:
        await runner.cleanup()


def app_of(runner: web.AppRunner) -> web.Application:
    """The application behind a runner (tests read its fault log and host)."""
    return runner.app


async def serve_forever(cfg: ServerConfig, host: str, port: int) -> None:
    """Run until cancelled (Ctrl-C): what ``harness serve`` calls."""
    runner, url = await start_server(cfg, host, port)
    print(
        f"harness serve: {cfg.policy} on {cfg.cost_model}, speed {cfg.speed:g}, at {url}",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


__all__ = [
    "DEFAULT_COST_MODEL",
    "DEFAULT_MODEL",
    "EngineHost",
    "ServerConfig",
    "check_config",
    "create_app",
    "embedded",
    "make_config",
    "serve_forever",
    "start_server",
]
