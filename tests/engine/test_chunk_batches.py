"""Token times reach a chunk sink in batches of at least ``chunk_flush_rows`` rows (one Arrow
table each in the run writer, not one per fast-forwarded run), in time order, and the rows are
exactly those a run without a sink keeps in memory (issue 13, memory and write path)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_traces import poisson_trace

from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import simulate
from harness.policies import make_policy


@pytest.mark.parametrize("policy", ["vllm", "slai"])  # vectorised kernel and engine core
def test_sink_gets_large_batches_with_the_same_rows(policy):
    trace = poisson_trace(400, 30.0, seed=3)
    cfg = EngineConfig(kv_tokens=200_000, token_budget=512, max_num_seqs=64)
    cost = get_cost_model("a100-llama2-7b")
    kept = simulate(trace, make_policy(policy), cost, cfg)
    calls: list[tuple[np.ndarray, np.ndarray]] = []
    every = 5_000
    res = simulate(
        trace,
        make_policy(policy),
        cost,
        cfg,
        chunk_sink=lambda req, t: calls.append((req.copy(), t.copy())),
        chunk_flush_rows=every,
    )
    assert res.chunk_req is None
    sizes = [len(r) for r, _ in calls]
    assert sum(sizes) == len(kept.chunk_req) > 3 * every
    assert all(s >= every for s in sizes[:-1]) and len(calls) <= sum(sizes) // every + 1
    req = np.concatenate([r for r, _ in calls])
    t = np.concatenate([x for _, x in calls])
    assert np.array_equal(req, kept.chunk_req) and np.array_equal(t, kept.chunk_t)
    assert np.all(np.diff(t) >= 0)


def _add(log, kind: str, e, rows) -> None:
    """One event into ``log``: a run, a step, or a step its writer writes into the buffer
    itself (``room`` for a few rows more than it writes, as the C passes ask for one a
    position, then ``wrote``)."""
    if kind == "run":
        log.add_run(e, rows)
    elif kind == "step":
        log.add_step(e, rows)
    else:
        buf, at = log.room(len(rows) + 3)
        np.asarray(buf)[at : at + len(rows)] = rows  # (a memoryview: C passes write it)
        log.wrote(e, len(rows))


def test_chunk_log_expands_steps_and_runs_like_one_row_per_token():
    """Fast-forwarded runs are kept as (rows, ends) and expanded at flush (long runs as one
    array of times each): the rows must be exactly the naive one-token-per-row-per-step
    expansion, in order, with any flush size; so must steps written into the buffer by their
    writer (``room``/``wrote``)."""
    from harness.engine.simresult import ChunkLog

    rng = np.random.default_rng(7)
    events = []
    t = 0.0
    for _ in range(300):
        rows = rng.integers(0, 1000, size=int(rng.integers(0, 6))).tolist()
        if rng.random() < 0.4:
            # short runs, and runs at and past ChunkLog's _LONG_RUN (one array of times)
            k = int(rng.choice([1, 2, 4, 63, 64, 65, 200])) if rng.random() < 0.3 else 2
            ends = t + np.cumsum(rng.random(k))
            events.append(("run", ends, np.asarray(rows, dtype=np.int64)))
            t = float(ends[-1])
        else:
            t += float(rng.random())
            events.append(("step" if rng.random() < 0.5 else "room", t, rows))
    want_r = [r for kind, e, rows in events for tt in np.atleast_1d(e) for r in rows]
    want_t = [tt for kind, e, rows in events for tt in np.atleast_1d(e) for _r in rows]
    for every in (1, 7, 100, 10**9):
        got: list[tuple[np.ndarray, np.ndarray]] = []
        log = ChunkLog(lambda r, tt, got=got: got.append((r, tt)), every)
        for kind, e, rows in events:
            _add(log, kind, e, rows)
        log.flush()
        assert np.array_equal(np.concatenate([r for r, _ in got]), want_r)
        assert np.array_equal(np.concatenate([x for _, x in got]), want_t)
        assert all(r.dtype == np.int32 for r, _ in got)
    log = ChunkLog(None, 10**9)
    for kind, e, rows in events:
        _add(log, kind, e, rows)
    req, tt = log.arrays()
    assert np.array_equal(req, want_r) and np.array_equal(tt, want_t) and req.dtype == np.int64


def test_chunk_log_grows_past_its_first_buffer():
    """A run larger than the preallocated buffer (shrunk to 8 rows here) and
    steps after it keep every row, in order, in one batch per flush."""
    from harness.engine.simresult import ChunkLog

    got: list[tuple[np.ndarray, np.ndarray]] = []
    log = ChunkLog(lambda r, tt: got.append((r.copy(), tt.copy())), 10**9)
    log._cap = 8  # as if the first buffer were tiny: every add below must grow it
    log._use(log._req[:8])
    rows = np.arange(300, dtype=np.int64)
    ends = np.array([1.0, 2.0, 3.0])
    log.add_step(0.5, [7, 8])
    log.add_run(ends, rows)
    log.add_step(4.0, rows[:20])
    buf, at = log.room(5000)  # room past the buffer grown so far: a new one, rows kept
    assert at == 922 and len(buf) >= at + 5000
    np.asarray(buf)[at : at + 300] = rows
    log.wrote(5.0, 300)
    log.wrote(6.0, 0)  # a writer that wrote nothing logs no step
    log.flush()
    ((req, t),) = got
    want_r = np.r_[[7, 8], np.tile(rows, 3), rows[:20], rows]
    want_t = np.r_[[0.5, 0.5], np.repeat(ends, 300), np.full(20, 4.0), np.full(300, 5.0)]
    assert np.array_equal(req, want_r) and np.array_equal(t, want_t) and req.dtype == np.int32
