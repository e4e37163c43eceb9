"""RunWriter(stream_chunks=True): chunk flushes append row groups to one file (no parts to
merge on close); the result reads exactly like the parts layout."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from harness.results import schema
from harness.results.rundir import RunWriter, read_run


def _chunks(a: int, b: int) -> pa.Table:
    r = np.arange(a, b)
    return pa.table({"req": r % 7, "t_s": r * 0.01, "tokens": np.ones(r.size, np.int32)})


@pytest.mark.parametrize("stream", [False, True])
def test_streamed_chunks_read_like_parts(tmp_path, stream):
    d = tmp_path / "run"
    with RunWriter(d, {}, flush_rows=1000, stream_chunks=stream) as w:
        for a in range(0, 5000, 700):
            w.add_chunks_table(_chunks(a, min(a + 700, 5000)))
        w.flush()
        assert (d / (schema.CHUNKS_FILE + ".parts")).is_dir() != stream
    run = read_run(d)
    assert run.status == schema.STATUS_COMPLETE
    assert np.array_equal(run.chunks["t_s"].to_numpy(), np.arange(5000) * 0.01)
    assert json.loads((d / schema.RUN_JSON).read_text())["rows"]["chunks"] == 5000
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [schema.RUN_JSON, schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SAMPLES_FILE]
    )


@pytest.mark.parametrize("stream", [False, True])
def test_tables_are_written_as_lz4_without_dictionaries(tmp_path, stream):
    """The codec rundir.py chose by measurement: dictionaries cost time and size on these
    tables; LZ4 writes the chunk log ~2.5x faster than zstd at the same size, and the other
    tables ~1.5x faster (a third larger)."""
    import pyarrow.parquet as pq

    d = tmp_path / "run"
    with RunWriter(d, {}, flush_rows=1000, stream_chunks=stream) as w:
        for a in range(0, 5000, 700):
            w.add_chunks_table(_chunks(a, min(a + 700, 5000)))
        for i in range(7):
            w.add_request({"req": i, "request_id": f"r{i}", "tier": "free"})
        w.add_sample({"t_s": 0.5, "source": "engine", "kv_usage": 0.25})
    for name in (schema.CHUNKS_FILE, schema.REQUESTS_FILE, schema.SAMPLES_FILE):
        meta = pq.ParquetFile(d / name).metadata
        assert meta.num_row_groups >= 1
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                col = meta.row_group(g).column(c)
                assert col.compression.startswith("LZ4"), (name, col.compression)
                assert not col.has_dictionary_page, (name, col.path_in_schema)
    assert pq.ParquetFile(d / schema.CHUNKS_FILE).metadata.num_rows == 5000


def test_streamed_chunks_survive_an_exception(tmp_path):
    d = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), RunWriter(d, {}, stream_chunks=True) as w:
        w.add_chunks_table(_chunks(0, 300))
        w.flush()
        w.add_chunks_table(_chunks(300, 400))
        raise KeyboardInterrupt
    run = read_run(d)
    assert run.status == schema.STATUS_PARTIAL
    assert len(run.chunks) == 400
    assert not (d / (schema.CHUNKS_FILE + ".tmp")).exists()


def test_a_failed_background_write_keeps_its_rows(tmp_path, monkeypatch):
    """A row group is written on the sink's thread; when that write fails (disk full), the
    producer sees the error at its next flush and no row is lost: after the fault the file
    holds every row, in order."""
    from harness.results import rundir

    real = rundir._TableSink._write_stream
    fail = {"left": 1}

    def flaky(self, tbl):
        if fail["left"]:
            fail["left"] -= 1
            raise OSError(28, "No space left on device")
        real(self, tbl)

    monkeypatch.setattr(rundir._TableSink, "_write_stream", flaky)
    d = tmp_path / "run"
    with RunWriter(d, {}, stream_chunks=True) as w:
        w.add_chunks_table(_chunks(0, 300))
        w.flush()  # submitted; fails on the writer's thread
        w.add_chunks_table(_chunks(300, 500))
        with pytest.raises(OSError, match="No space"):
            w.flush()  # the failure surfaces here; both tables stay buffered
        w.add_chunks_table(_chunks(500, 600))
    run = read_run(d)
    assert run.status == schema.STATUS_COMPLETE
    assert np.array_equal(run.chunks["t_s"].to_numpy(), np.arange(600) * 0.01)
    assert json.loads((d / schema.RUN_JSON).read_text())["rows"]["chunks"] == 600


def test_the_chunk_stream_ignores_the_flush_interval(tmp_path):
    """The wall-clock interval flushes closed parts (what a SIGKILL keeps); a stream keeps
    nothing readable until closed, so its row groups follow flush_rows alone: the same bytes
    however fast the run was produced."""
    import pyarrow.parquet as pq

    d = tmp_path / "run"
    with RunWriter(d, {}, flush_rows=1000, flush_interval_s=0.0, stream_chunks=True) as w:
        for a in range(0, 900, 300):
            w.add_chunks_table(_chunks(a, a + 300))  # every add is past the interval
            w.add_sample({"t_s": a * 0.01, "source": "engine"})
        assert (d / (schema.SAMPLES_FILE + ".parts")).is_dir()  # parts still flush on time
    assert pq.ParquetFile(d / schema.CHUNKS_FILE).metadata.num_row_groups == 1
    assert len(read_run(d).chunks) == 900
