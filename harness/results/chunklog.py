"""The chunk log (chunks.parquet) as compact columns, for metrics over tens of millions of rows.

Why: a 100k-request simulation writes one chunk row per token (15-21M rows). Read as a pandas
frame and grouped with int64 copies, the summary of such a run peaked at ~2 GB; here the rows
are read row group by row group into int32 request ids (when they fit) and float64 times, and
the token column is dropped when every chunk carries one token (simulations), ~12 bytes a row.

:func:`group_order` is the one rule for "grouped by request" (:func:`metrics.group_chunks` and
the summary both use it), and :func:`per_bin_chunks` shrinks the log for the stability
analysis's token backlog, which only sums chunk tokens per request and per grid bin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.results import schema

try:  # the optional C grouping (setup.py); without it the numpy path below does the same
    from harness.results import _chunkgroup
except ImportError:  # pragma: no cover - an install without a compiler
    _chunkgroup = None  # type: ignore[assignment]
if os.environ.get("HARNESS_PURE_GROUP") == "1":  # the numpy path where C is built (A/B runs)
    _chunkgroup = None  # type: ignore[assignment]

_BATCH = 1 << 20  # rows per read batch / per slice of a chunked pass
_I32 = np.iinfo(np.int32)
_PROBE = 1 << 12  # rows of the first slice of a grouping check


@dataclass
class ChunkArrays:
    """Chunk rows as columns: request id, receipt time, tokens (None: one token each).

    ``grouped``: the rows are known to come in one run per request, time-ordered within
    (:func:`group_rows` made them so), so readers skip the check; ``id_counts``: rows per
    request id 0..k when that grouping counted them (a simulation's dense ids); ``owned``:
    the columns' memory is this holder's to write over (read from the run's files), not views
    of someone's frame (:meth:`from_frame`)."""

    req: np.ndarray
    t: np.ndarray
    tokens: np.ndarray | None = None
    grouped: bool = field(default=False, compare=False)
    id_counts: np.ndarray | None = field(default=None, compare=False, repr=False)
    owned: bool = field(default=True, compare=False, repr=False)

    def __len__(self) -> int:
        return int(self.t.size)

    @classmethod
    def from_frame(cls, chunks: pd.DataFrame) -> ChunkArrays:
        """Views of a CHUNKS frame's columns (copies only where a dtype differs)."""
        if len(chunks) == 0:
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        return cls(
            chunks["req"].to_numpy(dtype=np.int64),
            chunks["t_s"].to_numpy(dtype=np.float64),
            chunks["tokens"].to_numpy(dtype=np.int64),
            owned=False,
        )

    def token_counts(self) -> np.ndarray:
        """Tokens per row (a read-only broadcast of 1 when every chunk carries one)."""
        if self.tokens is None:
            return np.broadcast_to(np.int64(1), self.t.shape)
        return self.tokens

    def release(self) -> None:
        """Drop the columns (the caller's reference would otherwise keep them alive)."""
        # new empty arrays, not ``[:0]`` views: a view would keep the whole column alive
        self.req, self.t, self.tokens = np.zeros(0, self.req.dtype), np.zeros(0), None
        self.id_counts = None

    def take(self, idx: np.ndarray) -> ChunkArrays:
        """The rows at ``idx`` (an index or boolean array), as new arrays."""
        return ChunkArrays(
            self.req[idx], self.t[idx], None if self.tokens is None else self.tokens[idx]
        )


def chunk_files(run_dir: Path | str) -> list[Path]:
    """The files holding a run's chunk rows: the final file, else its flushed parts (the
    choice :func:`harness.results.rundir.read_table` makes)."""
    run_dir = Path(run_dir)
    final = run_dir / schema.CHUNKS_FILE
    if final.is_file():
        return [final]
    parts = run_dir / (schema.CHUNKS_FILE + ".parts")
    return sorted(parts.glob("part-*.parquet")) if parts.is_dir() else []


def read_chunk_arrays(run_dir: Path | str) -> ChunkArrays:
    """A run's chunk rows in file order, compact (module docstring); empty when it has none."""
    files = [pq.ParquetFile(f) for f in chunk_files(run_dir)]
    total = sum(f.metadata.num_rows for f in files)
    req: np.ndarray = np.empty(total, dtype=np.int32)
    t = np.empty(total, dtype=np.float64)
    tokens: np.ndarray | None = None
    # a simulation's tokens are all 1: its row groups' statistics say so, and the column
    # need not be decoded (a third of the read)
    ones = all(_stats_within(f, "tokens", 1, 1) for f in files)
    small = all(_stats_within(f, "req", int(_I32.min), int(_I32.max)) for f in files)
    cols = ["req", "t_s"] if ones else ["req", "t_s", "tokens"]
    at = 0
    for f in files:
        for b in f.iter_batches(batch_size=_BATCH, columns=cols):
            m = b.num_rows
            r = b.column(0).to_numpy(zero_copy_only=False)
            if (
                req.dtype == np.int32
                and not small
                and m
                and (r.min() < _I32.min or r.max() > _I32.max)
            ):
                req = req.astype(np.int64)  # ids beyond int32: keep them whole
            req[at : at + m] = r
            t[at : at + m] = b.column(1).to_numpy(zero_copy_only=False)
            if ones:
                at += m
                continue
            k = b.column(2).to_numpy(zero_copy_only=False)
            if tokens is None and (k != 1).any():
                tokens = np.empty(total, dtype=np.int32)
                tokens[:at] = 1
            if tokens is not None:
                tokens[at : at + m] = k
            at += m
    # Arrow's allocator keeps the decoded batches' pages for reuse; give them back before
    # the summary's numpy work (tens of MB at 20M rows)
    pa.default_memory_pool().release_unused()
    return ChunkArrays(req[:at], t[:at], None if tokens is None else tokens[:at])


def _stats_within(f: pq.ParquetFile, column: str, lo: int, hi: int) -> bool:
    """Do ``f``'s row-group statistics prove every value of ``column`` lies in [lo, hi]
    (no nulls)? Then the reader need not look at the values for that."""
    md = f.metadata
    names = f.schema_arrow.names
    if column not in names:
        return False
    i = names.index(column)
    for g in range(md.num_row_groups):
        st = md.row_group(g).column(i).statistics
        if st is None or not st.has_min_max or st.null_count != 0:
            return False
        if not (isinstance(st.min, int) and isinstance(st.max, int)):
            return False
        if st.min < lo or st.max > hi:
            return False
    return True


def _time_sorted(t: np.ndarray) -> bool:
    """Are the times non-decreasing (checked slice by slice: no N-row temporaries)?"""
    for a in range(0, t.size, _BATCH):
        s = t[a : a + _BATCH + 1]
        if not bool(np.all(s[1:] >= s[:-1])):
            return False
    return True


def is_grouped(pos: np.ndarray, t: np.ndarray) -> bool:
    """Do the rows come in one run per request (``pos``), time-ordered within? (A replay
    writes each request's chunks at once.) Checked slice by slice, stopping at the first
    request seen in two runs."""
    if pos.size < 2:
        return True
    lo = int(pos.min())
    seen = np.zeros(int(pos.max()) - lo + 1, dtype=bool)
    # a short first slice: an interleaved log (a simulation) shows a request twice within a
    # few rows, so the answer comes before a whole slice's runs are collected and sorted
    starts = [0, *range(min(_PROBE, pos.size), pos.size, _BATCH)]
    for a, b in zip(starts, [*starts[1:], pos.size], strict=True):
        p = pos[a : b + 1]  # one row of overlap: the run across the boundary
        x = t[a : b + 1]
        change = p[1:] != p[:-1]
        if not bool(np.all((x[1:] >= x[:-1]) | change)):
            return False
        heads = p[1:][change] - lo  # runs starting in this slice (after its first row)
        if a == 0:
            heads = np.r_[p[0] - lo, heads]
        if seen[heads].any() or np.unique(heads).size != heads.size:
            return False
        seen[heads] = True
    return True


def group_order(pos: np.ndarray, t: np.ndarray) -> np.ndarray | None:
    """None when the rows are already grouped (:func:`is_grouped`); else the stable order by
    (``pos``, time), as int32 when it fits (memory: it lives beside the log while applied).

    Groups left as they come need not ascend; every consumer works on adjacency. Rows in
    time order (a simulation), or in time order within each request (several engines' logs
    one after another), need only a stable sort by ``pos``: it keeps their time order, the
    same permutation as ``lexsort((t, pos))`` with less working memory."""
    if is_grouped(pos, t):
        return None
    order = _stable_order(pos)
    if not _time_sorted(t) and not _times_ascend_in_groups(pos, t, order):
        order = np.lexsort((t, pos))
    return order.astype(np.int32) if order.size <= _I32.max else order


def _times_ascend_in_groups(pos: np.ndarray, t: np.ndarray, order: np.ndarray) -> bool:
    """Does the stable order by ``pos`` already have each group's times non-decreasing?
    Then it is ``lexsort((t, pos))``'s permutation too (ties keep row order in both): the
    case of logs concatenated from several time-ordered ones, each request in one of them
    (a cluster's engines). Checked slice by slice (no N-row temporaries)."""
    for a in range(0, order.size, _BATCH):
        o = order[a : a + _BATCH + 1]
        p, x = pos[o], t[o]
        if not bool(np.all((x[1:] >= x[:-1]) | (p[1:] != p[:-1]))):
            return False
    return True


def _stable_order(pos: np.ndarray) -> np.ndarray:
    """``np.argsort(pos, kind="stable")``, as a counting sort when ``pos`` are small
    non-negative ints (positions): pandas' ``groupsort_indexer``, O(n) in C, the same
    permutation ~10x faster at 15M rows than numpy's comparison sort."""
    return _stable_order_counts(pos)[0]


def _stable_order_counts(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_stable_order` and, from the counting sort, the rows per value 0..max(pos)
    (None from the comparison sort)."""
    lo, hi = (int(pos.min()), int(pos.max())) if pos.size else (0, -1)
    if lo >= 0 and hi < 4 * pos.size + 1_000_000:
        try:  # a private pandas function: any change in it falls back to the comparison sort
            from pandas._libs.algos import groupsort_indexer

            order, counts = groupsort_indexer(pos.astype(np.intp, copy=False), hi + 1)
        except (ImportError, TypeError, ValueError):
            pass
        else:
            if order.shape == pos.shape and counts.shape == (hi + 2,):
                return order, counts[1:]  # counts[0]: the rows labelled -1 (none here)
    return np.argsort(pos, kind="stable"), None


def group_rows(chunks: ChunkArrays, key: np.ndarray | None = None) -> None:
    """Reorder ``chunks`` in place into :func:`group_order`'s order by ``key`` (the request
    ids when None; else a per-row key that orders like them, e.g. positions): the stable
    sort by key, checked on the reordered rows that each run's times ascend (then it is
    ``lexsort((t, key))``'s permutation, ties keeping row order in both), else lexsort.

    Why not :func:`group_order` and a gather: the check reads the reordered columns as
    they lie (two gathers less than checking through the order), and sorting by the ids
    themselves rebuilds them from the sort's counts (no gather of the ids). Memory: the
    ids go once the sort has its own copy, the old times once the new ones exist (the peak
    is the times twice plus the order); the rare lexsort case scatters them back first."""
    dtype = chunks.req.dtype
    if key is None and _group_in_place(chunks):
        return
    if key is None:
        k = chunks.req.astype(np.intp)  # the counting sort's key type
        chunks.req = np.zeros(0, dtype)  # rebuilt from the counts (or from ``k``)
    else:
        k = key
    order, counts = _stable_order_counts(k)
    if key is None and counts is not None:
        # the sort's key is spent: its pages take the reordered times (no fresh 8 bytes a
        # row); "clip" (the indices are valid): "raise" would buffer ``out``
        chunks.t = np.take(chunks.t, order, out=k.view(np.float64), mode="clip")
        del k
        # sorted by id: the ids are each id repeated by its row count (no gather)
        chunks.req = np.repeat(np.arange(counts.size, dtype=dtype), counts)
        sorted_key = chunks.req
    else:
        chunks.t = chunks.t[order]
        if key is None:
            chunks.req = k[order].astype(dtype)
            sorted_key = chunks.req
        else:
            chunks.req = chunks.req[order]
            sorted_key = k[order]
        del k
    ascend = _ascend_in_runs(sorted_key, chunks.t)
    del sorted_key
    if not ascend:  # put the rows back as they came, for lexsort
        for name in ("req", "t"):
            col = getattr(chunks, name)
            back = np.empty_like(col)
            back[order] = col
            setattr(chunks, name, back)
            del col, back
        order = np.lexsort((chunks.t, chunks.req if key is None else key))
        chunks.t, chunks.req, counts = chunks.t[order], chunks.req[order], None
    if chunks.tokens is not None:
        chunks.tokens = chunks.tokens[order]
    chunks.grouped = True
    chunks.id_counts = counts if key is None else None


def _group_in_place(chunks: ChunkArrays) -> bool:
    """:func:`group_rows` by the request ids in the C extension, when it applies: a log in
    time order (a simulation's: then the stable grouping keeps each request's times
    ascending, no check after), one token a row, ids in a counting sort's range, columns this
    holder owns (ids writable), both contiguous. The same rows, counts and order as the numpy
    path; the only fresh array is the grouped times (the ids are regrouped in their own
    buffer). False: nothing was done."""
    req, t = chunks.req, chunks.t
    if (
        _chunkgroup is None
        or not chunks.owned  # the ids are regrouped in their own buffer
        or chunks.tokens is not None
        or req.size < 2
        or req.dtype not in (np.int32, np.int64)
        or t.dtype != np.float64
        or not (req.flags.c_contiguous and req.flags.writeable and t.flags.c_contiguous)
    ):
        return False
    lo, hi = int(req.min()), int(req.max())
    if lo < 0 or hi >= 4 * req.size + 1_000_000 or not _time_sorted(t):
        return False  # the counting sort's range (_stable_order_counts), else its checks
    counts = np.empty(hi + 1, dtype=np.int64)
    out = np.empty_like(t)
    _chunkgroup.group_by_id(req, t, counts, out)
    chunks.t = out
    chunks.grouped = True
    chunks.id_counts = counts
    return True


def _ascend_in_runs(key: np.ndarray, t: np.ndarray) -> bool:
    """Within each run of equal ``key``, are the times non-decreasing? (slice by slice)"""
    for a in range(0, t.size, _BATCH):
        p, x = key[a : a + _BATCH + 1], t[a : a + _BATCH + 1]
        if not bool(np.all((x[1:] >= x[:-1]) | (p[1:] != p[:-1]))):
            return False
    return True


def bin_token_sums(
    chunks: ChunkArrays, grid: np.ndarray, max_runs: int | None = None
) -> np.ndarray | None:
    """Chunk tokens per bin of the ascending ``grid``: entry k sums the rows whose
    ``searchsorted(grid, t, "left")`` is k (k = 0..len(grid)), as int64; the sums
    :func:`per_bin_chunks` keeps, from the log as it lies.

    Why: a simulator writes each engine's rows in time order, so the log is a few
    time-ordered stretches, and a binary search of each grid point in each stretch bins
    every row (no per-row search of 15M times). None when the log has more than
    ``max_runs`` stretches (default: one per 4096 rows, at least 64; a replay writes
    request by request): binning row by row costs less then.
    A NaN time (numpy sorts it last) never continues a stretch and falls in the last bin,
    as ``searchsorted`` puts it."""
    t = chunks.t
    if max_runs is None:
        max_runs = max(64, t.size // 4096)
    bounds = [0]
    for a in range(0, t.size, _BATCH):
        s = t[a : a + _BATCH + 1]
        bounds.extend((np.flatnonzero(~(s[1:] >= s[:-1])) + a + 1).tolist())
        if len(bounds) > max_runs:
            return None
    bounds.append(t.size)
    cum = None if chunks.tokens is None else np.r_[0, np.cumsum(chunks.tokens, dtype=np.int64)]
    sums = np.zeros(grid.size + 1, dtype=np.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b <= a:
            continue
        edges = np.r_[0, np.searchsorted(t[a:b], grid, side="right"), b - a]
        sums += np.diff(edges) if cum is None else np.diff(cum[a + edges])
    return sums


def dense_ids(req_ids: np.ndarray, row_ids: np.ndarray | None = None) -> bool:
    """Are ``req_ids`` 0..n-1 in order (a simulation's trace rows), and every one of
    ``row_ids`` among them? Then each id is its own position (no :func:`positions` table)."""
    n = req_ids.size
    return (
        n > 0
        and int(req_ids[0]) == 0
        and int(req_ids[-1]) == n - 1
        and bool(np.all(req_ids[1:] > req_ids[:-1]))
        and (
            row_ids is None
            or row_ids.size == 0
            or (int(row_ids.min()) >= 0 and int(row_ids.max()) < n)
        )
    )


def positions(keys: np.ndarray, req_ids: np.ndarray) -> np.ndarray:
    """Position in ``req_ids`` of each key (-1 when absent), int32: a table for dense ids."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int32)
    if req_ids.size == 0:
        return np.full(keys.size, -1, dtype=np.int32)
    lo, hi = int(req_ids.min()), int(req_ids.max())
    kmin, kmax = int(keys.min()), int(keys.max())
    if lo >= 0 and kmin >= 0 and max(hi, kmax) < 4 * req_ids.size + 1_000_000:
        table = np.full(max(hi, kmax) + 1, -1, dtype=np.int32)
        table[req_ids] = np.arange(req_ids.size, dtype=np.int32)
        return table[keys]
    order = np.argsort(req_ids, kind="stable")
    sorted_ids = req_ids[order]
    idx = np.clip(np.searchsorted(sorted_ids, keys), 0, sorted_ids.size - 1)
    found = sorted_ids[idx] == keys
    return np.where(found, order[idx], -1).astype(np.int32)


def per_bin_chunks(chunks: ChunkArrays, grid: np.ndarray) -> pd.DataFrame:
    """A CHUNKS frame with one row per run of consecutive rows of the same request in the
    same bin of ``grid`` (bin = ``searchsorted(grid, t, "left")``): tokens summed, the time of
    the run's last row.

    Why it is exact for the stability analysis's token backlog W(t) (stability.py
    ``token_backlog``): W only sums chunk tokens per request (tokens delivered) and per grid
    bin (the first grid point at or after each chunk), and every row of a run lies in the same
    bin; the sums are of integers, so their order changes nothing. Rows grouped by request
    (:func:`group_order`) make the frame small: one row per request and bin touched.
    """
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for a in range(0, len(chunks), _BATCH):
        r = chunks.req[a : a + _BATCH]
        t = chunks.t[a : a + _BATCH]
        k = np.searchsorted(grid, t, side="left")
        heads = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (k[1:] != k[:-1])])
        ends = np.r_[heads[1:], r.size]
        if chunks.tokens is None:
            tok = ends - heads
        else:
            tok = np.add.reduceat(chunks.tokens[a : a + _BATCH].astype(np.int64), heads)
        parts.append((r[heads], t[ends - 1], tok))
    if not parts:
        return schema.CHUNKS.empty_table().to_pandas()
    return pd.DataFrame(
        {
            "req": np.concatenate([p[0] for p in parts]).astype(np.int64),
            "t_s": np.concatenate([p[1] for p in parts]),
            "tokens": np.concatenate([p[2] for p in parts]).astype(np.int64),
        }
    )


__all__ = [
    "ChunkArrays",
    "chunk_files",
    "dense_ids",
    "bin_token_sums",
    "group_order",
    "group_rows",
    "is_grouped",
    "per_bin_chunks",
    "positions",
    "read_chunk_arrays",
]
