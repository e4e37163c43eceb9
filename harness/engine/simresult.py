"""What a simulated run produces: the result type, its column buffers, and the stall error.

These sit below both simulation kernels (:mod:`harness.engine.simulate`, the engine-core loop,
and :mod:`harness.engine.fastsim`, the vectorised loop), so neither imports the other.

Memory: a 100k-request run has tens of millions of per-token chunk rows and up to millions of
telemetry rows, so both are kept columnar and compact (numpy parts for chunks, flushed to a sink
as they fill; ``array.array`` columns for samples, 8 bytes a value instead of a Python object).
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Iterator
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
    """The policy scheduled nothing while work waits and no arrival can change that."""


def new_samples() -> dict[str, Any]:
    """Empty telemetry columns (``array('d')`` for times/ratios, ``array('q')`` for counts);
    they support ``append`` like lists and convert to numpy without a copy of objects."""
    return {c: array("d" if c in _FLOAT_COLS else "q") for c in SAMPLE_COLS}


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
    """Token-time accumulator: per step (or fast-forwarded run) one row group, numpy at flush.

    Why deferred: a fast-forwarded run gives every row of its group one token at each of its
    ``k`` step ends, so it is kept as (rows, ends) and expanded to ``k * len(rows)`` chunk rows
    only when sealed, for all groups at once in a few whole-array operations (not a
    ``tile``/``repeat`` per run: ~60k runs at 100k requests). With a ``sink``, rows leave memory
    in batches of at least ``every`` rows (and once more at the end): each sink call builds and
    buffers an Arrow table, seconds of overhead if called per run.
    """

    def __init__(self, sink: Callable[[np.ndarray, np.ndarray], None] | None, every: int) -> None:
        self.sink = sink
        self.every = every
        self.rows: list[Any] = []  # one row group per step or run
        self.steps: list[int] = []  # steps of each group (1, or a run's length)
        self.t_parts: list[Any] = []  # step end times: float lists (steps) and arrays (runs)
        self._t_open: list[float] = []  # ends of the single steps since the last run
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending = 0

    def add_step(self, t: float, rows: Any) -> None:
        """One step's sampled trace rows (a list or an int array), all at time ``t``."""
        self.rows.append(rows)
        self.steps.append(1)
        self._t_open.append(t)
        self.pending += len(rows)
        if self.pending >= self.every:
            self.flush()

    def add_run(self, ends: np.ndarray, rows: Any) -> None:
        """A fast-forwarded run: every row gets one token at each of ``ends`` (kept, not
        copied: the caller must not change either afterwards)."""
        if self._t_open:
            self.t_parts.append(self._t_open)
            self._t_open = []
        self.t_parts.append(ends)
        self.rows.append(rows)
        k = len(ends)
        self.steps.append(k)
        self.pending += k * len(rows)
        if self.pending >= self.every:
            self.flush()

    def _seal(self) -> None:
        """Expand the open groups into one (int32 rows, float64 times) part, time order: the
        ``s``-th step of a group emits the group's rows in order at its ``s``-th end."""
        if not self.rows:
            return
        if self._t_open:
            self.t_parts.append(self._t_open)
        groups = self.rows
        ends = np.concatenate([np.asarray(x, dtype=np.float64) for x in self.t_parts])
        size = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
        steps = np.asarray(self.steps, dtype=np.int64)
        allr = np.concatenate(groups, dtype=np.int32, casting="unsafe")
        self.rows, self.steps, self.t_parts, self._t_open = [], [], [], []
        if len(ends) == len(groups):  # single steps only: the groups are the rows
            self.parts.append((allr, np.repeat(ends, size)))
            return
        off = np.cumsum(size) - size  # each group's first row in allr
        bsz = np.repeat(size, steps)  # rows of each step
        start = np.cumsum(bsz) - bsz  # each step's first output row
        idx = np.arange(int(bsz.sum()), dtype=np.int64)
        idx += np.repeat(np.repeat(off, steps) - start, bsz)
        self.parts.append((allr[idx], np.repeat(ends, bsz)))

    def _joined(self) -> tuple[np.ndarray, np.ndarray]:
        """All sealed parts as one (int32 rows, float64 times) pair; the parts are dropped."""
        parts, self.parts = self.parts, []
        if not parts:
            return np.empty(0, np.int32), np.empty(0)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def flush(self) -> None:
        """Seal the open steps; with a sink, hand it every row held so far (time order)."""
        self._seal()
        self.pending = 0
        if self.sink is not None and self.parts:
            self.sink(*self._joined())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row kept (no sink): trace rows (int64) and times, in time order."""
        self.flush()
        req, t = self._joined()
        return req.astype(np.int64), t


__all__ = [
    "SAMPLE_COLS",
    "ChunkLog",
    "SimResult",
    "SimulationStalled",
    "new_samples",
    "no_cyclic_gc",
]
