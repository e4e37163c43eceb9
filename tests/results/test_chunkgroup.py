"""The C grouping of the chunk log (harness/results/_chunkgroup.c, issue 13) gives the numpy
path's answer: the same grouped times, ids and counts, in place; bad input raises and writes
nothing; logs it does not apply to keep the numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from harness.results import chunklog
from harness.results.chunklog import ChunkArrays, group_rows

_chunkgroup = pytest.importorskip("harness.results._chunkgroup")


def _numpy_path(req: np.ndarray, t: np.ndarray) -> ChunkArrays:
    """group_rows with the extension hidden: the reference."""
    ca = ChunkArrays(req.copy(), t.copy())
    saved, chunklog._chunkgroup = chunklog._chunkgroup, None
    try:
        group_rows(ca)
    finally:
        chunklog._chunkgroup = saved
    return ca


def _log(rng: np.random.Generator, n: int, ids: int, dtype: type) -> tuple[np.ndarray, ...]:
    """A simulation-like log: ids interleaved (many rows per id, some ids absent), times in
    order with ties (a step's rows share its time)."""
    req = rng.integers(0, ids, n).astype(dtype)
    req[req == ids // 2] = ids // 3  # an id with no rows inside the range
    t = np.repeat(np.cumsum(rng.random(n // 4 + 1)), 4)[:n]
    return req, t


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize(("n", "ids"), [(2, 1), (3, 3), (5000, 40), (20000, 7000)])
def test_group_rows_in_c_is_the_numpy_paths(dtype, n, ids):
    rng = np.random.default_rng(n + ids)
    req, t = _log(rng, n, ids, dtype)
    want = _numpy_path(req, t)
    got = ChunkArrays(req.copy(), t.copy())
    ids_buffer = got.req
    assert chunklog._group_in_place(got)  # the C path ran
    assert got.req is ids_buffer  # regrouped in its own buffer
    assert got.req.dtype == dtype and got.grouped
    assert np.array_equal(got.req, want.req) and np.array_equal(got.t, want.t)
    assert np.array_equal(got.id_counts, want.id_counts)
    assert np.array_equal(got.id_counts, np.bincount(req))
    # and the stable (id, time) order, from first principles
    order = np.lexsort((t, req))
    assert np.array_equal(got.t, t[order]) and np.array_equal(got.req, req[order])


def test_group_by_id_is_a_stable_counting_sort():
    """Times out of order too (the function itself does not need them sorted): each id's
    rows keep their order."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, 3000).astype(np.int64)
    t = rng.random(ids.size)
    counts, out, grouped = np.empty(60, np.int64), np.empty_like(t), ids.copy()
    _chunkgroup.group_by_id(grouped, t, counts, out)
    order = np.argsort(ids, kind="stable")
    assert np.array_equal(out, t[order]) and np.array_equal(grouped, ids[order])
    assert np.array_equal(counts, np.bincount(ids, minlength=60))


def test_read_only_times_are_only_read():
    rng = np.random.default_rng(4)
    req, t = _log(rng, 3000, 50, np.int32)
    frozen = t.copy()
    frozen.flags.writeable = False
    want = _numpy_path(req, t)
    got = ChunkArrays(req.copy(), frozen)
    assert chunklog._group_in_place(got)
    assert np.array_equal(got.t, want.t) and np.array_equal(got.req, want.req)
    assert np.array_equal(frozen, t)


def test_bad_input_raises_and_writes_nothing():
    ids = np.array([0, 2, 1, 2], np.int32)
    t = np.arange(4.0)
    counts, out = np.full(3, -7, np.int64), np.full(4, -1.0)

    def unchanged() -> bool:
        return (
            np.array_equal(ids, [0, 2, 1, 2])
            and np.array_equal(counts, [-7] * 3)
            and np.array_equal(out, [-1.0] * 4)
        )

    with pytest.raises(ValueError, match="outside"):  # an id past the counts
        _chunkgroup.group_by_id(ids, t, np.full(2, -7, np.int64), out)
    assert unchanged()
    neg = np.array([0, -1, 1, 2], np.int32)
    with pytest.raises(ValueError, match="outside"):
        _chunkgroup.group_by_id(neg, t, counts, out)
    assert unchanged() and np.array_equal(neg, [0, -1, 1, 2])
    with pytest.raises(ValueError, match="length"):
        _chunkgroup.group_by_id(ids, t[:3], counts, out)
    with pytest.raises(ValueError, match="overlap"):
        _chunkgroup.group_by_id(ids, t, counts, t)
    shared = np.zeros(8, np.int64)  # counts over the ids' bytes: refused, not a corruption
    with pytest.raises(ValueError, match="overlap"):
        _chunkgroup.group_by_id(shared[:4], t, shared[2:5], out)
    both = np.zeros(9)
    with pytest.raises(ValueError, match="overlap"):  # out half over t
        _chunkgroup.group_by_id(ids, both[:4], counts, both[2:6])
    assert np.array_equal(shared, [0] * 8) and np.array_equal(both, [0.0] * 9)
    with pytest.raises(TypeError, match="int32 or int64"):
        _chunkgroup.group_by_id(ids.astype(np.int16), t, counts, out)
    with pytest.raises(TypeError, match="float64"):
        _chunkgroup.group_by_id(ids, t.astype(np.float32), counts, out)
    with pytest.raises(TypeError, match="int64"):
        _chunkgroup.group_by_id(ids, t, counts.astype(np.int32), out)
    frozen = ids.copy()
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError, TypeError)):
        _chunkgroup.group_by_id(frozen, t, counts, out)
    with pytest.raises(TypeError, match="4 arguments"):
        _chunkgroup.group_by_id(ids, t, counts)
    assert unchanged()


@pytest.mark.parametrize("case", ["unsorted", "nan", "tokens", "negative", "read_only"])
def test_logs_it_does_not_apply_to_keep_the_numpy_path(case):
    """Times out of order (a replay, several engines' logs), a NaN time, a token column,
    ids outside a counting sort's range, read-only ids: the C path declines, having written
    nothing, and group_rows gives lexsort's order as before."""
    rng = np.random.default_rng(5)
    req, t = _log(rng, 4000, 30, np.int32)
    tokens = None
    if case == "unsorted":
        t = rng.random(req.size)
    elif case == "nan":
        t[100] = np.nan
    elif case == "tokens":
        tokens = rng.integers(1, 4, req.size).astype(np.int32)
    elif case == "negative":
        req[7] = -1
    ca = ChunkArrays(req.copy(), t.copy(), None if tokens is None else tokens.copy())
    if case == "read_only":
        ca.req.flags.writeable = False
    assert not chunklog._group_in_place(ca)
    assert np.array_equal(ca.req, req) and np.array_equal(ca.t, t, equal_nan=True)
    if case in ("negative", "read_only"):
        return  # group_rows' own handling of those is tested with the numpy path
    group_rows(ca)
    order = np.lexsort((t, req))
    assert np.array_equal(ca.req, req[order]) and np.array_equal(ca.t, t[order], equal_nan=True)
