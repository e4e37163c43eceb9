"""Multi-process load generation (``harness replay --workers N``, issue 18).

One asyncio process tops out near 2,000 req/s of 100-token streams and its send lag grows
before that (one GIL, one event loop). Peers scale out with processes (inference-perf,
GuideLLM). Here the schedule is split into N shards, each run by the ordinary
:class:`~harness.loadgen.dispatcher.Dispatcher` in its own spawned process with its own event
loop (uvloop when installed), so every rule of the dispatcher (absolute targets, release of
everything due, duration/drain bounds, cancellation records) holds per shard unchanged.

- **Sharding**: by session when the trace has one (a ``session_id`` column, or a
  ``session_id`` attribute on the jobs): all calls of a session stay on one worker, sessions
  go to the least-loaded worker in order of first arrival; otherwise request by request,
  round-robin, so each shard is a thinned copy of the whole arrival process.
- **One t0**: :func:`harness.clock.now` is ``time.perf_counter`` = ``CLOCK_MONOTONIC`` on
  Linux, one clock for every process of a host, so the parent picks t0 once the workers are
  ready and every worker dispatches on ``t0 + arrival_s`` exactly as one process would.
- **One run directory**: each worker writes closed part files named ``part-wNNN-*.parquet``
  into the run's ``*.parquet.parts/`` folders (crash-safe like the parent's own parts); the
  parent's :class:`~harness.results.rundir.RunWriter` merges every part at close, exactly as
  for one process.
- **Progress**: workers send their :class:`DispatchStats` a few times a second over a pipe;
  the parent sums them for the progress bar and run.json.
- **Stop**: workers ignore SIGINT; the parent tells them to stop (Ctrl-C, error), each
  cancels its dispatcher (in-flight requests recorded ``cancelled``) and flushes.

``workers=None`` chooses the count: enough workers for the peak one-second arrival rate at
:data:`PER_WORKER_RPS` each, at most one per usable core; so ordinary runs stay one process
(today's behaviour exactly) and only high-rate runs fan out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import resource
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa

from harness import clock
from harness.cli.errors import HarnessError
from harness.loadgen.dispatcher import Dispatcher, DispatchStats, Job
from harness.results import schema
from harness.results.rundir import _TableSink

PER_WORKER_RPS = 500.0
"""Offered rate one worker is given before another is added. One process costs ~0.36-0.48 ms
of CPU per 100-token request on the lean HTTP path (bench_client.py, quiet 2-core box; the
aiohttp path ~0.6-1 ms), so 500 req/s keeps it well under one core and its lag small."""

READY_TIMEOUT_S = 120.0  # spawn + imports on a loaded machine


# -- choosing and sharding ----------------------------------------------------------------
def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def peak_rate(arrivals: Sequence[float], window_s: float = 1.0) -> float:
    """Most arrivals in any ``window_s`` window, per second (bursty traces need the peak)."""
    import numpy as np

    a = np.sort(np.asarray(arrivals, dtype=np.float64))
    if a.size < 2:
        return float(a.size) / window_s
    hi = np.searchsorted(a, a + window_s, side="left")
    return float((hi - np.arange(a.size)).max()) / window_s


def auto_workers(jobs: Sequence[Job], max_concurrency: int | None = None) -> int:
    """Worker count for ``--workers`` left automatic (module docstring)."""
    if len(jobs) < 2:
        return 1
    need = math.ceil(peak_rate([j.arrival_s for j in jobs]) / PER_WORKER_RPS)
    return resolve_workers(need, jobs, max_concurrency, cap=usable_cores())


def resolve_workers(
    n: int, jobs: Sequence[Job], max_concurrency: int | None, cap: int | None = None
) -> int:
    """Clamp a requested count: never more workers than requests or than concurrency slots."""
    n = max(1, n)
    if cap is not None:
        n = min(n, cap)
    if max_concurrency is not None:
        n = min(n, max_concurrency)
    return max(1, min(n, len(jobs)))


def session_keys(df: Any, n_jobs: int | None = None) -> list[Any] | None:
    """The trace's ``session_id`` column (first ``n_jobs`` rows), or None without one."""
    if df is None or "session_id" not in getattr(df, "columns", ()):
        return None
    keys = df["session_id"].tolist()
    return keys[:n_jobs] if n_jobs is not None else keys


def shard_jobs(jobs: Sequence[Job], n: int, keys: Sequence[Any] | None = None) -> list[list[Job]]:
    """Split ``jobs`` (in schedule order) into ``n`` shards, each in schedule order.

    With ``keys`` (one per job; a job's own ``session_id`` attribute wins): every job of a key
    goes to one shard; keys are placed in order of first appearance on the shard with the
    fewest jobs so far. Without: round-robin by position."""
    if keys is None and jobs and getattr(jobs[0], "session_id", None) is not None:
        keys = [getattr(j, "session_id", None) for j in jobs]
    shards: list[list[Job]] = [[] for _ in range(n)]
    if keys is None:
        for i, job in enumerate(jobs):
            shards[i % n].append(job)
        return shards
    if len(keys) != len(jobs):
        raise ValueError(f"{len(keys)} session keys for {len(jobs)} jobs")
    where: dict[Any, int] = {}
    for i, (job, key) in enumerate(zip(jobs, keys, strict=True)):
        if key is None or (isinstance(key, float) and math.isnan(key)):
            key = ("__request__", i)  # no session: the request is its own
        s = where.get(key)
        if s is None:
            s = where[key] = min(range(n), key=lambda k: len(shards[k]))
        shards[s].append(job)
    return shards


def split_cap(cap: int | None, n: int) -> list[int | None]:
    """A global concurrency cap split across ``n`` workers (sums to ``cap``)."""
    if cap is None:
        return [None] * n
    return [cap // n + (1 if i < cap % n else 0) for i in range(n)]


# -- the worker's side ----------------------------------------------------------------------
class ShardWriter:
    """The dispatcher's writer inside a worker: closed part files ``part-wNNN-*.parquet`` in
    the run's parts folders; never run.json (the parent's RunWriter owns it and merges)."""

    def __init__(self, run_dir: Path, shard: int) -> None:
        prefix = f"part-w{shard:03d}-"
        self._requests = _TableSink(run_dir, schema.REQUESTS_FILE, schema.REQUESTS, prefix)
        self._chunks = _TableSink(run_dir, schema.CHUNKS_FILE, schema.CHUNKS, prefix)
        self._samples = _TableSink(run_dir, schema.SAMPLES_FILE, schema.SAMPLES, prefix)

    def add_requests_table(self, tbl: pa.Table) -> None:
        self._requests.add_table(tbl)

    def add_chunks_table(self, tbl: pa.Table) -> None:
        self._chunks.add_table(tbl)

    def add_sample(self, row: dict[str, Any]) -> None:
        self._samples.add_row(row)

    def flush(self) -> None:
        # Chunks before requests, as RunWriter does: a kill never leaves a request row
        # without its chunks.
        for s in (self._chunks, self._samples, self._requests):
            s.flush()


@dataclass
class ShardSpec:
    """Everything a worker process needs (pickled to it)."""

    shard: int
    jobs: list[Job]
    run_dir: Path
    dispatcher_kw: dict[str, Any]
    timeout_s: float | None


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (less CPU per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def worker_main(conn: Connection, spec: ShardSpec) -> None:
    """Entry point of a worker process: dispatch one shard, report over ``conn``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    loop = new_event_loop()
    try:
        loop.run_until_complete(_worker(conn, spec))
    except BaseException as exc:  # report, never hang the parent
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:500]))
    finally:
        loop.close()
        conn.close()


async def _worker(conn: Connection, spec: ShardSpec) -> None:
    from harness.loadgen.client import make_session

    kw = dict(spec.dispatcher_kw)
    writer = ShardWriter(spec.run_dir, spec.shard)
    prompt_fn = kw.get("prompt_fn")
    if prompt_fn is not None:
        prompt_fn(1, 0)  # warm-up before t0 (the synthesiser builds its word tape)
    async with make_session(limit=kw.get("max_concurrency") or 0, timeout_s=spec.timeout_s) as s:

        def progress(st: DispatchStats) -> None:
            with contextlib.suppress(OSError):
                conn.send(("stats", dataclasses.asdict(st)))

        disp = Dispatcher(spec.jobs, session=s, writer=writer, on_progress=progress, **kw)
        disp.prepare()
        conn.send(("ready", None))
        msg = conn.recv()  # blocks: nothing else runs in this loop yet
        if msg[0] != "go":
            return
        t0 = float(msg[1])
        cpu0 = _cpu_s()
        task = asyncio.ensure_future(disp.run(t0))
        loop = asyncio.get_running_loop()

        def on_control() -> None:
            try:
                m = conn.recv()
            except (EOFError, OSError):
                m = ("stop", None)  # the parent is gone: stop too
            if m[0] == "stop":
                loop.remove_reader(conn.fileno())
                task.cancel()

        loop.add_reader(conn.fileno(), on_control)
        error = None
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # reported; the parts written so far stay
            error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(conn.fileno())
        writer.flush()
        report = {"stats": dataclasses.asdict(disp.stats), "cpu_s": _cpu_s() - cpu0}
        conn.send(("error", error) if error else ("done", report))


# -- the parent's side ----------------------------------------------------------------------
def _sum_stats(planned: int, parts: Sequence[dict[str, Any]]) -> DispatchStats:
    st = DispatchStats(planned=planned)
    ends = []
    for p in parts:
        for k in ("sent", "done", "failed", "in_flight", "tokens", "not_sent", "cancelled"):
            setattr(st, k, getattr(st, k) + int(p.get(k, 0)))
        st.max_lag_s = max(st.max_lag_s, float(p.get("max_lag_s", 0.0)))
        for kind, c in (p.get("error_kinds") or {}).items():
            st.error_kinds[kind] = st.error_kinds.get(kind, 0) + c
        e = p.get("end_s")
        if e is not None and not math.isnan(e):
            ends.append(e)
    if ends and len(ends) == len(parts):
        st.end_s = max(ends)
    return st


class ShardedBase:
    """What every sharded dispatcher shares (worker processes here, Ray actors in
    :mod:`harness.distributed.loadgen`): the shards and their concurrency caps, the per-shard
    dispatcher keywords, summed stats, per-shard reports, and the parent's own writer."""

    def __init__(
        self,
        jobs: list[Job],
        n: int,
        *,
        writer: Any,
        shard_keys: Sequence[Any] | None = None,
        session: Any = None,
        on_progress: Callable[[DispatchStats], None] | None = None,
        progress_interval_s: float = 0.25,
        max_concurrency: int | None = None,
        **dispatcher_kw: Any,
    ) -> None:
        self.jobs = jobs
        self.n = n
        self.writer = writer
        self.run_dir = Path(writer.run_dir)
        self.shards = shard_jobs(jobs, n, shard_keys)
        self.caps = split_cap(max_concurrency, n)
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        timeout = getattr(session, "timeout", None)
        self.timeout_s = getattr(timeout, "sock_read", None)
        dispatcher_kw.pop("freeze_gc", None)
        self.dispatcher_kw = dispatcher_kw
        self.stats = DispatchStats(planned=len(jobs))
        self.t0 = math.nan
        self.reports: list[dict[str, Any] | None] = [None] * n
        self._latest: list[dict[str, Any]] = [{} for _ in range(n)]

    def sample_sink(self, row: dict[str, Any]) -> None:
        # The parent's loop has no schedule to keep: the writer flushes on its own interval.
        self.writer.add_sample(row)

    @property
    def cpu_s(self) -> float:
        """CPU seconds the shards used between t0 and their end (dispatch only)."""
        return sum(r["cpu_s"] for r in self.reports if r)

    async def flush(self, *, in_thread: bool = True) -> None:
        """Flush the parent's own rows (sampler samples); shards flush their own parts."""
        self.writer.flush()


class ShardedDispatcher(ShardedBase):
    """Same interface as :class:`Dispatcher` (``prepare``, ``run(t0)``, ``stats``, ``flush``,
    ``sample_sink``) but the schedule runs in N worker processes. ``prepare()`` starts the
    workers and returns once every one is connected and waiting, so t0 can be taken right
    after it, as for one process."""

    def __init__(self, jobs: list[Job], n_workers: int, **kw: Any) -> None:
        super().__init__(jobs, n_workers, **kw)
        self._errors: list[str] = []
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._ended: set[int] = set()

    def prepare(self) -> None:
        """Spawn the workers and wait until each is ready (before t0 is taken)."""
        if self._procs:
            return
        ctx = mp.get_context("spawn")  # fork would copy the parent's loop and threads
        for i, shard in enumerate(self.shards):
            kw = dict(self.dispatcher_kw, max_concurrency=self.caps[i])
            spec = ShardSpec(i, shard, self.run_dir, kw, self.timeout_s)
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(child, spec), name=f"loadgen-w{i}")
            p.daemon = True
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        deadline = clock.now() + READY_TIMEOUT_S
        for i, c in enumerate(self._conns):
            msg = None
            while msg is None:
                left = deadline - clock.now()
                if left <= 0 or not self._procs[i].is_alive() and not c.poll(0):
                    break
                if c.poll(min(left, 0.5)):
                    try:
                        msg = c.recv()
                    except EOFError:
                        break
            if msg is None or msg[0] != "ready":
                why = msg[1] if msg else "did not start"
                self._abort()
                raise HarnessError(f"load-generator worker {i} failed to start: {why}")

    def _abort(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(5)
        for c in self._conns:
            c.close()

    def _on_message(self, i: int) -> None:
        try:
            msg = self._conns[i].recv()
        except (EOFError, OSError):
            msg = ("error", "worker exited without a report")
        kind, body = msg
        if kind == "stats":
            self._latest[i] = body
            return
        if kind == "done":
            self._latest[i] = body["stats"]
            self.reports[i] = body
        else:
            self._errors.append(f"worker {i}: {body}")
        self._ended.add(i)
        asyncio.get_running_loop().remove_reader(self._conns[i].fileno())
        if len(self._ended) == self.n and not self._all_ended.done():
            self._all_ended.set_result(None)

    def _refresh(self) -> None:
        self.stats = _sum_stats(len(self.jobs), self._latest)

    async def _progress(self) -> None:
        while True:
            self._refresh()
            if self.on_progress is not None:
                self.on_progress(self.stats)
            await asyncio.sleep(self.progress_interval_s)

    async def run(self, t0: float) -> DispatchStats:
        """Release every worker on ``t0`` and wait until all have finished."""
        self.prepare()
        self.t0 = t0
        loop = asyncio.get_running_loop()
        self._all_ended: asyncio.Future[None] = loop.create_future()
        for i, c in enumerate(self._conns):
            loop.add_reader(c.fileno(), self._on_message, i)
        for c in self._conns:
            c.send(("go", t0))
        helper = asyncio.create_task(self._progress())
        try:
            await asyncio.shield(self._all_ended)
        except BaseException:
            await self._stop_all()
            raise
        finally:
            helper.cancel()
            await asyncio.gather(helper, return_exceptions=True)
            self._finish()
        if self._errors:
            raise HarnessError("load generation failed: " + "; ".join(self._errors)[:800])
        return self.stats

    async def _stop_all(self) -> None:
        for i, c in enumerate(self._conns):
            if i not in self._ended:
                with contextlib.suppress(OSError):
                    c.send(("stop", None))
        drain = float(self.dispatcher_kw.get("drain_timeout_s") or 0.0)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._all_ended), timeout=drain + 30.0)

    def _finish(self) -> None:
        loop = asyncio.get_running_loop()
        for i, c in enumerate(self._conns):
            if i not in self._ended:
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(c.fileno())
        self._abort()  # joins; terminates only a worker that never reported
        self._refresh()
        if self.on_progress is not None:
            self.on_progress(self.stats)
        self.writer.update_meta(workers=self.meta())

    def meta(self) -> dict[str, Any]:
        """run.json ``workers``: count, sharding, and what each worker reported."""
        per = []
        for i, rep in enumerate(self.reports):
            st = rep["stats"] if rep else self._latest[i]
            per.append(
                {
                    "shard": i,
                    "requests": len(self.shards[i]),
                    "max_concurrency": self.caps[i],
                    "completed": st.get("done"),
                    "failed": st.get("failed"),
                    "max_release_lag_ms": None
                    if "max_lag_s" not in st
                    else round(st["max_lag_s"] * 1000.0, 3),
                    "cpu_s": None if rep is None else round(rep["cpu_s"], 4),
                }
            )
        return {"count": self.n, "clock": "CLOCK_MONOTONIC (shared by every process on a host)",
                "per_worker": per}  # fmt: skip


def make_dispatcher(
    workers: int | None,
    jobs: list[Job],
    *,
    shard_keys: Sequence[Any] | None = None,
    ray_address: str | None = None,
    **kw: Any,
) -> Any:
    """``Dispatcher`` for one worker (today's in-process path, unchanged), else a
    :class:`ShardedDispatcher`; ``workers=None`` = :func:`auto_workers`. With
    ``ray_address`` the shards are Ray actors across the cluster's hosts
    (:class:`harness.distributed.loadgen.RayShardedDispatcher`; ``workers=None`` = one per
    node)."""
    if ray_address is not None:
        from harness.distributed.loadgen import RayShardedDispatcher

        return RayShardedDispatcher(jobs, workers, address=ray_address, shard_keys=shard_keys, **kw)
    cap = kw.get("max_concurrency")
    n = auto_workers(jobs, cap) if workers is None else resolve_workers(workers, jobs, cap)
    if n <= 1:
        return Dispatcher(jobs, **kw)
    return ShardedDispatcher(jobs, n, shard_keys=shard_keys, **kw)
