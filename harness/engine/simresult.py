"""What a simulated run produces: the result type, its column buffers, and the stall error.

These sit below both simulation kernels (:mod:`harness.engine.simulate`, the engine-core loop,
and :mod:`harness.engine.fastsim`, the vectorised loop), so neither imports the other.

Memory: a 100k-request run has tens of millions of per-token chunk rows and up to millions of
telemetry rows, so both are kept columnar and compact (numpy parts for chunks, flushed to a sink
as they fill; for samples, 8 bytes a value instead of a Python object: ``array.array`` columns
in the engine-core loop, float64 blocks in the vectorised loop, :func:`sample_columns`).
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SAMPLE_COLS = (
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
_FLOAT_COLS = frozenset({"t_s", "step_duration_s", "kv_usage"})
# a fast-forwarded run of at least this many steps keeps its times as one array (ChunkLog)
_LONG_RUN = 64


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a simulation loop.

    Why: under overload the waiting queue holds tens of thousands of live request objects, and
    every full collection walks all of them, so the collector's work grows with the queue (a
    hidden quadratic term). The kernels create no reference cycles (plain counted objects and
    numpy arrays), so nothing accumulates while it is paused.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class SimulationStalled(RuntimeError):
    """The policy scheduled nothing while work waits and no arrival can change that, or it
    keeps scheduling work that is preempted before any token comes (a livelock)."""


# Preemptions with no token emitted anywhere, after the last arrival, that make a livelock: a
# run makes progress without preemptions (every step computes tokens of a bounded total), so
# an endless run preempts; a legitimate thrashing run still emits tokens between them.
LIVELOCK_PREEMPTIONS = 10_000


class LivelockWatch:
    """Stops a run that preempts :data:`LIVELOCK_PREEMPTIONS` times, after the last arrival,
    with no token emitted meanwhile (e.g. WAIT without its end-of-trace flush, seed-wait.md
    §9 #17, when a cohort outgrows the KV: the admitted prompt is the eviction victim, again
    and again). ``chunks``: the run's token log. A loop calls :meth:`check` only when the
    preemption count reaches ``next_at`` (one comparison a step)."""

    __slots__ = ("next_at", "_chunks", "_rows")

    def __init__(self, chunks: ChunkLog) -> None:
        self.next_at = LIVELOCK_PREEMPTIONS
        self._chunks = chunks
        self._rows = -1

    def check(self, preemptions: int, arrivals_left: bool, what: str) -> None:
        """``what``: the policy and its state, for the message."""
        rows = self._chunks.rows_total
        if rows == self._rows and not arrivals_left:
            raise SimulationStalled(
                f"{what}: {LIVELOCK_PREEMPTIONS:,} preemptions and no token since, no arrival "
                "left (a livelock: the policy re-admits what the engine preempts)"
            )
        self._rows = -1 if arrivals_left else rows
        self.next_at = preemptions + LIVELOCK_PREEMPTIONS


def new_samples() -> dict[str, Any]:
    """Empty telemetry columns (``array('d')`` for times/ratios, ``array('q')`` for counts);
    they support ``append`` like lists and convert to numpy without a copy of objects."""
    return {c: array("d" if c in _FLOAT_COLS else "q") for c in SAMPLE_COLS}


def sample_columns(blocks: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The telemetry rows of float64 blocks with one row per SAMPLE_COLS column (the array
    kernel's, in order), as :func:`new_samples`'s columns: float64 times and ratios, int64
    counts (whole numbers below 2**53 there, so exact), each a new array."""
    return {
        c: np.concatenate(
            [b[i] for b in blocks] or [np.empty(0)],
            dtype=np.float64 if c in _FLOAT_COLS else np.int64,
            casting="unsafe",
        )
        for i, c in enumerate(SAMPLE_COLS)
    }


@dataclass
class SimResult:
    """Everything one simulated run produced (in memory unless a chunk sink was given)."""

    policy: str
    first_s: np.ndarray  # per trace row, NaN if no token
    last_s: np.ndarray
    out_tokens: np.ndarray  # tokens produced (== chunks)
    status: np.ndarray  # 0 pending/cancelled, 1 finished, 2 rejected
    errors: dict[int, str]
    preemptions: np.ndarray
    samples: dict[str, Any]
    chunk_req: np.ndarray | None
    chunk_t: np.ndarray | None
    end_s: float
    num_steps: int
    num_calls: int
    wall_s: float
    counters: dict[str, Any] = field(default_factory=dict)


class ChunkLog:
    """Token-time accumulator: each step's (or fast-forwarded run's) rows are written straight
    into a preallocated column of int32 trace rows, in time order; their times are kept as
    one (time, row count) pair a step and expanded into the float64 column when the rows are
    sealed (one ``np.repeat``: a step's rows all share its time).

    Why preallocated: a 100k-request run makes ~200k single steps and ~35k runs; keeping each
    as a small array (or list) and concatenating them at flush cost about a second (a Python
    object, a length and a dtype cast per group), where a slice assignment into a buffer is one
    C copy. A run of ``k`` steps over ``R`` rows is written as a ``(k, R)`` view of the buffer
    by one broadcast (rows down): no ``tile``/``repeat`` temporaries. Why times as pairs: two
    list appends cost less than a numpy fill per step, the kernel's most frequent call. A
    long run (``_LONG_RUN`` steps or more) keeps its times as one repeated array instead: its
    ``k`` ends as Python floats and counts were most of a batch-level policy's run (FT holds
    its batches for thousands of steps: 16M steps on Azure conversations). With a ``sink``,
    rows leave memory in batches of at least ``every`` rows (and once more at the end): each
    sink call builds and buffers an Arrow table, seconds of overhead if called per run. The
    batches are exactly those of a flush after the first call that reaches ``every`` rows.
    """

    def __init__(self, sink: Callable[[np.ndarray, np.ndarray], None] | None, every: int) -> None:
        self.sink = sink
        self.every = every
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        # first size: one batch (and a margin for the call that crosses it), capped so that a
        # huge ``every`` (no sink, keep all) starts small and doubles as it fills
        self._cap = min(max(int(every), 1), 1 << 22) + (1 << 12)
        self._use(np.empty(self._cap, dtype=np.int32))
        self._times: list[float] = []  # the held rows' times: one per step ...
        self._counts: list[int] = []  # ... and how many rows that step emitted
        self._pieces: list[np.ndarray] = []  # the times of rows held before those, expanded
        self._n = 0  # rows held in the buffers since the last flush
        self._sealed = 0  # rows sealed before those

    def _grow(self, need: int) -> None:
        """Room for ``need`` rows: a new buffer (double, or ``need``), the held rows copied."""
        cap = max(2 * self._cap, need)
        req = np.empty(cap, dtype=np.int32)
        req[: self._n] = self._req[: self._n]
        self._use(req)
        self._cap = cap

    def _use(self, req: np.ndarray) -> None:
        """Write rows into ``req`` from now on; :meth:`room` hands out a memoryview of it,
        made here once (a C pass takes a memoryview's buffer ~100 ns quicker than numpy's)."""
        self._req = req
        self._req_mv = memoryview(req)

    def add_step(self, t: float, rows: Any) -> None:
        """One step's sampled trace rows (a list or an int array), all at time ``t``."""
        a = self._n
        b = a + len(rows)
        if b > self._cap:
            self._grow(b)
        self._req[a:b] = rows
        self._times.append(t)
        self._counts.append(b - a)
        self._n = b
        if b >= self.every:
            self.flush()

    def room(self, n: int) -> tuple[memoryview, int]:
        """The row buffer (a memoryview of the int32 rows) and the offset at which a writer of
        up to ``n`` rows of one step (or run) writes them itself (the C passes of
        ``harness.engine._rows``: no list to convert); :meth:`wrote` (or :meth:`wrote_run`)
        then says how many it wrote."""
        b = self._n + n
        if b > self._cap:
            self._grow(b)
        return self._req_mv, self._n

    def wrote(self, t: float, k: int) -> None:
        """``k`` rows written at :meth:`room`'s offset, all at time ``t`` (as :meth:`add_step`)."""
        if k:
            b = self._n + k
            self._times.append(t)
            self._counts.append(k)
            self._n = b
            if b >= self.every:
                self.flush()

    def add_run(self, ends: Sequence[float], rows: Any) -> None:
        """A fast-forwarded run: every row gets one token at each of ``ends`` (an array, or a
        list of floats); the ``s``-th step emits the rows in order at its ``s``-th end (copied:
        both may change after)."""
        k, r = len(ends), len(rows)
        a = self._n
        b = a + k * r
        if b > self._cap:
            self._grow(b)
        self._req[a:b].reshape(k, r)[:] = rows
        self.wrote_run(ends, r)

    def wrote_run(self, ends: Sequence[float], r: int) -> None:
        """A run's ``len(ends) * r`` rows written at :meth:`room`'s offset in
        :meth:`add_run`'s order (the same ``r`` rows at each of ``ends``)."""
        k = len(ends)
        if not (k and r):
            return  # no rows (as :meth:`wrote`)
        if k >= _LONG_RUN:  # its times as one array (the class docstring)
            self._cut()
            self._pieces.append(np.repeat(np.asarray(ends, dtype=np.float64), r))
        else:
            self._times.extend(
                ends if type(ends) is list else np.asarray(ends, dtype=np.float64).tolist()
            )
            self._counts.extend([r] * k)
        b = self._n + k * r
        self._n = b
        if b >= self.every:
            self.flush()

    def _seal(self) -> None:
        """Move the held rows into ``parts`` (a view of the full row buffer, the times
        expanded; a fresh buffer follows)."""
        if not self._n:
            return
        self._sealed += self._n
        self._cut()
        pieces, self._pieces = self._pieces, []
        times = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self.parts.append((self._req[: self._n], times))
        self._use(np.empty(self._cap, dtype=np.int32))
        self._n = 0

    def _cut(self) -> None:
        """The per-step times held so far, expanded into a piece (before a long run's)."""
        if self._times:
            self._pieces.append(np.repeat(np.array(self._times, dtype=np.float64), self._counts))
            self._times = []
            self._counts = []

    def _joined(self) -> tuple[np.ndarray, np.ndarray]:
        """All sealed parts as one (int32 rows, float64 times) pair; the parts are dropped."""
        parts, self.parts = self.parts, []
        if not parts:
            return np.empty(0, np.int32), np.empty(0)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    @property
    def rows_total(self) -> int:
        """Rows (tokens) added so far, flushed or held."""
        return self._sealed + self._n

    def flush(self) -> None:
        """Seal the held rows; with a sink, hand it every row held so far (time order)."""
        self._seal()
        if self.sink is not None and self.parts:
            self.sink(*self._joined())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row kept (no sink): trace rows (int64) and times, in time order."""
        self.flush()
        req, t = self._joined()
        return req.astype(np.int64), t


__all__ = [
    "SAMPLE_COLS",
    "sample_columns",
    "ChunkLog",
    "SimResult",
    "SimulationStalled",
    "new_samples",
    "no_cyclic_gc",
]
