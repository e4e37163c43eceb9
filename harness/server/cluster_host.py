"""N engine cores behind one OpenAI endpoint, a router choosing per request (issue 16).

``harness serve --replicas N --router X``: each replica is a full :class:`EngineHost` (its own
core, policy, cost model and wall-clock loop task, all on this event loop), so a cluster and
its router replay live with no GPU. :class:`ClusterHost` offers the app the same surface as one
host (``submit``, ``release``, gauges, stats, lateness), so the HTTP layer serves one engine or
many unchanged. The router sees each replica only through :class:`HostLoad`, the live
:class:`~harness.routers.base.EngineLoad` (the cluster simulator has its own over the same
core), and decides once per request, at arrival; a request never migrates.

A request's session is the ``x-session-id`` header (what ``harness replay`` of a session trace
sends), else the body's OpenAI ``user`` field.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from harness.routers.base import RouteCall, Router
from harness.server.config import ServerConfig
from harness.server.host import EngineHost, RequestStream
from harness.server.metrics import ServerMetrics
from harness.server.protocol import ParsedRequest, RequestError


class HostLoad:
    """One live replica as a router sees it (:class:`harness.routers.base.EngineLoad`)."""

    __slots__ = ("index", "host")

    def __init__(self, index: int, host: EngineHost) -> None:
        self.index = index
        self.host = host

    @property
    def num_waiting(self) -> int:
        return int(self.host.core.num_waiting) + len(self.host.queued())

    @property
    def num_running(self) -> int:
        return int(self.host.core.num_running)

    @property
    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet computed + output tokens not yet generated, accepted
        requests still in the host's inbox included."""
        core = self.host.core
        total = sum(p + m for p, m in self.host.queued())
        for r in (*core.running, *core.waiting):
            total += max(r.num_prompt_tokens - r.num_computed_tokens, 0)
            total += r.max_tokens - r.num_output_tokens
        return total

    @property
    def kv_usage(self) -> float:
        return float(self.host.core.kv_usage)

    def cached_tokens(self, identity: Any) -> int:
        if identity is None:
            return 0
        return int(self.host.core.cached_tokens(identity))


class ClusterHost:
    """``replicas`` engine hosts and a router, with the one-host surface the app uses."""

    def __init__(self, cfg: ServerConfig, router: Router) -> None:
        self.cfg = cfg
        self.speed = cfg.speed
        self.router = router
        self.hosts = [EngineHost(cfg) for _ in range(cfg.replicas)]
        first = self.hosts[0]
        self.engine_config = first.engine_config
        # One lateness buffer and one record list for all replicas: /harness/stats and
        # /harness/requests read the cluster as a whole, as they read one engine.
        self.step_lateness = first.step_lateness
        self.emit_lateness = first.emit_lateness
        self.records = first.records
        for h in self.hosts[1:]:
            h.step_lateness = self.step_lateness
            h.emit_lateness = self.emit_lateness
            h.records = self.records
        self.loads = [HostLoad(i, h) for i, h in enumerate(self.hosts)]
        self.routed = [0] * len(self.hosts)
        self._where: dict[str, tuple[int, RouteCall]] = {}
        self._metrics: ServerMetrics | None = None

    # -- the one-host surface ----------------------------------------------------------------
    @property
    def metrics(self) -> ServerMetrics | None:
        return self._metrics

    @metrics.setter
    def metrics(self, m: ServerMetrics | None) -> None:
        self._metrics = m
        for h in self.hosts:
            h.metrics = m

    @property
    def error(self) -> str | None:
        for i, h in enumerate(self.hosts):
            if h.error is not None:
                return f"engine {i}: {h.error}"
        return None

    @property
    def streams(self) -> dict[str, tuple[int, RouteCall]]:
        return self._where

    def model_now(self, wall: float | None = None) -> float:
        return self.hosts[0].model_now(wall)

    def unique_id(self, wanted: str | None) -> str:
        """``wanted`` (the x-request-id), suffixed if a request in flight on any replica has it."""
        rid = wanted or uuid.uuid4().hex
        if rid in self._where:
            rid = f"{rid}-{uuid.uuid4().hex[:8]}"
        return rid

    def submit(
        self,
        rid: str,
        req: ParsedRequest,
        session_id: str | None = None,
        identity: Any = None,
    ) -> RequestStream:
        """Route the request, then hand it to the chosen replica (:meth:`EngineHost.submit`)."""
        err = self.error
        if err is not None:
            raise RequestError(f"engine failed: {err}", None, status=500)
        call = RouteCall(
            request_id=rid,
            prompt_len=req.prompt_len,
            max_tokens=req.max_tokens,
            tier=req.tier or "default",
            session_id=session_id,
            identity=identity,
        )
        now = self.model_now()
        i = self.router.route(call, self.loads, now)
        if not 0 <= i < len(self.hosts):
            raise RequestError(f"router {self.router.name!r} chose engine {i}", None, status=500)
        try:
            st = self.hosts[i].submit(rid, req, identity=identity)
        except RequestError:
            self.router.on_finish(call, i, now)
            raise
        self._where[rid] = (i, call)
        self.routed[i] += 1
        return st

    def release(self, st: RequestStream) -> None:
        where = self._where.pop(st.rid, None)
        if where is None:
            return
        i, call = where
        self.hosts[i].release(st)
        self.router.on_finish(call, i, self.model_now())

    def start(self) -> None:
        for h in self.hosts:
            h.start()
        t0 = self.hosts[0].t0
        for h in self.hosts[1:]:
            h.t0 = t0  # one model clock for the whole cluster

    async def stop(self) -> None:
        for h in self.hosts:
            await h.stop()

    def kv_capacity_tokens(self) -> int:
        """Per replica: the longest request one engine can hold (``max_model_len``)."""
        return self.hosts[0].kv_capacity_tokens()

    def gauges(self) -> tuple[int, int, float]:
        """Running and waiting summed over replicas; KV usage their mean."""
        running = waiting = 0
        kv = 0.0
        for h in self.hosts:
            r, w, k = h.gauges()
            running += r
            waiting += w
            kv += k
        return running, waiting, kv / len(self.hosts)

    def stats(self) -> dict[str, Any]:
        per = [h.stats() for h in self.hosts]
        return {
            "cpu_s": time.process_time(),
            "tokens_emitted": self.emit_lateness.n,
            "steps": sum(p["steps"] for p in per),
            "resyncs": sum(p["resyncs"] for p in per),
            "in_flight": len(self._where),
            "speed": self.speed,
            "step_lateness": self.step_lateness.stats(),
            "emit_lateness": self.emit_lateness.stats(),
            "router": {"name": self.router.name, "params": self.router.params()},
            "engines": [self.engine_stats(i) for i in range(len(self.hosts))],
        }

    def engine_stats(self, i: int) -> dict[str, Any]:
        """One replica's routing and cache figures (``/harness/stats`` ``engines``)."""
        h = self.hosts[i]
        core = h.core
        return {
            "engine": i,
            "routed": self.routed[i],
            "steps": h.steps,
            "running": int(core.num_running),
            "waiting": int(core.num_waiting),
            "kv_usage": float(core.kv_usage),
            "prefix_cache_queries": int(core.prefix_cache_queries),
            "prefix_cache_hits": int(core.prefix_cache_hits),
        }

    def export_per_engine(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        """Per-replica series under ``harness:engine_*`` (the ``vllm:*`` gauges stay the
        cluster's totals, so a vLLM dashboard reads the endpoint as one engine)."""
        registry.register(_PerEngine(self, labels))


class _PerEngine(Collector):
    """Per-replica gauges and counters, read at scrape time, labelled ``replica``."""

    def __init__(self, cluster: ClusterHost, labels: dict[str, str]) -> None:
        self.cluster = cluster
        self.labels = {k: v for k, v in labels.items() if k != "engine"}

    def collect(self) -> Iterator[Any]:  # noqa: D102
        names = [*self.labels, "replica"]
        base = list(self.labels.values())
        rows = [self.cluster.engine_stats(i) for i in range(len(self.cluster.hosts))]
        for key, doc, kind in (
            ("running", "Requests running on the replica.", GaugeMetricFamily),
            ("waiting", "Requests waiting on the replica.", GaugeMetricFamily),
            ("kv_usage", "KV-cache usage of the replica (1 = full).", GaugeMetricFamily),
            ("routed", "Requests the router sent to the replica.", CounterMetricFamily),
            ("prefix_cache_queries", "Prompt tokens looked up.", CounterMetricFamily),
            ("prefix_cache_hits", "Prompt tokens found cached.", CounterMetricFamily),
        ):
            fam = kind(f"harness:engine_{key}", doc, labels=names)
            for row in rows:
                fam.add_metric([*base, str(row["engine"])], float(row[key]))
            yield fam


def make_host(cfg: ServerConfig) -> EngineHost | ClusterHost:
    """One :class:`EngineHost` for one replica, else a :class:`ClusterHost` with the
    configured router (``harness serve --replicas N --router X``)."""
    if cfg.replicas <= 1:
        return EngineHost(cfg)
    from harness.routers.registry import make_router

    return ClusterHost(cfg, make_router(cfg.router, **cfg.router_params))


def check_config(cfg: ServerConfig) -> None:
    """Build policy, cost model, engine (and router) once so bad input fails before binding
    a port."""
    try:
        make_host(cfg)
    except TypeError as e:  # a router parameter it does not take
        raise ValueError(str(e)) from None


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


def session_of(headers: Any, body: Any) -> str | None:
    """The request's session: the ``x-session-id`` header, else the body's ``user`` field."""
    sid = headers.get("x-session-id")
    if sid:
        return str(sid)[:256]
    user = body.get("user") if isinstance(body, dict) else None
    return user[:256] if isinstance(user, str) and user else None
