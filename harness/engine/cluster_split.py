"""A cluster that decomposes: route first, then simulate each engine alone (issue 16, speed).

When every call's engine is known before anything runs, the engines never interact and the
cluster is N independent single-engine simulations, each on the fastest exact kernel
(:func:`harness.engine.simulate.simulate`: the vectorised one for policies that declare the
budget rule). That holds, exactly, when

- the trace is plain (no session can release a call at another call's finish), with no
  session options (patience, retries, slots), and no agents;
- the router never reads an engine's load: it is probed on a copy with views that raise on
  any read, and keeps the base class's ``on_finish`` (its choices then cannot depend on
  when calls finish). Round-robin and RAD's random planner pass; load- or cache-aware
  routers fail the probe and run on the event loop of :mod:`harness.engine.cluster`.

Same answers as the event loop (a test); results come back as one request table and per-engine
telemetry, ready for :func:`harness.engine.cluster_run.write_cluster_run`.

In parallel: engines that never interact can be simulated at once, so on Linux the engines
are dealt (by rows) to forked worker processes, one per usable core by default. Fork, not
spawn: the workers start with the trace and engine specs already in memory, and nothing the
caller runs at that point holds a lock they need (``harness simulate`` has no event loop or
writer thread then; the workers touch only numpy, pandas and the kernels, which draw no
global random state). A worker writes each engine's token-time flushes, then its pickled
result (or exception), into an anonymous memory file of that engine and sends 24 bytes down a
pipe, so it never waits for the parent; the parent takes the engines in index order, replays
each engine's flushes into the chunk sink exactly as the serial loop would have made them,
and frees the engine's file. Results, run directories and errors are the serial path's (the
tests); the parent holds one engine's token times at a time, not the cluster's. A worker's
exception is raised in the parent after that engine's earlier flushes; the parent's error
or Ctrl-C kills the workers (and a worker dies with its parent).
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.engine.cluster import EngineSpec
from harness.engine.simresult import SimResult
from harness.engine.simulate import simulate
from harness.routers.base import RouteCall, Router
from harness.workload.session_options import SessionOptions
from harness.workload.trace import Trace


class _LoadRead(Exception):
    """The router read an engine's load: its choices depend on the run."""


class _Blind:
    """An engine view that refuses every read but its index."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __getattr__(self, name: str) -> Any:
        raise _LoadRead(name)


def split_plan(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    options: SessionOptions | None,
) -> np.ndarray | None:
    """Engine index of every trace row when the cluster decomposes (module docstring)."""
    if not is_plain(engines, trace, options):
        return None
    df = trace.df
    n = len(df)
    if len(engines) == 1:
        return np.zeros(n, dtype=np.int64)
    if router is None or type(router).on_finish is not Router.on_finish:
        return None
    probe = copy.deepcopy(router)
    views = [_Blind(i) for i in range(len(engines))]
    rids = df["request_id"].astype(str).tolist()
    plen = df["prompt_len"].to_numpy(np.int64).tolist()
    olen = df["output_len"].to_numpy(np.int64).tolist()
    tiers = df["tier"].astype(str).tolist()
    arr = df["arrival_s"].to_numpy(float).tolist()
    order = np.argsort(np.asarray(arr), kind="stable")  # routing happens in release order
    out = np.empty(n, dtype=np.int64)
    k = len(engines)
    try:
        for j in order.tolist():
            c = RouteCall(rids[j], plen[j], olen[j], tiers[j], rids[j])
            e = probe.route(c, views, arr[j])
            if not 0 <= e < k:
                return None
            out[j] = e
    except _LoadRead:
        return None
    return out


def simulate_split(
    trace: Trace,
    engines: Sequence[EngineSpec],
    plan: np.ndarray,
    *,
    stop_at_s: float | None = None,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None = None,
    processes: int | None = None,
) -> tuple[SimResult, list[SimResult]]:
    """Each engine alone on its rows; the merged result (trace rows) and the engines' own.

    ``processes``: worker processes that simulate the engines (``None``: one per usable core,
    at most one per engine with calls; ``1``: all here, one after another). The results and
    the token-time stream handed to ``chunk_sink`` (engine 0's flushes, then engine 1's, ...)
    are the same either way (module docstring, "In parallel")."""
    wall0 = time.perf_counter()
    n = len(trace)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    out_tokens = np.zeros(n, dtype=np.int64)
    status = np.zeros(n, dtype=np.int8)
    preempts = np.zeros(n, dtype=np.int64)
    errors: dict[int, str] = {}
    parts: list[SimResult] = []
    req_parts: list[np.ndarray] = []
    t_parts: list[np.ndarray] = []
    end = 0.0
    rows_of = [np.flatnonzero(plan == i) for i in range(len(engines))]
    workers = split_workers(processes, sum(1 for r in rows_of if len(r)))
    pool = _Workers(trace, engines, rows_of, stop_at_s, workers) if workers > 1 else None
    with pool if pool is not None else contextlib.nullcontext():
        for i, spec in enumerate(engines):
            rows = rows_of[i]
            if len(rows) == 0:
                parts.append(_empty(spec))
                continue

            def sink(req: np.ndarray, t: np.ndarray, rows: np.ndarray = rows) -> None:
                g = rows[req]
                if chunk_sink is not None:
                    chunk_sink(g, t)
                else:
                    req_parts.append(g)
                    t_parts.append(t)

            if pool is not None:
                res = pool.result(i, sink)
            else:
                res = _simulate_engine(trace, spec, rows, stop_at_s, sink)
            first[rows] = res.first_s
            last[rows] = res.last_s
            out_tokens[rows] = res.out_tokens
            status[rows] = res.status
            preempts[rows] = res.preemptions
            for j, msg in res.errors.items():
                errors[int(rows[j])] = f"{spec.name}: {msg}"
            end = max(end, res.end_s)
            parts.append(res)
    # token times: handed to the sink (None here), else kept (empty arrays when none)
    chunk_req = chunk_t = None
    if chunk_sink is None:
        chunk_req = np.concatenate(req_parts) if req_parts else np.empty(0, np.int64)
        chunk_t = np.concatenate(t_parts) if t_parts else np.empty(0)
    merged = merged_result(
        parts, first, last, out_tokens, status, errors, preempts, chunk_req, chunk_t, end, wall0
    )
    return merged, parts


def split_workers(processes: int | None, busy: int) -> int:
    """Worker processes for ``busy`` engines with calls: ``processes`` (``None``: the usable
    cores), at most one per engine; 1 (simulate here) where fork is not available."""
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be >= 1 (or None for one per core), not {processes}")
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    want = len(os.sched_getaffinity(0)) if processes is None else processes
    return max(1, min(want, busy))


def _simulate_engine(
    trace: Trace,
    spec: EngineSpec,
    rows: np.ndarray,
    stop_at_s: float | None,
    sink: Callable[[np.ndarray, np.ndarray], None],
) -> SimResult:
    """One engine alone on its trace rows (``sink`` gets its token times, local rows)."""
    sub = Trace(trace.df.iloc[rows].reset_index(drop=True), trace.tiers, dict(trace.meta))
    return simulate(
        sub, spec.policy, spec.cost_model, spec.config, stop_at_s=stop_at_s, chunk_sink=sink
    )


def _balance(rows_of: Sequence[np.ndarray], workers: int) -> list[list[int]]:
    """Engines with calls dealt to ``workers`` by rows, largest first to the least loaded
    (greedy); each worker's engines in index order, the order the parent consumes them."""
    load = [0] * workers
    mine: list[list[int]] = [[] for _ in range(workers)]
    busy = [i for i, r in enumerate(rows_of) if len(r)]
    for i in sorted(busy, key=lambda i: (-len(rows_of[i]), i)):
        w = min(range(workers), key=lambda w: (load[w], w))
        mine[w].append(i)
        load[w] += len(rows_of[i])
    return [sorted(m) for m in mine if m]


_HEADER = struct.Struct("<qqq")  # engine index, offset and size of its pickled outcome


def _pwrite(fd: int, buf: Any, off: int) -> int:
    """Write all of ``buf`` (bytes or a contiguous array) at ``off``; returns the end offset."""
    mv = memoryview(buf).cast("B")
    while mv:
        k = os.pwrite(fd, mv, off)
        mv, off = mv[k:], off + k
    return off


def _pread(fd: int, buf: Any, off: int) -> None:
    """Fill ``buf`` (bytearray or contiguous array) from ``off``."""
    mv = memoryview(buf).cast("B")
    while mv:
        k = os.preadv(fd, [mv], off)
        if k == 0:
            raise EOFError("simulation worker's file ended early")
        mv, off = mv[k:], off + k


def _read_exact(fd: int, size: int) -> bytes:
    """``size`` bytes from a pipe, or fewer at EOF (the writer exited)."""
    got = b""
    while len(got) < size:
        b = os.read(fd, size - len(got))
        if not b:
            break
        got += b
    return got


def _memfile(name: str) -> int:
    """A file descriptor of an anonymous file (memory, no path: nothing to clean up)."""
    try:
        return os.memfd_create(name, os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        with tempfile.TemporaryFile(prefix=name) as f:  # unlinked at once
            return os.dup(f.fileno())


class _Workers:
    """Forked workers that simulate engines (module docstring, "In parallel").

    Each engine's token-time flushes and then its pickled outcome (result or exception, with
    the flushes' places) go into an anonymous file of that engine; the worker then writes a
    24-byte header to its pipe, so it never waits for the parent. The parent takes engines in
    index order (:meth:`result`): it reads the header from the engine's worker, replays the
    flushes into the engine's sink, and returns the result or raises the exception.
    """

    def __init__(
        self,
        trace: Trace,
        engines: Sequence[EngineSpec],
        rows_of: Sequence[np.ndarray],
        stop_at_s: float | None,
        workers: int,
    ) -> None:
        self.trace = trace
        self.engines = engines
        self.rows_of = rows_of
        self.stop_at_s = stop_at_s
        self.groups = _balance(rows_of, workers)
        self.owner = {i: w for w, m in enumerate(self.groups) for i in m}
        self.files: dict[int, int] = {}
        self.pids: list[int | None] = []
        self.pipes: list[int] = []

    def __enter__(self) -> _Workers:
        try:
            for i in self.owner:
                self.files[i] = _memfile(f"harness-split-{i}")
            sys.stdout.flush()  # a child must not inherit (and flush again) buffered output
            sys.stderr.flush()
            parent = os.getpid()
            for m in self.groups:
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the worker: never returns into the caller's code
                    code = 1
                    try:
                        os.close(r)
                        _worker_setup(parent)
                        self._work(m, w)
                        code = 0
                    finally:
                        os._exit(code)
                os.close(w)
                self.pids.append(pid)
                self.pipes.append(r)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers that still run (an error or Ctrl-C here), reap all, free files."""
        live = [p for p in self.pids if p is not None]
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in live:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for fd in [*self.pipes, *self.files.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pids, self.pipes, self.files = [], [], {}

    def _work(self, mine: list[int], pipe: int) -> None:
        """In the worker: simulate ``mine`` in order; stop after an engine that raised."""
        for i, fd in list(self.files.items()):
            if i not in mine:
                os.close(fd)
        for i in mine:
            fd = self.files.pop(i)
            ok, blob, off = self._one(i, fd)
            _pwrite(fd, blob, off)
            os.close(fd)
            os.write(pipe, _HEADER.pack(i, off, len(blob)))
            if not ok:
                return

    def _one(self, i: int, fd: int) -> tuple[bool, bytes, int]:
        """In the worker: engine ``i`` simulated, its flushes written to ``fd``; whether it
        succeeded, its pickled outcome and where that goes (after the flushes)."""
        off = 0
        flushes: list[tuple[int, int, str, str]] = []

        def sink(req: np.ndarray, t: np.ndarray) -> None:
            nonlocal off
            req, t = np.ascontiguousarray(req), np.ascontiguousarray(t)
            flushes.append((off, len(req), req.dtype.str, t.dtype.str))
            off = _pwrite(fd, t, _pwrite(fd, req, off))

        try:
            res = _simulate_engine(
                self.trace, self.engines[i], self.rows_of[i], self.stop_at_s, sink
            )
            outcome: tuple[Any, ...] = (True, res, flushes, "")
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
            outcome = (False, _portable(e), flushes, traceback.format_exc())
        return outcome[0], pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL), off

    def result(self, i: int, sink: Callable[[np.ndarray, np.ndarray], None]) -> SimResult:
        """Engine ``i``'s result once its worker is done with it; its token times go to
        ``sink`` first, in the flushes the engine made (serial order). A worker's exception
        is raised here, after the flushes it made before it (as the serial path does)."""
        w = self.owner[i]
        head = _read_exact(self.pipes[w], _HEADER.size)
        if len(head) < _HEADER.size:
            _, st = os.waitpid(self.pids[w], 0)
            self.pids[w] = None  # reaped: close() must not signal a reused pid
            raise RuntimeError(
                f"the worker process simulating engine {self.engines[i].name} ended without "
                f"a result (wait status {st})"
            )
        j, off, size = _HEADER.unpack(head)
        assert j == i, (j, i)  # a worker takes its engines in index order, as we do
        fd = self.files.pop(i)
        try:
            blob = bytearray(size)
            _pread(fd, blob, off)
            ok, payload, flushes, tb = pickle.loads(blob)
            del blob
            for o, k, dr, dt in flushes:
                req = np.empty(k, np.dtype(dr))
                t = np.empty(k, np.dtype(dt))
                _pread(fd, req, o)
                _pread(fd, t, o + req.nbytes)
                sink(req, t)
        finally:
            os.close(fd)
        if not ok:
            if tb:
                payload.add_note(f"(in the worker process simulating {self.engines[i].name})\n{tb}")
            raise payload
        return payload


def _worker_setup(parent: int) -> None:
    """A worker dies with its parent (SIGKILL on the parent's exit) and leaves Ctrl-C to it
    (the parent stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")


def is_plain(engines: Sequence[EngineSpec], trace: Trace, options: SessionOptions | None) -> bool:
    """A plain trace on a cluster: no agents, no session columns, default session options, so
    every release is a known arrival without prompt identity (the split kernel and the array
    engines both need this)."""
    if any(s.agent is not None for s in engines):
        return False
    if "session_id" in trace.df.columns or "agent" in trace.df.columns:
        return False
    return options is None or options == SessionOptions()


def merged_result(
    parts: list[SimResult],
    first: np.ndarray,
    last: np.ndarray,
    out_tokens: np.ndarray,
    status: np.ndarray,
    errors: dict[int, str],
    preempts: np.ndarray,
    chunk_req: np.ndarray | None,
    chunk_t: np.ndarray | None,
    end: float,
    wall0: float,
    **counters: int,
) -> SimResult:
    """The cluster's result over trace rows from its engines' own results (``parts``); the
    split kernel and the array-engine loop both report this way."""
    return SimResult(
        policy="+".join(sorted({p.policy for p in parts})),
        first_s=first,
        last_s=last,
        out_tokens=out_tokens,
        status=status,
        errors=errors,
        preemptions=preempts,
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
            "preemptions_total": int(sum(p.counters.get("preemptions_total", 0) for p in parts)),
            **counters,
        },
    )


def _empty(spec: EngineSpec) -> SimResult:
    from harness.engine.simresult import new_samples

    z = np.zeros(0)
    return SimResult(
        policy=getattr(spec.policy, "name", "?"),
        first_s=z,
        last_s=z,
        out_tokens=np.zeros(0, np.int64),
        status=np.zeros(0, np.int8),
        errors={},
        preemptions=np.zeros(0, np.int64),
        samples=new_samples(),
        chunk_req=None,
        chunk_t=None,
        end_s=0.0,
        num_steps=0,
        num_calls=0,
        wall_s=0.0,
    )


__all__ = ["simulate_split", "split_plan", "split_workers"]
