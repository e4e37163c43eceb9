"""Run directory I/O: an incremental, crash-safe writer and the one reader (design.md "Run
directory"; layout and schemas in :mod:`harness.results.schema`).

On-disk layout while a run is being written (why: a Parquet file is only readable once its
footer is written, so a writer killed mid-file loses the whole file; small closed segments
survive a SIGKILL):

```
<run_dir>/run.json                     rewritten atomically (tmp + os.replace) on every change
<run_dir>/requests.parquet.parts/      one closed Parquet file per flush: part-000000.parquet, ...
<run_dir>/chunks.parquet.parts/        (each written as .tmp then renamed, so a part is either
<run_dir>/samples.parquet.parts/        complete or absent)
```

On :meth:`RunWriter.close` (also on an exception / Ctrl-C through the context manager) the
parts of each table are streamed into one ``<table>.parquet`` file (written as .tmp, then
renamed), and only then the parts folder is removed. So a finished run has exactly the
single-file layout of ``schema.py``; a SIGKILLed one keeps its parts folders and
``status: running`` (a simulator's writer, ``stream_chunks=True``, appends its chunk rows
to one open ``chunks.parquet.tmp`` instead, on a thread of its own while the simulation goes
on, which a SIGKILL leaves unreadable: simulations are reproducible). :func:`read_run` reads
either: the single file when present (a crash between the rename and the cleanup leaves a
complete file plus stale parts, which are ignored), else the sorted parts. Status in
run.json: ``running`` → ``complete`` | ``partial``; :attr:`Run.status` reports a ``running``
run that nobody is writing as ``partial``.

Flushing: rows are buffered in memory and a table is written out as one part when its buffer
holds ``flush_rows`` rows, when ``flush_interval_s`` has passed since the last flush (checked
on each add), or when :meth:`RunWriter.flush` is called. Bulk producers (the simulator:
~30M chunk rows) should use the ``*_table`` methods, which only keep references to Arrow
tables until a part is written.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness import clock
from harness.results import schema

SCHEMA_VERSION = 1
_PARTS_SUFFIX = ".parts"
# Every table is LZ4 (Arrow writes Parquet's LZ4_RAW codec, not the deprecated Hadoop-framed
# LZ4) without dictionary pages. Measured on the tables of a 100k-request simulation: the
# chunk log (~15M rows) in 0.12 s instead of 0.30 (zstd with its request ids as a
# dictionary), a third of the read time, 4.7 MB instead of 4.8 (zstd without the dictionary:
# 15 MB). RAD on Azure-conversation lengths (1.1M sample rows): the samples in 0.28 s instead
# of zstd's 0.44 and read in 0.07 instead of 0.13 (22 MB instead of 16), the requests in 0.038
# instead of 0.056 (6.3 MB instead of 4.5). Dictionaries cost time and size on every table.
_COMPRESSION = "lz4"
# Columns read as pandas categoricals: three names over a million sample rows of a long
# simulation (one per engine step). The summary's row filters (``source == "gpu"``, ...) then
# compare codes: 0.5 ms instead of ~90 ms each on this machine (rad on Azure conversations, 100k
# requests: 1.1M sample rows, seven such filters). Not ``engine``: the cluster report groups
# by it, and a categorical's groupby would also yield the engines a filter left out.
_CATEGORIES: dict[str, tuple[str, ...]] = {schema.SAMPLES_FILE: ("source",)}


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so that readers see either the old or the new file, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    raise TypeError(f"run.json: value of type {type(o).__name__} is not JSON serialisable")


def json_safe(o: Any) -> Any:
    """Strict-JSON view of ``o``: NaN/inf -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [json_safe(v) for v in o]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as pretty strict JSON (NaN/inf become null; numpy scalars,
    Paths and dataclasses allowed)."""
    text = json.dumps(json_safe(obj), indent=2, default=_json_default, allow_nan=False)
    _atomic_write_text(path, text)


class _TableSink:
    """One table of the run: a row buffer, a list of pending Arrow tables, and part files."""

    def __init__(
        self,
        run_dir: Path,
        filename: str,
        arrow_schema: pa.Schema,
        part_prefix: str = "part-",
        stream: bool = False,
    ) -> None:
        self.final = run_dir / filename
        # stream: flushes append row groups to one open file instead of closed parts
        self.stream = stream
        self._writer: pq.ParquetWriter | None = None
        # stream: the row group being written on the sink's own thread (Arrow encodes and
        # compresses without the GIL, so the producer - a simulator - goes on meanwhile)
        self._pending: tuple[Future[None], pa.Table] | None = None
        self._io: ThreadPoolExecutor | None = None
        # Other writers of the same run (load-generator worker processes) use their own
        # prefix, ``part-wNNN-``; finalize merges every ``part-*`` file in name order.
        self.part_prefix = part_prefix
        self.parts_dir = run_dir / (filename + _PARTS_SUFFIX)
        self.schema = arrow_schema
        self.names = set(arrow_schema.names)
        self.rows: list[dict[str, Any]] = []
        self.tables: list[pa.Table] = []
        self.table_rows = 0
        # Column buffers for add_chunks (the hot path of a live replay).
        self.col_req: list[int] = []
        self.col_t: list[float] = []
        self.col_tok: list[int] = []
        self.next_part = 0
        self.rows_written = 0

    @property
    def buffered(self) -> int:
        return len(self.rows) + self.table_rows + len(self.col_t)

    def add_row(self, row: dict[str, Any]) -> None:
        unknown = row.keys() - self.names
        if unknown:
            raise ValueError(f"{self.final.name}: unknown column(s) {sorted(unknown)}")
        self.rows.append(row)

    def add_table(self, tbl: pa.Table) -> None:
        if tbl.num_rows == 0:
            return
        unknown = set(tbl.column_names) - self.names
        if unknown:
            raise ValueError(f"{self.final.name}: unknown column(s) {sorted(unknown)}")
        cols = []
        for f in self.schema:
            if f.name in tbl.column_names:
                cols.append(tbl.column(f.name).cast(f.type))
            else:
                if not f.nullable:
                    raise ValueError(f"{self.final.name}: missing required column {f.name!r}")
                cols.append(pa.nulls(tbl.num_rows, f.type))
        self._seal_rows()
        self.tables.append(pa.Table.from_arrays(cols, schema=self.schema))
        self.table_rows += tbl.num_rows

    def _seal_rows(self) -> None:
        """Turn the row and column buffers into a pending table (keeps insertion order)."""
        if self.rows:
            self.tables.append(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.table_rows += len(self.rows)
            self.rows = []
        if self.col_t:
            self.tables.append(
                pa.Table.from_arrays(
                    [
                        pa.array(self.col_req, pa.int64()),
                        pa.array(self.col_t, pa.float64()),
                        pa.array(self.col_tok, pa.int32()),
                    ],
                    schema=self.schema,
                )
            )
            self.table_rows += len(self.col_t)
            self.col_req, self.col_t, self.col_tok = [], [], []

    def _drain(self) -> pa.Table | None:
        self._seal_rows()
        pieces = self.tables
        self.tables, self.table_rows = [], 0
        if not pieces:
            return None
        return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)

    def flush(self) -> None:
        """Write everything buffered as one closed part file (tmp + rename)."""
        tbl = self._drain()
        if tbl is None or tbl.num_rows == 0:
            return
        if self.stream:
            self._wait_stream(keep=tbl)
            if self._io is None:
                self._io = ThreadPoolExecutor(1, thread_name_prefix="run-writer")
            self._pending = (self._io.submit(self._write_stream, tbl), tbl)
            return
        path = self.parts_dir / f"{self.part_prefix}{self.next_part:06d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.parts_dir.mkdir(exist_ok=True)
            pq.write_table(
                tbl,
                tmp,
                compression=_COMPRESSION,
                use_dictionary=False,
                row_group_size=1 << 20,
            )
            os.replace(tmp, path)
        except OSError:
            # Out of descriptors / disk: keep the rows buffered for the next flush (the
            # caller sees the error), never drop them.
            self.tables.insert(0, tbl)
            self.table_rows += tbl.num_rows
            tmp.unlink(missing_ok=True)
            raise
        self.next_part += 1
        self.rows_written += tbl.num_rows

    def _write_stream(self, tbl: pa.Table) -> None:
        """Append ``tbl`` as row groups of the open stream file (on the sink's thread)."""
        if self._writer is None:
            self._writer = pq.ParquetWriter(
                self._stream_tmp,
                self.schema,
                compression=_COMPRESSION,
                use_dictionary=False,
            )
        self._writer.write_table(tbl, row_group_size=1 << 20)

    def _wait_stream(self, keep: pa.Table | None = None) -> None:
        """Wait for the row group in flight. If it failed (out of disk...), its rows go back
        to the front of the buffer (then ``keep``, the table about to be written) and the
        caller sees the error, as a failed part write: rows are never dropped."""
        if self._pending is None:
            return
        fut, tbl = self._pending
        self._pending = None
        try:
            fut.result()
        except OSError:
            back = [tbl] if keep is None else [tbl, keep]
            self.tables[:0] = back
            self.table_rows += sum(t.num_rows for t in back)
            raise
        self.rows_written += tbl.num_rows

    @property
    def _stream_tmp(self) -> Path:
        return self.final.with_name(self.final.name + ".tmp")

    def finalize(self) -> None:
        """Merge the parts into the single final file, then drop the parts folder (stream:
        close the open file and rename it)."""
        self.flush()
        if self.stream:
            self._wait_stream()
            if self._io is not None:
                self._io.shutdown()
                self._io = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None
                os.replace(self._stream_tmp, self.final)
            return
        parts = _list_parts(self.parts_dir)
        # Count every part, this sink's and other writers' (worker processes).
        self.rows_written = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
        if len(parts) == 1:  # one atomic rename: the rows are always in a part or the file
            os.replace(parts[0], self.final)
        else:
            tmp = self.final.with_name(self.final.name + ".tmp")
            with pq.ParquetWriter(
                tmp, self.schema, compression=_COMPRESSION, use_dictionary=False
            ) as w:
                for p in parts:  # stream part by part: memory stays at one part
                    w.write_table(pq.read_table(p, schema=self.schema))
            os.replace(tmp, self.final)
        shutil.rmtree(self.parts_dir, ignore_errors=True)


def _list_parts(parts_dir: Path) -> list[Path]:
    if not parts_dir.is_dir():
        return []
    return sorted(parts_dir.glob("part-*.parquet"))


def claim_run_dir(run_dir: Path | str, force: bool = False) -> Path:
    """Make sure ``run_dir`` may receive a new run: absent or empty, or (``force``) a run
    directory, which is then deleted whole (its old faults.jsonl and report included).

    Raises ``FileExistsError`` with one line otherwise: an existing run is never replaced
    silently (issue 14, point 4), and a folder that is not a run is never deleted."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return run_dir
    if not run_dir.is_dir():
        raise FileExistsError(f"{run_dir} is a file, not a run directory")
    if not any(run_dir.iterdir()):
        return run_dir
    if not (run_dir / schema.RUN_JSON).is_file():
        raise FileExistsError(
            f"{run_dir} is a non-empty folder that holds no run; choose another --out"
        )
    if not force:
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --force to replace it, or choose another --out"
        )
    shutil.rmtree(run_dir)
    return run_dir


class RunWriter:
    """Writes one run directory incrementally; see the module docstring for the layout.

    Use as a context manager: leaving the block normally closes the run as ``complete``; an
    exception or KeyboardInterrupt closes it as ``partial`` (everything buffered is flushed)
    and re-raises. ``meta`` is the run.json content (config echo, trace info, tiers, t0_unix...).

    ``stream_chunks``: chunk flushes go as row groups into one open ``chunks.parquet.tmp``,
    renamed on close, instead of part files merged on close. Why: the merge decodes and
    re-encodes every row (~15M for a 100k-request simulation, over a second); the price is
    that a SIGKILLed writer leaves no readable chunk rows (an exception or Ctrl-C still
    closes the file). For reproducible producers (the simulator), not for live replays. The
    chunk stream flushes on ``flush_rows`` (or :meth:`flush`), never on the wall-clock
    interval, so a run's chunk file is the same bytes however fast it was produced.
    """

    def __init__(
        self,
        run_dir: Path | str,
        meta: dict[str, Any],
        *,
        flush_rows: int = 1_000_000,
        flush_interval_s: float = 1.0,
        stream_chunks: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if (self.run_dir / schema.RUN_JSON).exists():
            old = json.loads((self.run_dir / schema.RUN_JSON).read_text(encoding="utf-8"))
            if old.get("status") == schema.STATUS_RUNNING:
                raise FileExistsError(
                    f"{self.run_dir} holds a run that is still being written "
                    "(or whose writer died: delete the folder to reuse it)"
                )
        for name in (schema.SUMMARY_JSON, schema.REPORT_HTML):  # derived from the old run
            (self.run_dir / name).unlink(missing_ok=True)
        for name in (schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SAMPLES_FILE):
            (self.run_dir / name).unlink(missing_ok=True)
            (self.run_dir / (name + ".tmp")).unlink(missing_ok=True)  # a killed stream's
            shutil.rmtree(self.run_dir / (name + _PARTS_SUFFIX), ignore_errors=True)
        self.flush_rows = int(flush_rows)
        self.flush_interval_s = float(flush_interval_s)
        self.meta: dict[str, Any] = dict(meta)
        self.meta.setdefault("schema_version", SCHEMA_VERSION)
        self.meta.setdefault("created_unix", time.time())
        self.meta["status"] = schema.STATUS_RUNNING
        # A session run (meta "sessions") adds session_id/call_index/parents/attempt columns.
        req_schema = schema.REQUESTS_SESSIONS if self.meta.get("sessions") else schema.REQUESTS
        self._requests = _TableSink(self.run_dir, schema.REQUESTS_FILE, req_schema)
        self._chunks = _TableSink(
            self.run_dir, schema.CHUNKS_FILE, schema.CHUNKS, stream=stream_chunks
        )
        self._samples = _TableSink(self.run_dir, schema.SAMPLES_FILE, schema.SAMPLES)
        # Chunks and samples are written before requests, so a kill between two part files
        # never leaves a request row whose chunks are missing (it would read as failed).
        self._sinks = (self._chunks, self._samples, self._requests)
        self._last_flush = clock.now()
        self.closed = False
        # Every public method holds this lock, so a producer may flush from a worker thread
        # (the load generator does, to keep parquet encoding off its event loop).
        self._lock = threading.RLock()
        self._write_meta()

    # -- metadata -------------------------------------------------------------------------
    def _write_meta(self) -> None:
        write_json(self.run_dir / schema.RUN_JSON, self.meta)

    def update_meta(self, **kv: Any) -> None:
        """Merge keys into run.json and rewrite it atomically."""
        with self._lock:
            self.meta.update(kv)
            self._write_meta()

    # -- rows -----------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self.closed:
            raise RuntimeError("RunWriter is closed")

    def _check(self, sink: _TableSink) -> None:
        if sink.buffered >= self.flush_rows:
            sink.flush()
        elif clock.now() - self._last_flush >= self.flush_interval_s:
            # The interval bounds what a SIGKILL loses, which closed parts keep; a stream sink
            # keeps nothing readable until closed, so it flushes on size (or an explicit
            # flush) alone, and its row groups follow the producer's batches, not the clock.
            self._flush(s for s in self._sinks if not s.stream)

    def add_request(self, row: dict[str, Any]) -> None:
        """One REQUESTS row (missing nullable keys = null; unknown keys raise)."""
        with self._lock:
            self._ensure_open()
            self._requests.add_row(row)
            self._check(self._requests)

    def add_requests_table(self, tbl: pa.Table) -> None:
        """Many REQUESTS rows at once (columns cast to the schema; missing = null)."""
        with self._lock:
            self._ensure_open()
            self._requests.add_table(tbl)
            self._check(self._requests)

    def add_chunks(self, req: int, t_s: Sequence[float], tokens: Sequence[int]) -> None:
        """All streamed chunks of one request: receipt times (run clock, s) and token counts."""
        with self._lock:
            self._ensure_open()
            if len(t_s) != len(tokens):
                raise ValueError(
                    f"add_chunks(req={req}): {len(t_s)} times but {len(tokens)} counts"
                )
            s = self._chunks
            s.col_req.extend([int(req)] * len(t_s))
            s.col_t.extend(t_s)
            s.col_tok.extend(tokens)
            self._check(s)

    def add_chunks_table(self, tbl: pa.Table) -> None:
        """Bulk CHUNKS rows (req, t_s, tokens); the fast path for simulations."""
        with self._lock:
            self._ensure_open()
            self._chunks.add_table(tbl)
            self._check(self._chunks)

    def add_sample(self, row: dict[str, Any]) -> None:
        """One SAMPLES row (missing keys = null)."""
        with self._lock:
            self._ensure_open()
            self._samples.add_row(row)
            self._check(self._samples)

    def add_samples_table(self, tbl: pa.Table) -> None:
        """Many SAMPLES rows at once (missing columns = null)."""
        with self._lock:
            self._ensure_open()
            self._samples.add_table(tbl)
            self._check(self._samples)

    def flush(self) -> None:
        """Write every buffered row of every table as closed part files."""
        self._flush(self._sinks)

    def _flush(self, sinks: Iterable[_TableSink]) -> None:
        with self._lock:
            for s in sinks:
                s.flush()
            self._last_flush = clock.now()

    # -- closing --------------------------------------------------------------------------
    def close(self, status: str = schema.STATUS_COMPLETE) -> None:
        """Flush, merge parts into the final files and record ``status`` in run.json."""
        with self._lock:
            if self.closed:
                return
            if status not in (schema.STATUS_COMPLETE, schema.STATUS_PARTIAL):
                raise ValueError(f"status must be complete or partial, not {status!r}")
            self.closed = True
            for s in self._sinks:
                s.finalize()
            self.meta["status"] = status
            self.meta["closed_unix"] = time.time()
            self.meta["rows"] = {
                "requests": self._requests.rows_written,
                "chunks": self._chunks.rows_written,
                "samples": self._samples.rows_written,
            }
            self._write_meta()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close(schema.STATUS_COMPLETE)
        else:
            if not self.closed:
                self.meta["stopped_by"] = f"{exc_type.__name__}: {exc}"[:500]
            self.close(schema.STATUS_PARTIAL)


# --------------------------------------------------------------------------------------------
@dataclass
class Run:
    """A run directory loaded in memory. ``summary`` is None until summary.json exists."""

    dir: Path
    meta: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    samples: pd.DataFrame
    summary: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)  # table -> "file" | "parts" | "none"

    @property
    def status(self) -> str:
        """``complete`` / ``partial``; a ``running`` run read from disk is reported partial
        (its writer either is still going or died, e.g. SIGKILL)."""
        st = self.meta.get("status", schema.STATUS_PARTIAL)
        return schema.STATUS_PARTIAL if st == schema.STATUS_RUNNING else st


def read_table(
    run_dir: Path | str, filename: str, columns: Iterable[str] | None = None
) -> pa.Table:
    """One table of a run as Arrow: the final file, else its flushed parts, else empty."""
    run_dir = Path(run_dir)
    arrow_schema = {
        schema.REQUESTS_FILE: schema.REQUESTS,
        schema.CHUNKS_FILE: schema.CHUNKS,
        schema.SAMPLES_FILE: schema.SAMPLES,
    }[filename]
    cols = list(columns) if columns is not None else None
    final = run_dir / filename
    parts = [] if final.is_file() else _list_parts(run_dir / (filename + _PARTS_SUFFIX))
    if filename == schema.REQUESTS_FILE and (final.is_file() or parts):
        # Session runs carry extra columns; plain runs read exactly as REQUESTS.
        arrow_schema = schema.requests_schema(
            pq.read_schema(final if final.is_file() else parts[0]).names
        )
    if final.is_file():
        return pq.read_table(final, columns=cols, schema=arrow_schema)
    if parts:
        return pa.concat_tables(
            [pq.read_table(p, columns=cols, schema=arrow_schema) for p in parts]
        )
    empty = arrow_schema.empty_table()
    return empty.select(cols) if cols is not None else empty


def _where(run_dir: Path, filename: str) -> str:
    if (run_dir / filename).is_file():
        return "file"
    if _list_parts(run_dir / (filename + _PARTS_SUFFIX)):
        return "parts"
    return "none"


def _read_json(path: Path) -> Any:
    """A run's JSON file; a torn or edited one is a ValueError naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); the file is damaged") from None


def read_run(
    run_dir: Path | str,
    *,
    requests: bool = True,
    chunks: bool = True,
    samples: bool | Sequence[str] = True,
) -> Run:
    """Load a run directory (complete, partial, or killed mid-way). ``chunks=False`` /
    ``samples=False`` skip those tables (empty frames) when only request-level data is
    needed; the summary needs the chunks (ITL, token buckets). ``requests=False`` too reads
    only run.json and summary.json (a 100k-request table is ~60 ms to read and convert).
    ``samples`` as column names reads only those of the samples (a long simulation has one
    row a step: ~1.1M rows, 17 columns, ~150 MB as a frame)."""
    run_dir = Path(run_dir)
    meta_path = run_dir / schema.RUN_JSON
    if not meta_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {schema.RUN_JSON})")
    meta = _read_json(meta_path)

    def load(filename: str, want: bool | Sequence[str]) -> pd.DataFrame:
        if want is False:
            return _empty_frame(filename)
        tbl = read_table(run_dir, filename, None if want is True else want)
        cats = [c for c in _CATEGORIES.get(filename, ()) if c in tbl.column_names]
        return tbl.to_pandas(categories=cats or None)

    summary = None
    sp = run_dir / schema.SUMMARY_JSON
    if sp.is_file():
        summary = _read_json(sp)
    return Run(
        dir=run_dir,
        meta=meta,
        requests=load(schema.REQUESTS_FILE, requests),
        chunks=load(schema.CHUNKS_FILE, chunks),
        samples=load(schema.SAMPLES_FILE, samples),
        summary=summary,
        files={
            n: _where(run_dir, n)
            for n in (schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SAMPLES_FILE)
        },
    )


def _empty_frame(filename: str) -> pd.DataFrame:
    arrow_schema = {
        schema.REQUESTS_FILE: schema.REQUESTS,
        schema.CHUNKS_FILE: schema.CHUNKS,
        schema.SAMPLES_FILE: schema.SAMPLES,
    }[filename]
    return arrow_schema.empty_table().to_pandas()
