"""summary.json from the compact chunk log (issue 13, memory) gives the numbers the pandas path
gave: pinned values (summary_golden.json, written by the code before the change), the frame
path, and a straightforward per-request reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from summary_runs import RUNS, TIERS

from harness.results import metrics as M
from harness.results import schema
from harness.results.chunklog import (
    ChunkArrays,
    group_order,
    per_bin_chunks,
    positions,
    read_chunk_arrays,
)
from harness.results.rundir import read_run
from harness.results.stability import backlog_series, token_backlog
from harness.results.summary import compute_summary, write_summary

GOLDEN = json.loads(Path(__file__).with_name("summary_golden.json").read_text())


def _plain(x: object) -> object:
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_summary_matches_pinned_values(tmp_path, name):
    d = RUNS[name](tmp_path / name)
    assert _plain(write_summary(d)) == GOLDEN[name]  # compact chunk columns
    assert _plain(compute_summary(read_run(d))) == GOLDEN[name]  # a loaded frame


def test_the_runs_have_the_shapes_they_test(tmp_path):
    """sim: rows interleaved in time order (the sort path); live: only failed requests'
    rows break the per-request runs (the file order is kept for the metrics)."""
    for name in RUNS:
        d = RUNS[name](tmp_path / name)
        run = read_run(d, chunks=False)
        ca = read_chunk_arrays(d)
        pos = positions(ca.req, run.requests["req"].to_numpy())
        ok = M.success_flag(run.requests)
        sel = (pos >= 0) & ok[np.where(pos >= 0, pos, 0)]
        assert group_order(pos, ca.t) is not None
        sub_grouped = group_order(pos[sel], ca.t[sel]) is None
        assert sub_grouped == (name == "live")
        assert (ca.tokens is None) == (name == "sim")


@pytest.mark.parametrize("unknown", [True, False])  # False: sorted by id, no positions
def test_reference_metrics_by_hand(tmp_path, unknown):
    """TTFT, ITL and E2EL statistics from a per-request loop over the raw files."""
    d = RUNS["sim"](tmp_path / "sim", unknown=unknown)
    s = write_summary(d)
    req = pq.read_table(d / schema.REQUESTS_FILE).to_pandas()
    ch = pq.read_table(d / schema.CHUNKS_FILE).to_pandas()
    by_req = {r: g["t_s"].to_numpy() for r, g in ch.groupby("req")}
    ttft, itl, e2el = [], [], []
    for row in req.itertuples():
        t = by_req.get(row.req)
        if not row.success or t is None:
            continue
        t = np.sort(t)
        ttft.append(t[0] - row.send_s)
        e2el.append(t[-1] - row.send_s)
        itl.extend(np.diff(t))
    assert s["completed"] == len(ttft)
    for key, v in (("ttft", ttft), ("itl", itl), ("e2el", e2el)):
        v = np.asarray(v)
        assert s[f"mean_{key}_ms"] == pytest.approx(v.mean() * 1000, rel=1e-12)
        assert s[f"std_{key}_ms"] == pytest.approx(v.std() * 1000, rel=1e-9)
        for p in (50, 90, 99):
            assert s[f"p{p}_{key}_ms"] == pytest.approx(np.percentile(v, p) * 1000, rel=1e-12)
    assert s["tbt_token_max_ms"] == pytest.approx(max(itl) * 1000, rel=1e-12)
    # pooled in (request, time) order, as before the change: the same bits, not just close
    v = np.asarray(itl)
    assert (s["mean_itl_ms"], s["std_itl_ms"]) == (
        float(np.mean(v) * 1000),
        float(np.std(v) * 1000),
    )


@pytest.mark.parametrize("all_ok", [True, False])
def test_dense_ids_group_like_looked_up_positions(tmp_path, all_ok):
    """A simulation's ids 0..n-1 serve as their own positions (no look-up, no kept-rows mask
    when every request succeeded, the sorted ids rebuilt from counts): the grouped log is
    the one the general path makes for the same run with its ids shifted."""
    import dataclasses

    from harness.results.summary import _group_for_both

    d = RUNS["sim"](tmp_path / "sim", unknown=False)
    run = read_run(d, chunks=False)
    if all_ok:
        run.requests["success"] = True
    shifted = run.requests.assign(req=run.requests["req"] + 5)
    run_b = dataclasses.replace(run, requests=shifted)
    dense, general = read_chunk_arrays(d), read_chunk_arrays(d)
    general.req = general.req + 5
    assert group_order(dense.req, dense.t) is not None  # the sort path, not already grouped
    _group_for_both(run, run, dense)
    _group_for_both(run_b, run_b, general)
    assert dense.req.dtype == np.int32
    assert np.array_equal(dense.req + 5, general.req) and np.array_equal(dense.t, general.t)
    assert group_order(dense.req, dense.t) is None


def test_compact_columns_and_parts(tmp_path):
    d = RUNS["sim"](tmp_path / "sim")
    ca = read_chunk_arrays(d)
    frame = pq.read_table(d / schema.CHUNKS_FILE).to_pandas()
    assert ca.req.dtype == np.int32 and ca.tokens is None
    assert np.array_equal(ca.req, frame["req"]) and np.array_equal(ca.t, frame["t_s"])
    live = read_chunk_arrays(RUNS["live"](tmp_path / "live"))
    assert live.tokens is not None and live.tokens.max() > 1
    # a run killed mid-way: its parts folder reads the same rows
    parts = d / (schema.CHUNKS_FILE + ".parts")
    parts.mkdir()
    tbl = pq.read_table(d / schema.CHUNKS_FILE)
    pq.write_table(tbl.slice(0, 1000), parts / "part-000000.parquet")
    pq.write_table(tbl.slice(1000), parts / "part-000001.parquet")
    (d / schema.CHUNKS_FILE).unlink()
    again = read_chunk_arrays(d)
    assert np.array_equal(again.req, ca.req) and np.array_equal(again.t, ca.t)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_per_bin_chunks_keep_the_token_backlog(tmp_path, name):
    d = RUNS[name](tmp_path / name)
    run = read_run(d)
    grid = backlog_series(run.requests).t
    full = token_backlog(run.requests, run.chunks, grid)
    ca = read_chunk_arrays(d)
    small = per_bin_chunks(ca, grid)
    assert np.array_equal(token_backlog(run.requests, small, grid), full)
    # grouped rows shrink to one row per request and bin touched
    pos = positions(ca.req, run.requests["req"].to_numpy())
    order = group_order(pos, ca.t)
    grouped = ca if order is None else ca.take(order)
    agg = per_bin_chunks(grouped, grid)
    assert np.array_equal(token_backlog(run.requests, agg, grid), full)
    assert len(agg) <= len(ca)
    coarse = backlog_series(run.requests, 20).t  # few bins: one row per request and bin
    agg = per_bin_chunks(grouped, coarse)
    assert np.array_equal(
        token_backlog(run.requests, agg, coarse), token_backlog(run.requests, run.chunks, coarse)
    )
    assert len(agg) < len(ca) / 5
    assert isinstance(agg, pd.DataFrame) and list(agg.columns) == ["req", "t_s", "tokens"]


@pytest.mark.parametrize("layout", ["time_sorted", "per_engine_logs", "shuffled"])
def test_group_order_is_lexsorts_permutation(layout):
    """The stable sort by position stands in for lexsort((t, pos)) only where it is the same
    permutation: rows in time order, or in time order within each request (several engines'
    logs one after another, a cluster); anything else takes lexsort."""
    rng = np.random.default_rng(7)
    pos = rng.integers(0, 40, 5000).astype(np.int32)
    if layout == "time_sorted":
        t = np.sort(rng.random(pos.size).round(3))
    elif layout == "per_engine_logs":  # 4 engines, 10 requests each, each log time-ordered
        engine = pos % 4
        order = np.argsort(engine, kind="stable")
        pos = pos[order]
        t = np.concatenate(
            [np.sort(rng.random(int((engine == e).sum())).round(3)) for e in range(4)]
        )
        assert not np.all(np.diff(t) >= 0)
    else:
        t = rng.random(pos.size).round(3)
        t[::50] = np.nan
    got = group_order(pos, t)
    assert got is not None
    assert np.array_equal(got, np.lexsort((t, pos)))


@pytest.mark.parametrize("layout", ["time_sorted", "per_engine_logs", "shuffled"])
@pytest.mark.parametrize("by", ["id", "key", "tokens"])
def test_group_rows_is_lexsorts_order(layout, by):
    """group_rows reorders the columns in place as lexsort((t, key)) would, on the layouts
    above: by the ids (rebuilt from the counting sort's counts), by a key ordering like them,
    and with a token column; the rare lexsort case (times out of order within a request)
    starts again from the rows as they came."""
    from harness.results.chunklog import ChunkArrays, group_rows

    rng = np.random.default_rng(11)
    req = rng.integers(0, 40, 5000).astype(np.int32)
    if layout == "time_sorted":
        t = np.sort(rng.random(req.size).round(3))
    elif layout == "per_engine_logs":
        engine = req % 4
        req = req[np.argsort(engine, kind="stable")]
        t = np.concatenate(
            [np.sort(rng.random(int((req % 4 == e).sum())).round(3)) for e in range(4)]
        )
    else:
        t = rng.random(req.size).round(3)
    tokens = rng.integers(1, 5, req.size).astype(np.int32) if by == "tokens" else None
    ca = ChunkArrays(req.copy(), t.copy(), None if tokens is None else tokens.copy())
    if by == "key":
        group_rows(ca, (req.astype(np.int64) * 3 + 7))  # a key ordering like the ids
    else:
        group_rows(ca)
    want = np.lexsort((t, req))
    assert ca.req.dtype == np.int32 and ca.grouped
    assert np.array_equal(ca.req, req[want]) and np.array_equal(ca.t, t[want])
    if tokens is not None:
        assert np.array_equal(ca.tokens, tokens[want])
    if by == "id" and layout != "shuffled":
        assert np.array_equal(ca.id_counts, np.bincount(req))


@pytest.mark.parametrize("layout", ["time_sorted", "per_engine_logs", "shuffled", "nan"])
def test_bin_token_sums_bin_every_row(layout):
    """Tokens per grid bin from the log's time-ordered stretches equal the row-by-row
    ``searchsorted`` binning (times past the grid, ties on grid points, NaN in the last bin);
    too many stretches (a replay's layout) give None."""
    from harness.results.chunklog import ChunkArrays, bin_token_sums

    rng = np.random.default_rng(5)
    n = 6000
    grid = np.linspace(0.0, 0.9, 50)
    t = rng.random(n).round(2)  # ties with grid points, some past the grid's end
    if layout == "time_sorted":
        t = np.sort(t)
    elif layout in ("per_engine_logs", "nan"):
        t = np.concatenate([np.sort(x) for x in np.array_split(t, 8)])
        if layout == "nan":
            t[[0, 100, 2999, n - 1]] = np.nan
    tokens = rng.integers(1, 4, n).astype(np.int32)
    for tok in (None, tokens):
        ca = ChunkArrays(np.zeros(n, dtype=np.int32), t, tok)
        got = bin_token_sums(ca, grid, max_runs=n)
        if layout == "shuffled":  # a stretch every other row: row by row is cheaper
            assert bin_token_sums(ca, grid) is None
        want = np.bincount(
            np.searchsorted(grid, t, side="left"),
            weights=np.ones(n) if tok is None else tok,
            minlength=grid.size + 1,
        )
        assert got is not None and np.array_equal(got, want)


def test_chunk_totals_give_the_token_backlog(tmp_path):
    """The stability's per-request and per-bin chunk sums give the W(t) of the full log."""
    from harness.results.chunklog import bin_token_sums, group_rows
    from harness.results.stability import ChunkTotals

    d = RUNS["sim"](tmp_path / "sim", unknown=False)
    run = read_run(d)
    grid = backlog_series(run.requests).t
    ca = read_chunk_arrays(d)
    bins = bin_token_sums(ca, grid)
    group_rows(ca)
    n = len(run.requests)
    per_request = np.zeros(n)
    per_request[: ca.id_counts.size] = ca.id_counts
    totals = ChunkTotals(per_request, bins.astype(float), len(ca))
    assert np.array_equal(
        token_backlog(run.requests, totals, grid),
        token_backlog(run.requests, run.chunks, grid),
    )


@pytest.mark.parametrize("n", [0, 1, 5, (1 << 20) - 1, (1 << 20) + 3, 2_500_000])
def test_masked_copy_into_a_buffer_is_boolean_indexing(n):
    """The largest tier's ITL samples are copied into the buffer that held the pool's
    deviations, slice by slice (issue 13, page faults): the same values in the same order
    as ``itl[mask]``, across slice boundaries."""
    from harness.results.metrics import masked_into

    rng = np.random.default_rng(n)
    values = rng.random(n)
    mask = rng.random(n) < 0.9
    out = np.full(n + 2, -1.0)
    got = masked_into(values, mask, out)
    assert np.array_equal(got, values[mask]) and got.base is out
    assert np.all(out[got.size :] == -1.0)


@pytest.mark.parametrize("layout", ["time_sorted", "per_engine_logs"])
def test_stretch_times_are_the_kept_times_of_a_grouped_view(layout):
    """A tier's chunk times read from its requests' stretches (the summary's chunk peaks) are
    the times the mask gather keeps, as a multiset: on group_chunks' views, whose groups need
    not ascend (per-engine logs), with requests without chunks, dropped or absent."""
    rng = np.random.default_rng(3)
    n = 60
    pos = rng.integers(0, n - 5, 20_000)  # the last five requests have no chunk
    t = np.sort(rng.random(pos.size).round(4))
    if layout == "per_engine_logs":  # 4 engines' logs one after another
        order = np.argsort(pos % 4, kind="stable")
        pos, t = pos[order], t[order]
    ca = ChunkArrays(pos.astype(np.int32), t, None)
    keep = rng.random(n) < 0.8
    cv = M.group_chunks(ca, np.arange(n, dtype=np.int64), keep)
    for share in (0.0, 0.1, 0.5, 1.0):
        rows = rng.random(n) < share
        want = np.concatenate([*M.kept_times(cv, rows), np.zeros(0)])
        got = M.stretch_times(cv, rows)
        assert np.array_equal(np.sort(got), np.sort(want))


def test_a_summary_of_a_loaded_run_leaves_its_chunks_as_they_were(make_run):
    """compute_summary(run) on a frame (the report's path: it plots run.chunks afterwards)
    writes nothing into the frame's columns: only chunk arrays read for the summary itself
    serve as its scratch (issue 13). A replay-shaped run: each request's one-token chunks
    written at once (grouped), two tiers."""
    rng = np.random.default_rng(2)
    reqs, chunks = [], {}
    for i in range(60):
        t0 = float(i) * 0.1
        chunks[i] = [(t0 + 0.2 + 0.03 * k + rng.random() * 0.01, 1) for k in range(8)]
        reqs.append({"tier": "paid" if i % 3 == 0 else "free", "output_tokens": 8})
    run = read_run(make_run(reqs, chunks, meta={"tiers": TIERS}))
    before = run.chunks.copy(deep=True)
    s = compute_summary(run, stability=False)
    assert s["tiers"]["paid"]["num_requests"] == 20
    assert run.chunks.equals(before)
