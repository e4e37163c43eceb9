"""Load-generator shards as Ray actors on several hosts (``harness replay --ray ADDR
--workers N``).

Each shard runs the ordinary :class:`~harness.loadgen.dispatcher.Dispatcher` in a Ray actor
placed on a chosen node (shards round-robin over the alive nodes), with its own event loop
(uvloop when installed), exactly as a local worker process does
(:mod:`harness.loadgen.workers`). What changes across hosts is the clock: every host has its
own ``CLOCK_MONOTONIC``, so one t0 must be translated into each host's clock.

Clock offsets (NTP's four-timestamp idea with the remote's two stamps taken as one, RFC 5905
§8): the driver stamps ``a``, asks the actor for its clock ``b``, stamps ``c`` on the
answer; ``offset = b - (a + c) / 2`` is exact if the two legs took equal time and wrong by at
most ``(c - a) / 2`` (half the round trip) whatever their split. Of :data:`PINGS` exchanges
the one with the shortest round trip is kept. Each host gets ``t0 + offset``; so a host's
dispatch is within ``u_i = rtt_i / 2`` of the driver's schedule, and two shards are within
``u_i + u_j`` of each other. The offsets are measured again after the run: the change is the
clocks' drift over the run, added to the bound. run.json ``workers`` records every host's
offset, round trip and the resulting ``skew_bound_ms``.

Part files come back to the driver as bytes with each actor's result and are written into
the run's parts folders under the worker's prefix, so the run directory is the same as with
local workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import platform
import resource
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import clock
from harness.cli.errors import HarnessError
from harness.distributed import connect
from harness.loadgen.dispatcher import Dispatcher, DispatchStats, Job
from harness.loadgen.workers import (
    ShardedBase,
    ShardSpec,
    ShardWriter,
    _sum_stats,
    new_event_loop,
)

PINGS = 25
START_TIMEOUT_S = 180.0


@dataclasses.dataclass
class ClockEstimate:
    """One host's clock offset to the driver (host clock - driver clock, s) and its bound."""

    offset_s: float
    rtt_s: float

    @property
    def uncertainty_s(self) -> float:
        return self.rtt_s / 2.0


def estimate_offset(ping: Callable[[], float], pings: int = PINGS) -> ClockEstimate:
    """Offset of a remote clock read by ``ping()`` (a blocking round trip), best of ``pings``
    by round-trip time (module docstring)."""
    best: ClockEstimate | None = None
    for _ in range(pings):
        a = clock.now()
        b = ping()
        c = clock.now()
        est = ClockEstimate(b - (a + c) / 2.0, c - a)
        if best is None or est.rtt_s < best.rtt_s:
            best = est
    assert best is not None
    return best


def skew_bound_s(uncertainties: Sequence[float], drifts: Sequence[float] = ()) -> float:
    """Largest dispatch skew between any two shards: the two largest offset uncertainties
    (one shard early, the other late) plus the largest measured drift."""
    u = sorted(uncertainties, reverse=True)
    pair = u[0] + (u[1] if len(u) > 1 else 0.0) if u else 0.0
    return pair + (max(abs(d) for d in drifts) if drifts else 0.0)


class ShardActor:
    """Body of a Ray actor (wrapped with ``ray.remote`` at use; ray stays optional). Runs with
    two threads: ``run`` holds one for the whole shard, the other answers ``ping``, ``go``,
    ``stats`` and ``stop``."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._go = threading.Event()
        self._t0 = math.nan
        self._stats: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[Any] | None = None
        self._stopped = False
        self._error: str | None = None

    def where(self) -> dict[str, str]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "host": platform.node()}

    def ping(self) -> float:
        return clock.now()

    def wait_ready(self, timeout_s: float) -> str | None:
        """Block until ``run`` is connected and waiting for t0; its error, if any."""
        self._ready.wait(timeout_s)
        return self._error if self._ready.is_set() else "not ready in time"

    def go(self, t0_local: float) -> None:
        self._t0 = t0_local
        self._go.set()

    def stats(self) -> dict[str, Any]:
        return self._stats

    def stop(self) -> None:
        self._stopped = True
        self._go.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)

    def run(self, spec: ShardSpec) -> dict[str, Any]:
        """Dispatch one shard on this host; return its report and its part files."""
        tmp = Path(tempfile.mkdtemp(prefix="harness-shard-"))
        spec = dataclasses.replace(spec, run_dir=tmp)
        out: dict[str, Any] = {}

        def body() -> None:
            # A thread of its own: Ray may already run a loop in the actor's threads.
            loop = self._loop = new_event_loop()
            try:
                out["report"] = loop.run_until_complete(_run_shard(self, spec))
            except BaseException as exc:
                self._error = out["error"] = f"{type(exc).__name__}: {exc}"[:500]
                self._ready.set()
            finally:
                loop.close()

        th = threading.Thread(target=body, name=f"shard-{spec.shard}")
        th.start()
        th.join()
        if "error" in out:
            raise RuntimeError(out["error"])
        report = out["report"]
        parts = {
            str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.glob("*.parts/*.parquet"))
        }
        shutil.rmtree(tmp, ignore_errors=True)
        return {"report": report, "parts": parts}


async def _run_shard(self: ShardActor, spec: ShardSpec) -> dict[str, Any]:
    """The shard's dispatch (a module function: a coroutine method would make Ray run the
    actor as an async actor, one loop for every method)."""
    from harness.loadgen.client import make_session

    kw = dict(spec.dispatcher_kw)
    writer = ShardWriter(spec.run_dir, spec.shard)
    if kw.get("prompt_fn") is not None:
        kw["prompt_fn"](1, 0)
    async with make_session(
        limit=kw.get("max_concurrency") or 0, timeout_s=spec.timeout_s
    ) as session:

        def progress(st: DispatchStats) -> None:
            self._stats = dataclasses.asdict(st)

        disp = Dispatcher(spec.jobs, session=session, writer=writer, on_progress=progress, **kw)
        disp.prepare()
        self._ready.set()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._go.wait)
        if self._stopped:
            return {"stats": dataclasses.asdict(disp.stats), "cpu_s": 0.0}
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self._task = asyncio.ensure_future(disp.run(self._t0))
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        writer.flush()
        self._stats = dataclasses.asdict(disp.stats)
        cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        return {"stats": self._stats, "cpu_s": cpu}


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """Alive Ray nodes that offer a CPU, in a stable order (head first as Ray lists them)."""
    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]


class RayShardedDispatcher(ShardedBase):
    """Same interface as :class:`~harness.loadgen.workers.ShardedDispatcher`, the shards in
    Ray actors spread over the cluster's nodes (module docstring)."""

    def __init__(
        self,
        jobs: list[Job],
        n_workers: int | None,
        *,
        address: str,
        max_concurrency: int | None = None,
        **kw: Any,
    ) -> None:
        self.ray = connect(address)
        self.nodes = alive_nodes(self.ray)
        if not self.nodes:
            raise HarnessError(f"--ray {address}: the cluster has no alive node with a CPU")
        n = n_workers or len(self.nodes)
        n = max(1, min(n, len(jobs), max_concurrency or n))
        super().__init__(jobs, n, max_concurrency=max_concurrency, **kw)
        self.actors: list[Any] = []
        self.places: list[dict[str, str]] = []
        self.clocks: list[ClockEstimate] = []
        self.clocks_end: list[ClockEstimate] = []
        self._refs: list[Any] = []

    def _estimate(self) -> list[ClockEstimate]:
        ray = self.ray
        return [estimate_offset(lambda a=a: ray.get(a.ping.remote())) for a in self.actors]

    def prepare(self) -> None:
        """Place the actors, measure each host's clock offset, start every shard waiting."""
        if self.actors:
            return
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = ray.remote(num_cpus=1, max_concurrency=2)(ShardActor)
        for i in range(self.n):
            node = self.nodes[i % len(self.nodes)]["NodeID"]
            strat = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            self.actors.append(cls.options(scheduling_strategy=strat).remote())
        self.places = ray.get([a.where.remote() for a in self.actors], timeout=START_TIMEOUT_S)
        self.clocks = self._estimate()
        for i, a in enumerate(self.actors):
            kw = dict(self.dispatcher_kw, max_concurrency=self.caps[i])
            spec = ShardSpec(i, self.shards[i], self.run_dir, kw, self.timeout_s)
            self._refs.append(a.run.remote(spec))
        errors = ray.get([a.wait_ready.remote(START_TIMEOUT_S) for a in self.actors])
        bad = [f"shard {i}: {e}" for i, e in enumerate(errors) if e]
        if bad:
            self._kill()
            raise HarnessError("load-generator actors failed to start: " + "; ".join(bad))

    def _kill(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(a)

    async def _progress(self) -> None:
        while True:
            refs = [a.stats.remote() for a in self.actors]
            with contextlib.suppress(Exception):
                self._latest = list(await asyncio.gather(*refs))
            self.stats = _sum_stats(len(self.jobs), self._latest)
            if self.on_progress is not None:
                self.on_progress(self.stats)
            await asyncio.sleep(self.progress_interval_s)

    async def run(self, t0: float) -> DispatchStats:
        """Start every shard on ``t0`` translated to its host's clock; wait for all."""
        self.prepare()
        self.t0 = t0
        ray = self.ray
        ray.get(
            [a.go.remote(t0 + c.offset_s) for a, c in zip(self.actors, self.clocks, strict=True)]
        )
        helper = asyncio.create_task(self._progress())
        error = None
        results: list[Any] = []
        try:
            results = await asyncio.gather(*self._refs, return_exceptions=True)
        except BaseException:
            # Ctrl-C / cancel: every shard cancels its in-flight requests (recorded) and
            # still returns its parts.
            for a in self.actors:
                with contextlib.suppress(Exception):
                    a.stop.remote()
            results = await asyncio.gather(*self._refs, return_exceptions=True)
            raise
        finally:
            helper.cancel()
            await asyncio.gather(helper, return_exceptions=True)
            for i, r in enumerate(results):
                if isinstance(r, BaseException):
                    error = f"shard {i}: {type(r).__name__}: {r}"[:500]
                    continue
                self._write_parts(r["parts"])
                self.reports[i] = r["report"]
                self._latest[i] = r["report"]["stats"]
            self.stats = _sum_stats(len(self.jobs), self._latest)
            with contextlib.suppress(Exception):
                self.clocks_end = self._estimate()
            if self.on_progress is not None:
                self.on_progress(self.stats)
            self.writer.update_meta(workers=self.meta())
            self._kill()
        if error:
            raise HarnessError(f"load generation failed: {error}")
        return self.stats

    def _write_parts(self, parts: dict[str, bytes]) -> None:
        for rel, data in parts.items():
            path = self.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)

    def meta(self) -> dict[str, Any]:
        """run.json ``workers``: hosts, clock offsets and the dispatch-skew bound."""
        drifts = [
            e.offset_s - s.offset_s for s, e in zip(self.clocks, self.clocks_end, strict=False)
        ]
        unc = [c.uncertainty_s for c in self.clocks]
        per = []
        for i, c in enumerate(self.clocks):
            rep = self.reports[i]
            st = rep["stats"] if rep else self._latest[i]
            per.append(
                {
                    "shard": i,
                    "requests": len(self.shards[i]),
                    "max_concurrency": self.caps[i],
                    **(self.places[i] if i < len(self.places) else {}),
                    "clock_offset_ms": round(c.offset_s * 1e3, 4),
                    "clock_rtt_ms": round(c.rtt_s * 1e3, 4),
                    "clock_uncertainty_ms": round(c.uncertainty_s * 1e3, 4),
                    "clock_drift_ms": round(drifts[i] * 1e3, 4) if i < len(drifts) else None,
                    "completed": st.get("done"),
                    "failed": st.get("failed"),
                    "max_release_lag_ms": None
                    if "max_lag_s" not in st
                    else round(st["max_lag_s"] * 1000.0, 3),
                    "cpu_s": None if rep is None else round(rep["cpu_s"], 4),
                }
            )
        return {
            "count": self.n,
            "backend": "ray",
            "hosts": len({p.get("node") for p in self.places}),
            "clock": "per-host CLOCK_MONOTONIC; t0 translated by NTP-style offsets "
            f"(best of {PINGS} round trips)",
            "skew_bound_ms": round(skew_bound_s(unc, drifts) * 1e3, 4),
            "skew_rule": "two largest half round trips + largest offset drift over the run",
            "per_worker": per,
        }
