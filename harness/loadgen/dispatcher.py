"""Open-loop dispatcher: release every request at ``t0 + arrival_s`` on an absolute schedule.

Rules (anchors-harness.md §2.1 "Dispatch loop" and §7 "Client engine"):

- targets are absolute (``t0 + arrival_s``), computed once; the loop sleeps until the next
  target and releases *every* request that is due, so a late wake-up never shifts later
  requests (the relative-sleep drift of vllm #21104 / SGLang);
- one asyncio task per request; an optional semaphore caps requests in flight. The request
  is *released* (``arrival_s``) when its task starts, and *sent* (``send_s``) right before
  the POST, after the semaphore: ``send_s - arrival_s`` is vLLM's ``client_queue_time`` and
  ``arrival_s - target_s`` is the dispatcher's lag;
- bounds: ``num_requests`` keeps the first N rows; ``duration_s`` sends no request whose
  target is past it, lets the ones in flight at ``t0 + duration_s`` finish within
  ``drain_timeout_s``, then cancels them (recorded as ``cancelled``);
- results stream into a :class:`~harness.results.rundir.RunWriter` from a flusher task every
  ``flush_interval_s`` (Parquet work runs in a worker thread so the loop keeps its schedule),
  so Ctrl-C leaves a readable partial run; on cancellation every in-flight request is
  recorded as ``cancelled`` and flushed before the error propagates;
- the open-file budget (:mod:`harness.loadgen.fdlimit`, ``in_flight_limit``): a request due
  while that many are already in flight is not sent and is recorded as ``client_limit`` (an
  open-loop schedule must not silently turn into a queue), never a crash; with
  ``max_concurrency`` the semaphore is capped at the budget instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from harness import clock
from harness.loadgen.client import HttpSession, RequestResult, encode_body, stream_request
from harness.loadgen.dialects import Dialect, Endpoint
from harness.results import schema
from harness.workload.tiers import Tier

SWITCH_INTERVAL_S = 0.0005
"""GIL switch interval during dispatch (:func:`sys.setswitchinterval`; restored after)."""


_switch = {"users": 0, "saved": 0.005}


def _short_switch(on: bool) -> None:
    """Enter (``on``) or leave a dispatch with the short GIL switch interval; the process's
    own interval comes back when the last of the dispatches running at once has ended."""
    if on:
        if _switch["users"] == 0:
            _switch["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch["saved"], SWITCH_INTERVAL_S))
        _switch["users"] += 1
        return
    _switch["users"] -= 1
    if _switch["users"] == 0:
        sys.setswitchinterval(_switch["saved"])


WRITER_NICE = 10
"""How much lower the OS priority of the thread writing finished rows is than the loop's."""

_pool: list[ThreadPoolExecutor] = []


def _after_fork_in_child() -> None:
    """A forked child has no writer thread (it starts its own) and none of the parent's
    dispatches: it gets the process's own switch interval back."""
    _pool.clear()
    if _switch["users"]:
        _switch["users"] = 0
        sys.setswitchinterval(_switch["saved"])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _writer_pool() -> ThreadPoolExecutor:
    """One thread per process for the flushes' table building and Parquet writing, at a lower
    OS priority (Linux: a thread's own nice value): on a busy machine the scheduler then
    runs the event loop, which has sends due, before the write, which has no deadline
    (issue 18: send lag while a flush runs)."""
    if not _pool:
        _pool.append(ThreadPoolExecutor(1, "harness-writer", initializer=_lower_priority))
    return _pool[0]


def _lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux / not allowed: as is
        tid = threading.get_native_id()  # a new thread starts at its creator's nice value
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
        )


class Writer(Protocol):
    def add_requests_table(self, tbl: pa.Table) -> None: ...
    def add_chunks_table(self, tbl: pa.Table) -> None: ...
    def add_sample(self, row: dict[str, Any]) -> None: ...
    def flush(self) -> None: ...


@dataclass(frozen=True)
class Job:
    """One request of the schedule, in the form the dispatcher needs (no pandas in the loop)."""

    req: int
    request_id: str
    arrival_s: float
    prompt: str | None
    prompt_len: int
    output_len: int
    tier: str | None


@dataclass
class DispatchStats:
    """Counters for the progress bar and run.json."""

    planned: int = 0
    sent: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    tokens: int = 0
    not_sent: int = 0
    cancelled: int = 0
    max_lag_s: float = 0.0
    end_s: float = math.nan  # run clock when the last request finished (vLLM's duration)
    error_kinds: dict[str, int] = field(default_factory=dict)


def synthetic_prompt(n: int) -> str:
    """A prompt of about ``n`` tokens for traces without text: ``n`` repetitions of " hi"
    (one token each in common BPE vocabularies; SGLang's Mooncake filler). The built-in engine
    gets the exact length through the dialect's length hint instead."""
    return _PROMPT_BASE[: 3 * n - 1] if n <= _PROMPT_MAX else "hi" + " hi" * (n - 1)


_PROMPT_MAX = 32768
_PROMPT_BASE = "hi" + " hi" * (_PROMPT_MAX - 1)


class Dispatcher:
    """Runs one schedule against one target. Create, then ``await run(t0)`` once."""

    def __init__(
        self,
        jobs: list[Job],
        *,
        session: HttpSession,
        base_url: str,
        model: str,
        dialect: Dialect,
        endpoint: Endpoint,
        tiers: dict[str, Tier],
        writer: Writer,
        max_concurrency: int | None = None,
        duration_s: float | None = None,
        drain_timeout_s: float = 30.0,
        flush_interval_s: float = 1.0,
        headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        prompt_fn: Callable[[int, int], str] | None = None,
        on_progress: Callable[[DispatchStats], None] | None = None,
        progress_interval_s: float = 0.25,
        freeze_gc: bool = True,
        in_flight_limit: int | None = None,
    ) -> None:
        self.jobs = jobs
        self.session = session
        self.url = base_url.rstrip("/") + dialect.path(endpoint)
        self.interpret = dialect.interpreter(endpoint)
        self.model = model
        self.dialect = dialect
        self.endpoint = endpoint
        self.tiers = tiers
        self.writer = writer
        if max_concurrency and in_flight_limit:
            max_concurrency = min(max_concurrency, in_flight_limit)
        self.sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        # Without a semaphore, the most requests that may hold a socket at once (fd budget).
        self.in_flight_limit = None if self.sem is not None else in_flight_limit
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.flush_interval_s = flush_interval_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.extra_body = extra_body
        self.prompt_fn = prompt_fn or (lambda n, req: synthetic_prompt(n))
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.freeze_gc = freeze_gc
        self.stats = DispatchStats(planned=len(jobs))
        self._finished: list[RequestResult] = []
        self._samples: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self.write_error: str | None = None  # last failed part write (rows kept buffered)
        # Periodic flushes retry later; the final flush (not in a thread) raises.
        self.swallow_write_errors = True
        self.t0 = math.nan
        self._frozen = False
        self._last_body: tuple[tuple[Any, ...] | None, bytes] = (None, b"")

    # -- sink for the Sampler: buffered so every writer call happens in the flusher -------
    def sample_sink(self, row: dict[str, Any]) -> None:
        self._samples.append(row)

    async def _one(self, job: Job, target: float) -> None:
        st = self.stats
        res = RequestResult(
            req=job.req,
            request_id=job.request_id,
            tier=job.tier,
            prompt_len=job.prompt_len,
            output_len=job.output_len,
            target=target,
            arrival=clock.now(),
        )
        lag = res.arrival - target
        if lag > st.max_lag_s:
            st.max_lag_s = lag
        if self._over_budget(res):
            self._record(res)
            return
        st.in_flight += 1
        try:
            prompt = job.prompt
            if prompt is None:
                prompt = self.prompt_fn(job.prompt_len, job.req)
            data = self._body(prompt, job)
            headers = dict(self.headers)
            headers["x-request-id"] = job.request_id
            if self.sem is not None:
                async with self.sem:
                    st.sent += 1
                    await stream_request(self.session, self.url, data, headers, res, self.interpret)
            else:
                st.sent += 1
                await stream_request(self.session, self.url, data, headers, res, self.interpret)
        except asyncio.CancelledError:
            if res.error_kind is None:  # cancelled before the POST (e.g. in the semaphore)
                res.fail(schema.ERROR_CANCELLED, "cancelled before it was sent")
            raise
        finally:
            st.in_flight -= 1
            self._record(res)

    def _body(self, prompt: str, job: Job) -> bytes:
        """The encoded request body. The dialect's body is a function of these four fields
        (endpoint, model and extras are the run's), so a request like the previous one
        reuses its bytes: a fixed-shape load (one prompt, one length) then skips building
        and encoding a dict per request (issue 18: CPU per request)."""
        key = (prompt, job.prompt_len, job.output_len, job.tier)
        if key == self._last_body[0]:
            return self._last_body[1]
        body = self.dialect.body(
            self.endpoint,
            self.model,
            prompt,
            job.prompt_len,
            job.output_len,
            self.tiers.get(job.tier) if job.tier is not None else None,
            self.extra_body,
        )
        data = encode_body(body)
        self._last_body = (key, data)
        return data

    def _over_budget(self, res: RequestResult) -> bool:
        """True, with ``res`` failed as ``client_limit``, when the open-file budget is spent:
        one more socket could starve the writer of descriptors (Errno 24, lost rows)."""
        limit = self.in_flight_limit
        if limit is None or self.stats.in_flight < limit:
            return False
        res.fail(
            schema.ERROR_CLIENT_LIMIT,
            f"not sent: {self.stats.in_flight} requests in flight is this process's "
            "open-file budget",
        )
        return True

    def _record(self, res: RequestResult) -> None:
        st = self.stats
        if res.success:
            st.done += 1
            st.tokens += res.output_tokens or 0
        else:
            st.failed += 1
            kind = res.error_kind or "unknown"
            st.error_kinds[kind] = st.error_kinds.get(kind, 0) + 1
            if kind == schema.ERROR_CANCELLED:
                st.cancelled += 1
        self._finished.append(res)

    # -- writing ----------------------------------------------------------------------------
    def _tables(self, results: list[RequestResult]) -> tuple[pa.Table | None, pa.Table | None]:
        """The requests and chunks tables of ``results`` (run-clock times). Column by column
        and the chunk columns through numpy: ~100 chunk rows per request make this the
        writer's main cost (issue 18)."""
        if not results:
            return None, None
        t0 = self.t0
        counts = [len(r.chunk_t) for r in results]
        reqs = [r.req for r in results]
        cols: dict[str, Any] = {
            "req": reqs,
            "request_id": [r.request_id for r in results],
            "tier": [r.tier for r in results],
            "prompt_len": [r.prompt_len for r in results],
            "output_len": [r.output_len for r in results],
            "prompt_tokens": [r.prompt_tokens for r in results],
            "output_tokens": [r.output_tokens for r in results],
            "target_s": np.array([r.target for r in results]) - t0,
            "arrival_s": np.array([r.arrival for r in results]) - t0,
            "send_s": np.array([r.send for r in results]) - t0,
            "first_chunk_s": np.array([r.first_chunk for r in results]) - t0,
            "last_chunk_s": np.array([r.last_chunk for r in results]) - t0,
            "num_chunks": counts,
            "success": [r.success for r in results],
            "error_kind": [r.error_kind for r in results],
            "error": [r.error for r in results],
            "http_status": [r.http_status for r in results],
        }
        req_tbl = pa.Table.from_pydict(cols, schema=schema.REQUESTS)
        chunk_tbl = None
        total = sum(counts)
        if total:
            t_arr = chunk_column([r.chunk_t for r in results], counts, np.float64)
            tok = chunk_column([r.chunk_tokens for r in results], counts, np.int32)
            req_arr = np.repeat(np.asarray(reqs, dtype=np.int64), counts)
            chunk_tbl = pa.Table.from_arrays(
                [pa.array(req_arr), pa.array(t_arr - t0), pa.array(tok)], schema=schema.CHUNKS
            )
        return req_tbl, chunk_tbl

    def _write(self, results: list[RequestResult], samples: list[dict[str, Any]]) -> None:
        req_tbl, chunk_tbl = self._tables(results)
        w = self.writer
        # Every add buffers its rows before it may flush; a failed flush (OSError) keeps them
        # buffered, so all tables are handed over first and the error is raised only after.
        steps: list[Callable[[], None]] = []
        if chunk_tbl is not None:
            steps.append(lambda: w.add_chunks_table(chunk_tbl))
        steps.extend((lambda r=row: w.add_sample(r)) for row in samples)
        if req_tbl is not None:
            steps.append(lambda: w.add_requests_table(req_tbl))
        steps.append(w.flush)
        first: OSError | None = None
        for step in steps:
            try:
                step()
            except OSError as exc:
                first = first or exc
        if first is not None:
            self.write_error = f"{type(first).__name__}: {first}"[:300]
            if not self.swallow_write_errors:
                raise first

    def _take(self) -> tuple[list[RequestResult], list[dict[str, Any]]]:
        results, self._finished = self._finished, []
        samples, self._samples = self._samples, []
        return results, samples

    async def flush(self, *, in_thread: bool = True) -> None:
        """Hand everything finished so far to the writer (one writer call at a time).

        A part file that cannot be written (disk full, out of descriptors) leaves its rows in
        the writer's buffer (``_write`` hands every table over before flushing), so a later
        flush, at the latest the writer's close, retries them: no measured row is dropped."""
        async with self._write_lock:
            results, samples = self._take()
            if not results and not samples:
                return
            if in_thread:
                # The rows are already taken: the hand-over must finish even if this task is
                # cancelled (the end of the run cancels the periodic flusher), or they are lost
                # and the writer may be closed under the still-running thread.
                fut = asyncio.get_running_loop().run_in_executor(
                    _writer_pool(), self._write, results, samples
                )
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    await fut
                    raise
            else:
                self._write(results, samples)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def _progress(self) -> None:
        assert self.on_progress is not None
        while True:
            self.on_progress(self.stats)
            await asyncio.sleep(self.progress_interval_s)

    # -- the loop -----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Collect and freeze the GC heap (vLLM's ``freeze_gc_heap``: fewer long GC pauses
        during dispatch). Call it BEFORE taking ``t0``: a full collection of a heap holding
        pandas/pyarrow can take longer than the first arrival gap. Idempotent."""
        if self.freeze_gc and not self._frozen:
            gc.collect()
            gc.freeze()
            self._frozen = True

    async def run(self, t0: float) -> DispatchStats:
        """Dispatch every job on the schedule anchored at ``t0`` (a :func:`clock.now` value,
        possibly slightly in the future) and wait until all finished or were cancelled."""
        self.t0 = t0
        jobs = self.jobs
        if self.duration_s is not None:
            keep = [j for j in jobs if j.arrival_s <= self.duration_s]
            self.stats.not_sent = len(jobs) - len(keep)
            jobs = keep
        targets = [t0 + j.arrival_s for j in jobs]
        self.prepare()
        tasks = self._tasks
        now = clock.now
        sleep = asyncio.sleep
        create = asyncio.create_task
        helpers: list[asyncio.Task[None]] = []
        switched = False
        try:
            # The flusher's thread builds tables while this loop dispatches: the loop waits
            # for the GIL at most this long, not Python's default 5 ms (a late send; issue 18).
            _short_switch(True)
            switched = True
            helpers.append(asyncio.create_task(self._flusher()))
            if self.on_progress is not None:
                helpers.append(asyncio.create_task(self._progress()))
            i, n = 0, len(jobs)
            while i < n:
                delay = targets[i] - now()
                if delay > 0:
                    await sleep(delay)
                t = now()
                # Release every job that is due: a late wake-up never shifts later targets.
                while i < n and targets[i] <= t:
                    task = create(self._one(jobs[i], targets[i]))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    i += 1
            await self._wait_all(t0)
            self.stats.end_s = now() - t0
        except BaseException:
            # Ctrl-C / crash: stop everything, record the in-flight requests as cancelled.
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if math.isnan(self.stats.end_s):
                self.stats.end_s = now() - t0
            raise
        finally:
            if switched:
                _short_switch(False)
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self.on_progress is not None:
                self.on_progress(self.stats)
            await self.flush(in_thread=False)
            if self._frozen:
                gc.unfreeze()
                self._frozen = False
        return self.stats

    async def _wait_all(self, t0: float) -> None:
        tasks = self._tasks
        if not tasks:
            return
        if self.duration_s is None:
            await asyncio.gather(*list(tasks), return_exceptions=True)
            return
        # Duration bound: what is in flight at t0 + duration gets drain_timeout_s more.
        deadline = t0 + self.duration_s + self.drain_timeout_s
        while tasks:
            remaining = deadline - clock.now()
            if remaining <= 0:
                break
            await asyncio.wait(list(tasks), timeout=remaining)
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)


def chunk_column(lists: list[list[Any]], counts: list[int], dtype: type[np.generic]) -> np.ndarray:
    """The per-request lists back to back as one array, as ``np.fromiter`` over them all would
    give it. Why: a response that arrived in one read has one stamp repeated on every chunk
    (and usually one token each); converting 100 equal Python numbers per request was most
    of a flush's time, one C call holding the GIL for milliseconds while the event loop,
    needing it to send, waited (issue 18: send lag). A list whose items all equal its first
    (``list.count``: C speed, identity first) is written with ``np.repeat`` from that first
    value; any other list (a stream read chunk by chunk, a signed zero) item by item."""
    firsts = [x[0] if x else 0 for x in lists]
    out = np.repeat(np.array(firsts, dtype), counts)
    at = 0
    for x, c in zip(lists, counts, strict=True):
        if c > 1 and (x.count(x[0]) != c or not x[0]):
            out[at : at + c] = np.fromiter(x, dtype, c)
        at += c
    return out


def jobs_from_frame(df: Any) -> list[Job]:
    """Trace DataFrame (harness.workload.trace.COLUMNS) -> jobs, in row order (``req`` = row)."""
    ids = df["request_id"].astype(str).tolist()
    arr = df["arrival_s"].astype(float).tolist()
    prompts = df["prompt"].tolist() if "prompt" in df.columns else [None] * len(df)
    plen = df["prompt_len"].astype(int).tolist()
    olen = df["output_len"].astype(int).tolist()
    tiers = df["tier"].tolist() if "tier" in df.columns else [None] * len(df)
    out = []
    for i in range(len(df)):
        p = prompts[i]
        if p is not None and not isinstance(p, str):
            p = None if (isinstance(p, float) and math.isnan(p)) else str(p)
        out.append(Job(i, ids[i], arr[i], p, plen[i], olen[i], tiers[i]))
    return out
