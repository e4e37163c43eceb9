"""Frozen replays: a Trace written to Parquet with its tiers, meta and content hash.

A frozen file replays identically against any target or policy: ``build_trace(path)`` (no
rate, no tiers given) returns the same arrivals, prompts, lengths, tiers and request ids,
and :func:`load_trace` checks the stored content hash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.workload.sessions import SESSION_COLUMNS
from harness.workload.tiers import Tier
from harness.workload.trace import COLUMNS, Trace, TraceError

# The Parquet key-value metadata entry that marks a frozen trace (and holds its info).
PARQUET_META_KEY = b"harness.trace"


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def write_parquet(trace: Trace, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Session columns (harness.workload.sessions) travel too: a frozen session trace replays
    # its sessions, not independent calls.
    extra = ("hash_ids", *SESSION_COLUMNS)
    cols = list(COLUMNS) + [c for c in extra if c in trace.df.columns]
    df = trace.df[cols].copy()
    table = pa.Table.from_pandas(df, preserve_index=False)
    info = {
        "version": 1,
        "tiers": [t.to_dict() for t in trace.tiers],
        "meta": _jsonable(trace.meta),
        "content_hash": trace.content_hash(),
    }
    md = dict(table.schema.metadata or {})
    md[PARQUET_META_KEY] = json.dumps(info).encode()
    table = table.replace_schema_metadata(md)
    pq.write_table(table, path)
    return path


def load_trace(path: Path | str) -> Trace:
    """Read a frozen trace exactly as written (tiers and meta from the file metadata); the
    content hash is verified so an edited file is caught."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise TraceError(f"{path}: not a readable Parquet file ({e})") from None
    md = table.schema.metadata or {}
    if PARQUET_META_KEY not in md:
        raise TraceError(
            f"{path}: not a frozen harness trace (no '{PARQUET_META_KEY.decode()}' "
            "metadata); use build_trace() to load other files"
        )
    info = json.loads(md[PARQUET_META_KEY])
    tiers = [Tier.from_dict(t) for t in info["tiers"]]
    df = table.to_pandas()
    if "prompt" in df.columns:
        df["prompt"] = df["prompt"].where(df["prompt"].notna(), None)
    trace = Trace.from_frame(df, tiers, info.get("meta", {}))
    want = info.get("content_hash")
    if want and trace.content_hash() != want:
        raise TraceError(f"{path}: content hash mismatch (the file was modified after freezing)")
    return trace
