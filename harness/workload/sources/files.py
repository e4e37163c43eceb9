"""Local trace files: project format, Vidur/Splitwise CSV, BurstGPT CSV, Mooncake JSONL.

Row numbers in errors are file *lines* (1-based, the CSV header is line 1), so a user can
open the file at the line named. Rows whose prompt or output length is 0 are common in
production logs (failed or empty requests); they are dropped and the count announced
(``zero_lengths="drop"``, the default) or refused (``zero_lengths="error"``). Anything that is
not a non-negative integer is always an error naming file, line and field, and so is a length
above :data:`MAX_TOKENS` (issue 14: a row asking for 10^12 prompt tokens used to be built
into a prompt until the kernel killed the process). A file that is not UTF-8 is an error
naming the first line with a bad byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from harness.workload.frozen import PARQUET_META_KEY
from harness.workload.frozen import load_trace as load_frozen
from harness.workload.sources.base import SourceData, take_options
from harness.workload.tiers import Tier
from harness.workload.trace import COLUMNS, TraceError

# Longest prompt or output accepted, tokens (2^20: beyond any served context window today, and
# small enough that the prompt text built for it stays a few MB).
MAX_TOKENS = 1 << 20

FORMATS = ("project", "csv", "burstgpt", "mooncake", "azure")


def _show(value: Any) -> str:
    """A cell as the user wrote it (numpy scalars shown as plain numbers)."""
    return repr(value.item() if hasattr(value, "item") else value)


def detect_format(path: Path) -> str:
    """Guess the format from the suffix and, for CSV/JSONL, the header / first record."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "project"
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            header = f.readline()
        if "Request tokens" in header:
            return "burstgpt"
        return "azure" if "ContextTokens" in header else "csv"
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    try:
                        first = json.loads(line)
                    except json.JSONDecodeError:
                        raise TraceError(f"{path}: line 1: not valid JSON") from None
                    if isinstance(first, dict) and "input_length" in first:
                        return "mooncake"
                    return "project"
        raise TraceError(f"{path}: trace file is empty")
    raise TraceError(
        f"{path}: unknown trace format {suffix!r} (use .parquet, .jsonl, .csv, or format=...)"
    )


def load_file(path: Path, options: dict[str, Any]) -> SourceData:
    opts = dict(options)
    fmt = opts.pop("format", None)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    fmt = fmt or detect_format(path)
    if fmt == "project":
        return load_project(path, opts)
    if fmt == "csv":
        return load_vidur_csv(path, opts)
    if fmt == "burstgpt":
        return load_burstgpt(path, opts)
    if fmt == "mooncake":
        return load_mooncake(path, opts)
    if fmt == "azure":
        return load_azure(path, opts)
    raise TraceError(f"unknown trace format {fmt!r} (use {', '.join(FORMATS)})")


def _drop_zero(
    df: pd.DataFrame, cols: dict[str, str], path: Path, mode: str, line_of: np.ndarray
) -> tuple[pd.DataFrame, int]:
    """Validate integer >= 0 per column (error names line + field); drop or refuse zeros."""
    if mode not in ("drop", "error"):
        raise TraceError(f"zero_lengths must be 'drop' or 'error', got {mode!r}")
    zero = np.zeros(len(df), dtype=bool)
    for col, shown in cols.items():
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna() | (vals < 0) | (vals != np.floor(vals))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise TraceError(
                f"{path}: line {int(line_of[i])}: field {shown!r}={_show(df[col].iloc[i])} "
                "is not a non-negative integer"
            )
        _check_max(vals, shown, path, "line", line_of, df[col])
        df[col] = vals.astype("int64")
        z = (df[col] == 0).to_numpy()
        if z.any() and mode == "error":
            i = int(np.flatnonzero(z)[0])
            raise TraceError(f"{path}: line {int(line_of[i])}: field {shown!r} is 0")
        zero |= z
    return df.loc[~zero].reset_index(drop=True), int(zero.sum())


def _check_max(
    vals: pd.Series, shown: str, path: Path, where: str, line_of: np.ndarray, raw: pd.Series
) -> None:
    big = (vals > MAX_TOKENS).to_numpy()
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise TraceError(
            f"{path}: {where} {int(line_of[i])}: field {shown!r}={_show(raw.iloc[i])} is "
            f"above the maximum of {MAX_TOKENS} tokens"
        )


def _bad_utf8(path: Path, exc: UnicodeDecodeError) -> TraceError:
    """The line of the first byte that is not UTF-8 (the decoder's offset is per buffer, so
    the file is scanned once more, line by line)."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return TraceError(
                    f"{path}: line {n}: not UTF-8 (byte {raw[e.start : e.start + 1]!r} at "
                    f"column {e.start + 1}); re-save the file as UTF-8"
                )
    return TraceError(f"{path}: not UTF-8 ({exc.reason})")


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, skipinitialspace=True)
    except UnicodeDecodeError as e:
        raise _bad_utf8(path, e) from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: trace file is empty") from None
    except pd.errors.ParserError as e:
        raise TraceError(f"{path}: not a valid CSV ({str(e).splitlines()[0]})") from None


def _require(df: pd.DataFrame, cols: list[str], path: Path, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(repr(c) for c in missing)} for a {what} "
            f"(found: {', '.join(map(str, df.columns))})"
        )


def _finish(
    df: pd.DataFrame, path: Path, fmt: str, dropped: int, extra: dict[str, Any] | None = None
) -> SourceData:
    if len(df) == 0:
        raise TraceError(f"{path}: trace is empty (no usable rows)")
    meta: dict[str, Any] = {"source": str(path), "format": fmt, "rows": int(len(df))}
    notes = []
    if dropped:
        meta["dropped_zero_length_rows"] = dropped
        notes.append(f"{path}: dropped {dropped} row(s) with a zero prompt or output length")
    meta.update(extra or {})
    return SourceData(df=df, meta=meta, notes=notes)


def _timestamps(
    df: pd.DataFrame, col: str, path: Path, line_of: np.ndarray, unit: float
) -> np.ndarray:
    ts = pd.to_numeric(df[col], errors="coerce")
    bad = ts.isna() | (ts < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise TraceError(
            f"{path}: line {int(line_of[i])}: field {col!r}={_show(df[col].iloc[i])} "
            "is not a non-negative number"
        )
    return ts.to_numpy(dtype=float) * unit


def load_vidur_csv(path: Path, options: dict[str, Any]) -> SourceData:
    """Vidur/Splitwise CSV: ``num_prefill_tokens,num_decode_tokens[,arrived_at]`` (seconds).

    The Azure LLM inference traces converted by Vidur use this shape; ``arrived_at`` is
    honoured as the trace's own timestamps.
    """
    opts = take_options(options, {"zero_lengths": "drop"}, "csv")
    df = _read_csv(path)
    _require(df, ["num_prefill_tokens", "num_decode_tokens"], path, "Vidur-style CSV")
    line_of = np.arange(len(df)) + 2
    out = pd.DataFrame(
        {"prompt_len": df["num_prefill_tokens"], "output_len": df["num_decode_tokens"]}
    )
    if "arrived_at" in df.columns:
        out["timestamp_s"] = _timestamps(df, "arrived_at", path, line_of, 1.0)
    out["_line"] = line_of
    out, dropped = _drop_zero(
        out,
        {"prompt_len": "num_prefill_tokens", "output_len": "num_decode_tokens"},
        path,
        opts["zero_lengths"],
        line_of,
    )
    return _finish(out.drop(columns="_line"), path, "csv", dropped)


def load_azure(path: Path, options: dict[str, Any]) -> SourceData:
    """Azure LLM inference trace CSV as released (``TIMESTAMP,ContextTokens,GeneratedTokens``,
    timestamps as date-times); arrivals are seconds since the first timestamp."""
    opts = take_options(options, {"zero_lengths": "drop"}, "azure")
    df = _read_csv(path)
    _require(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path, "Azure trace CSV")
    line_of = np.arange(len(df)) + 2
    ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise TraceError(
            f"{path}: line {int(line_of[i])}: field 'TIMESTAMP'={_show(df['TIMESTAMP'].iloc[i])} "
            "is not a date-time"
        )
    secs = (ts - ts.min()).dt.total_seconds().to_numpy(dtype=float)
    out = pd.DataFrame(
        {
            "prompt_len": df["ContextTokens"],
            "output_len": df["GeneratedTokens"],
            "timestamp_s": secs,
        }
    )
    out, dropped = _drop_zero(
        out,
        {"prompt_len": "ContextTokens", "output_len": "GeneratedTokens"},
        path,
        opts["zero_lengths"],
        line_of,
    )
    return _finish(out, path, "azure", dropped)


def load_burstgpt(path: Path, options: dict[str, Any]) -> SourceData:
    """BurstGPT CSV (``Timestamp, Model, Request tokens, Response tokens, Total tokens,
    Log Type``). Unlike vLLM (anchors §2.1, which ignores them) the timestamps are honoured.

    Options: ``model`` (keep only that model, e.g. ``GPT-4``; default all),
    ``log_type`` (e.g. ``Conversation log``; default all).
    """
    opts = take_options(
        options, {"zero_lengths": "drop", "model": None, "log_type": None}, "burstgpt"
    )
    df = _read_csv(path)
    _require(df, ["Timestamp", "Request tokens", "Response tokens"], path, "BurstGPT CSV")
    line_of = np.arange(len(df)) + 2
    keep = np.ones(len(df), dtype=bool)
    if opts["model"] is not None:
        _require(df, ["Model"], path, "BurstGPT CSV with model=")
        keep &= (df["Model"].astype(str) == str(opts["model"])).to_numpy()
    if opts["log_type"] is not None:
        _require(df, ["Log Type"], path, "BurstGPT CSV with log_type=")
        keep &= (df["Log Type"].astype(str) == str(opts["log_type"])).to_numpy()
    df = df.loc[keep].reset_index(drop=True)
    line_of = line_of[keep]
    if len(df) == 0:
        raise TraceError(f"{path}: no rows match the model/log_type filter")
    out = pd.DataFrame(
        {
            "prompt_len": df["Request tokens"],
            "output_len": df["Response tokens"],
            "timestamp_s": _timestamps(df, "Timestamp", path, line_of, 1.0),
        }
    )
    out, dropped = _drop_zero(
        out,
        {"prompt_len": "Request tokens", "output_len": "Response tokens"},
        path,
        opts["zero_lengths"],
        line_of,
    )
    extra = {k: opts[k] for k in ("model", "log_type") if opts[k] is not None}
    return _finish(out, path, "burstgpt", dropped, extra)


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], np.ndarray]:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise TraceError(f"{path}: line {n}: expected a JSON object")
                rows.append(obj)
                lines.append(n)
    except UnicodeDecodeError as e:
        raise _bad_utf8(path, e) from None
    if not rows:
        raise TraceError(f"{path}: trace file is empty")
    return rows, np.asarray(lines)


def load_mooncake(path: Path, options: dict[str, Any]) -> SourceData:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Timestamps are honoured (ms -> s). ``hash_ids`` (one id per ``block_tokens``-token prompt
    block; 512 in the Mooncake release) is kept so prompts can share prefixes.
    """
    opts = take_options(options, {"zero_lengths": "drop", "block_tokens": 512}, "mooncake")
    rows, line_of = _read_jsonl(path)
    for row, n in zip(rows, line_of, strict=True):
        for key in ("timestamp", "input_length", "output_length"):
            if key not in row:
                raise TraceError(f"{path}: line {n}: missing field {key!r}")
        if "hash_ids" in row and not isinstance(row["hash_ids"], list):
            raise TraceError(f"{path}: line {n}: field 'hash_ids' is not a list")
    df = pd.DataFrame(rows)
    out = pd.DataFrame(
        {
            "prompt_len": df["input_length"],
            "output_len": df["output_length"],
            "timestamp_s": _timestamps(df, "timestamp", path, line_of, 1e-3),
        }
    )
    if "hash_ids" in df.columns:
        out["hash_ids"] = [list(h) if isinstance(h, list) else [] for h in df["hash_ids"]]
    out, dropped = _drop_zero(
        out,
        {"prompt_len": "input_length", "output_len": "output_length"},
        path,
        opts["zero_lengths"],
        line_of,
    )
    return _finish(out, path, "mooncake", dropped, {"block_tokens": int(opts["block_tokens"])})


# ----------------------------------------------------------------------- project format


def load_project(path: Path, options: dict[str, Any]) -> SourceData:
    """The project's own trace format (a frozen replay): Parquet or JSONL with the Trace
    columns (trace.py ``COLUMNS``). Parquet files written by :func:`save_trace` also carry
    the tiers and meta in the file metadata; JSONL files use the default tiers unless given.
    """
    take_options(options, {}, "project")
    tiers: list[Tier] | None = None
    meta: dict[str, Any] = {}
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a bad file
            raise TraceError(f"{path}: not a readable Parquet file ({e})") from None
        md = table.schema.metadata or {}
        if PARQUET_META_KEY in md:
            try:
                info = json.loads(md[PARQUET_META_KEY])
            except ValueError:
                raise TraceError(f"{path}: unreadable frozen-trace metadata") from None
            if info.get("content_hash"):
                # A frozen trace replays exactly what was frozen: an edited file is refused
                # (the check is harness.workload.frozen's).
                load_frozen(path)
            tiers = [Tier.from_dict(t) for t in info.get("tiers", [])] or None
            meta = info.get("meta", {})
        df = table.to_pandas()
        line_of = np.arange(len(df))
        where = "row"
    else:
        rows, line_of = _read_jsonl(path)
        df = pd.DataFrame(rows)
        where = "line"
    required = ["prompt_len", "output_len"]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path}: missing field(s) {', '.join(repr(c) for c in missing)} "
            f"(project format columns: {', '.join(COLUMNS)})"
        )
    if len(df) == 0:
        raise TraceError(f"{path}: trace is empty")
    for col in ("prompt_len", "output_len"):
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna() | (vals < 1) | (vals != np.floor(vals))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise TraceError(
                f"{path}: {where} {int(line_of[i])}: field {col!r}={_show(df[col].iloc[i])} "
                "is not an integer >= 1"
            )
        _check_max(vals, col, path, where, line_of, df[col])
        df[col] = vals.astype("int64")
    out = pd.DataFrame({"prompt_len": df["prompt_len"], "output_len": df["output_len"]})
    if "prompt" in df.columns:
        out["prompt"] = df["prompt"].where(df["prompt"].notna(), None)
    if "arrival_s" in df.columns:
        out["timestamp_s"] = _timestamps(df, "arrival_s", path, line_of, 1.0)
        out["arrival_s"] = out["timestamp_s"]
    for col in ("request_id", "tier"):
        if col in df.columns:
            out[col] = df[col].astype(str)
    src_meta = {"source": str(path), "format": "project", "rows": int(len(out))}
    if meta:
        src_meta["frozen_meta"] = meta
        # A frozen fallback trace stays marked as such wherever it is replayed.
        for key in ("fallback", "profile", "profile_origin", "reason"):
            if key in meta:
                src_meta[key] = meta[key]
    notes = []
    if meta.get("fallback"):
        notes.append(
            f"{path}: this frozen trace was built from the bundled length profile "
            f"{meta.get('profile')!r}, not the real dataset ({meta.get('reason')})"
        )
    return SourceData(df=out, meta=src_meta, tiers=tiers, notes=notes)
