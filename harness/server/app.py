"""The HTTP layer of the built-in server: OpenAI-compatible routes over an :class:`EngineHost`
(see :mod:`harness.server.host` for the wall-clock engine loop)."""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from typing import Any

from aiohttp import web

from harness import clock
from harness.server.cluster_host import ClusterHost, make_host, session_of
from harness.server.config import HIGH_WATER, ServerConfig
from harness.server.faults import (
    FaultLog,
    FaultPlan,
    FaultSpec,
    choose_fault,
    parse_faults,
)
from harness.server.host import EngineHost, RequestStream
from harness.server.metrics import ServerMetrics
from harness.server.prefix import PrefixCounters, prompt_identity
from harness.server.protocol import (
    ParsedRequest,
    RequestError,
    StreamEncoder,
    error_body,
    parse_request,
)

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
        body = await _read_json(request)
        req = parse_request(body, chat=chat)
        wanted = request.headers.get("x-request-id")
        if wanted is not None and not 0 < len(wanted) <= 256:
            raise RequestError("x-request-id must be 1..256 characters", "x-request-id")
        rid = host.unique_id(wanted)
        plan = choose_fault(app[SPEC_KEY], rid, req.max_tokens)
        if plan is not None and plan.kind == "error":
            _log_fault(app, rid, plan)
            return _json_error("injected fault: internal server error", status=500)
        ident = prompt_identity(body, req, rid) if host.engine_config.prefix_caching else None
        if isinstance(host, ClusterHost):
            st = host.submit(rid, req, session_of(request.headers, body), identity=ident)
        else:
            st = host.submit(rid, req, identity=ident)
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
    request: web.Request,
    host: EngineHost,
    st: RequestStream,
    enc: StreamEncoder,
    plan: FaultPlan | None,
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


def _observe_done(met: ServerMetrics, st: RequestStream, t: float) -> None:
    met.e2e.observe(t - st.arrival_wall)
    met.success_length.inc()


async def _stream(
    request: web.Request,
    host: EngineHost,
    st: RequestStream,
    req: ParsedRequest,
    enc: StreamEncoder,
    plan: FaultPlan | None,
) -> web.StreamResponse:
    app = request.app
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    if request.version >= (1, 1):
        resp.enable_chunked_encoding()
    write = resp.write
    try:
        # inside the try: a client that has already gone (Ctrl-C of the load generator)
        # makes the header write raise, which is that client's abort, not a server error
        await resp.prepare(request)
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


def create_app(cfg: ServerConfig | None = None, **kw: Any) -> web.Application:
    """Build the aiohttp application (engine loop starts with the app, stops on cleanup)."""
    cfg = cfg if cfg is not None else ServerConfig(**kw)
    app = web.Application(middlewares=[_auth_middleware], client_max_size=64 * 2**20)
    host = make_host(cfg)
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
    metrics.registry.register(PrefixCounters(host, metrics.labels))
    if isinstance(host, ClusterHost):
        host.export_per_engine(metrics.registry, metrics.labels)
    app[HOST_KEY] = host  # type: ignore[assignment]  (a ClusterHost serves as one host)
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


def app_of(runner: web.AppRunner) -> web.Application:
    """The application behind a runner (tests read its fault log and host)."""
    return runner.app


async def serve_forever(cfg: ServerConfig, host: str, port: int) -> None:
    """Run until cancelled (Ctrl-C): what ``harness serve`` calls."""
    runner, url = await start_server(cfg, host, port)
    cluster = f", {cfg.replicas} replicas ({cfg.router})" if cfg.replicas > 1 else ""
    print(
        f"harness serve: {cfg.policy} on {cfg.cost_model}, speed {cfg.speed:g}{cluster}, at {url}",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
