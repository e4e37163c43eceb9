"""RunWriter / read_run: round trips, partial runs (exception, Ctrl-C, SIGKILL), bulk tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.results import schema
from harness.results.rundir import RunWriter, read_run, read_table


def test_run_json_round_trip(tmp_path):
    meta = {
        "run_id": "x1",
        "target": "http://127.0.0.1:8000",
        "tiers": [{"name": "paid", "share": 1.0, "ttft_slo_s": 2.0, "tbt_slo_s": 0.1}],
        "seed": 0,
        "rate": 12.5,
        "nested": {"a": [1, 2, 3], "b": None},
        "np_scalar": np.float64(1.5),
        "path": Path("/tmp/x"),
    }
    with RunWriter(tmp_path / "r", meta) as w:
        assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "running"
        w.update_meta(t0_unix=123.0, engine_info={"version": "0.1"})
    run = read_run(tmp_path / "r")
    for k in ("run_id", "target", "tiers", "seed", "rate", "nested"):
        assert run.meta[k] == meta[k]
    assert run.meta["np_scalar"] == 1.5 and run.meta["path"] == "/tmp/x"
    assert run.meta["t0_unix"] == 123.0 and run.meta["engine_info"] == {"version": "0.1"}
    assert run.meta["status"] == "complete" and run.status == "complete"
    assert run.meta["schema_version"] == 1
    assert not list((tmp_path / "r").glob("*.tmp"))


def test_tables_round_trip_and_final_layout(tmp_path):
    rd = tmp_path / "r"
    with RunWriter(rd, {}, flush_rows=3) as w:  # small flush_rows: several parts per table
        for i in range(7):
            w.add_request({"req": i, "request_id": f"id{i}", "tier": "free", "success": i != 3})
            w.add_chunks(i, [i + 0.1, i + 0.2], [1, 2])
        w.add_sample({"t_s": 0.5, "source": "engine", "kv_usage": 0.25, "num_waiting": 4})
        w.add_samples_table(pa.table({"t_s": [1.0], "source": ["gpu"], "gpu_mem_used_mib": [10.0]}))
    # a complete run has exactly the single-file layout of schema.py
    for name in (schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SAMPLES_FILE):
        assert (rd / name).is_file()
        assert not (rd / (name + ".parts")).exists()
        pq.read_table(rd / name)  # readable by plain pyarrow
    run = read_run(rd)
    assert list(run.requests["req"]) == list(range(7))
    assert list(run.requests["success"]) == [True, True, True, False, True, True, True]
    assert run.requests["request_id"].iloc[5] == "id5"
    assert run.chunks["t_s"].tolist() == pytest.approx(
        [i + d for i in range(7) for d in (0.1, 0.2)]
    )
    assert run.chunks["tokens"].tolist() == [1, 2] * 7
    assert run.samples["source"].tolist() == ["engine", "gpu"]
    assert run.samples["kv_usage"].iloc[0] == 0.25 and np.isnan(run.samples["kv_usage"].iloc[1])
    assert run.meta["rows"] == {"requests": 7, "chunks": 14, "samples": 2}
    assert list(run.requests.columns) == schema.REQUESTS.names
    # meta and summary only (what the CLI prints after a run): empty frames, the same meta
    (rd / schema.SUMMARY_JSON).write_text(json.dumps({"n": 7}), encoding="utf-8")
    light = read_run(rd, requests=False, chunks=False, samples=False)
    assert light.meta == run.meta and light.summary == {"n": 7}
    assert len(light.requests) == 0 and list(light.requests.columns) == schema.REQUESTS.names
    assert len(light.chunks) == 0 and len(light.samples) == 0
    assert light.files == run.files
    # the samples' named columns only (write_summary's read), the source still categorical
    some = read_run(rd, requests=False, chunks=False, samples=("t_s", "source", "kv_usage"))
    assert list(some.samples.columns) == ["t_s", "source", "kv_usage"]
    assert isinstance(some.samples["source"].dtype, pd.CategoricalDtype)
    pd.testing.assert_frame_equal(some.samples, run.samples[["t_s", "source", "kv_usage"]])


def test_empty_run_has_readable_empty_tables(tmp_path):
    with RunWriter(tmp_path / "r", {}):
        pass
    run = read_run(tmp_path / "r")
    assert len(run.requests) == 0 and list(run.requests.columns) == schema.REQUESTS.names
    assert len(run.chunks) == 0 and len(run.samples) == 0
    assert run.files[schema.CHUNKS_FILE] == "file"


def test_exception_closes_as_partial(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), RunWriter(tmp_path / "r", {}) as w:
        w.add_request({"req": 0, "request_id": "a"})
        raise RuntimeError("boom")
    run = read_run(tmp_path / "r")
    assert run.status == "partial" and "boom" in run.meta["stopped_by"]
    assert len(run.requests) == 1  # the buffered row was flushed on the way out


def test_keyboard_interrupt_closes_as_partial(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunWriter(tmp_path / "r", {}) as w:
        w.add_chunks(0, [0.1], [1])
        raise KeyboardInterrupt
    run = read_run(tmp_path / "r")
    assert run.status == "partial" and run.meta["stopped_by"].startswith("KeyboardInterrupt")
    assert len(run.chunks) == 1


def test_bad_rows_are_rejected(tmp_path):
    with RunWriter(tmp_path / "r", {}) as w:
        with pytest.raises(ValueError, match="unknown column"):
            w.add_request({"req": 0, "request_id": "a", "ttft": 1.0})
        with pytest.raises(ValueError, match="missing required column"):
            w.add_chunks_table(pa.table({"req": [1], "tokens": [1]}))
        with pytest.raises(ValueError, match="2 times but 1 counts"):
            w.add_chunks(0, [0.1, 0.2], [1])
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        read_run(tmp_path / "nothing")


def test_refuses_to_overwrite_a_running_run(tmp_path):
    w = RunWriter(tmp_path / "r", {})
    with pytest.raises(FileExistsError):
        RunWriter(tmp_path / "r", {})
    w.close()
    with RunWriter(tmp_path / "r", {"second": True}):  # a closed run may be replaced
        pass
    assert read_run(tmp_path / "r").meta["second"] is True


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from harness.results.rundir import RunWriter
    w = RunWriter(sys.argv[1], {"who": "victim"}, flush_rows=10**9, flush_interval_s=1e9)
    for k in range(1000000):
        w.add_request({"req": k, "request_id": f"r{k}", "success": True})
        w.add_chunks(k, [k + 0.5], [1])
        w.add_sample({"t_s": float(k), "source": "engine", "num_running": k})
        if k % 10 == 9:
            w.flush()
            print(k + 1, flush=True)   # rows durably flushed so far
    """
)


def test_sigkill_leaves_every_flushed_row_readable(tmp_path):
    rd = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(rd)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        flushed = 0
        while flushed < 50:  # wait for at least 5 flushes, then kill mid-writing
            line = proc.stdout.readline()
            assert line, "writer exited early"
            flushed = int(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = read_run(rd)
    assert run.meta["who"] == "victim" and run.meta["status"] == "running"
    assert run.status == "partial"
    assert run.files[schema.REQUESTS_FILE] == "parts"
    n = len(run.requests)
    assert n >= flushed and n % 10 == 0  # whole flushes only, nothing torn
    assert run.requests["req"].tolist() == list(range(n))
    # chunks are flushed before requests: every recorded request has its chunks on disk
    assert len(run.chunks) >= n and len(run.samples) >= n
    # a new writer may not reuse the directory by accident; a summary works on it
    from harness.results.summary import compute_summary

    s = compute_summary(run, stability=False)
    assert s["status"] == "partial" and s["completed"] == n


@pytest.mark.parametrize("dies_at", [schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SAMPLES_FILE])
def test_a_death_between_part_files_never_orphans_a_request_row(tmp_path, monkeypatch, dies_at):
    """The writer dies after some tables of a flush are on disk (SIGKILL timing, made
    deterministic): the requests part is the last one written, so no request row is read
    back without its chunks, whichever table's write is the one cut short."""
    from harness.results import rundir
    from harness.results.summary import compute_summary

    w = RunWriter(tmp_path / "r", {}, flush_rows=10**9, flush_interval_s=1e9)
    for k in range(10):
        w.add_request({"req": k, "request_id": f"r{k}", "success": True})
        w.add_chunks(k, [k + 0.5, k + 0.7], [1, 1])
    w.flush()
    for k in range(10, 20):
        w.add_request({"req": k, "request_id": f"r{k}", "success": True})
        w.add_chunks(k, [k + 0.5, k + 0.7], [1, 1])
    real_flush = rundir._TableSink.flush

    def dies(sink):
        if sink.final.name == dies_at:
            raise KeyboardInterrupt("killed")
        real_flush(sink)

    monkeypatch.setattr(rundir._TableSink, "flush", dies)
    with pytest.raises(KeyboardInterrupt):
        w.flush()
    run = read_run(tmp_path / "r")
    assert len(run.requests) == 10 and set(run.chunks["req"]) >= set(run.requests["req"])
    assert compute_summary(run, stability=False)["completed"] == 10


def test_bulk_chunks_table_parts_and_merge(tmp_path):
    rd = tmp_path / "r"
    n = 2_000_000
    req = np.repeat(np.arange(20_000, dtype=np.int64), 100)
    t = np.tile(np.arange(100, dtype=np.float64) * 0.01, 20_000) + req * 0.001
    tok = np.ones(n, dtype=np.int32)
    with RunWriter(rd, {}, flush_rows=500_000) as w:
        for lo in range(0, n, 250_000):
            sl = slice(lo, lo + 250_000)
            w.add_chunks_table(pa.table({"req": req[sl], "t_s": t[sl], "tokens": tok[sl]}))
    tbl = read_table(rd, schema.CHUNKS_FILE)
    assert tbl.num_rows == n
    assert np.array_equal(tbl.column("req").to_numpy(), req)
    assert np.array_equal(tbl.column("t_s").to_numpy(), t)
    assert read_table(rd, schema.CHUNKS_FILE, columns=["req"]).column_names == ["req"]


def test_closed_writer_rejects_rows(tmp_path):
    w = RunWriter(tmp_path / "r", {})
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.add_request({"req": 0, "request_id": "a"})
    w.close()  # idempotent
    assert len(read_run(tmp_path / "r").requests) == 0


def test_flush_from_another_thread_loses_nothing(tmp_path):
    # The load generator adds rows on its event loop and flushes from a worker thread.
    import threading

    stop = threading.Event()
    with RunWriter(tmp_path / "r", {}, flush_interval_s=1e9) as w:

        def flusher() -> None:
            while not stop.is_set():
                w.flush()

        th = threading.Thread(target=flusher)
        th.start()
        try:
            for i in range(3000):
                w.add_chunks(i, [float(i)], [1])
        finally:
            stop.set()
            th.join(timeout=30)
    chunks = read_run(tmp_path / "r").chunks
    assert sorted(chunks["req"].tolist()) == list(range(3000))


def test_nan_in_meta_becomes_null_and_old_summary_is_dropped(tmp_path):
    rd = tmp_path / "r"
    with RunWriter(rd, {"x": float("nan"), "y": np.float32(2.5), "z": (1, float("inf"))}):
        pass
    (rd / schema.SUMMARY_JSON).write_text("{}")
    meta = json.loads((rd / "run.json").read_text())
    assert meta["x"] is None and meta["y"] == 2.5 and meta["z"] == [1, None]
    with RunWriter(rd, {}):  # a new run in the same folder must not inherit the old summary
        pass
    assert not (rd / schema.SUMMARY_JSON).exists()


def test_failed_part_write_keeps_its_rows(tmp_path: Path) -> None:
    """A part that cannot be written (here: its folder's name is taken by a file; in the field:
    EMFILE, disk full) raises, keeps the rows buffered, and the next flush writes them."""
    w = RunWriter(tmp_path / "run", {"kind": "test"})
    blocker = tmp_path / "run" / (schema.REQUESTS_FILE + ".parts")
    blocker.write_text("in the way")
    for i in range(5):
        w.add_request({"req": i, "request_id": f"r{i}", "success": True})
    with pytest.raises(OSError):
        w.flush()
    blocker.unlink()
    w.close()
    assert sorted(read_run(tmp_path / "run").requests["req"]) == [0, 1, 2, 3, 4]
