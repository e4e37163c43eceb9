"""The Trace: the requests a run sends, with their arrival offsets and tiers.

A Trace is a thin wrapper over a pandas DataFrame with the columns in :data:`COLUMNS` plus
``meta`` (where it came from, seeds, whether a fallback profile was used) and the tiers the
``tier`` column refers to. Every host (replay, simulate, serve) consumes this one type.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from harness.workload.tiers import Tier

COLUMNS: dict[str, str] = {
    "request_id": "str: unique id, sent as x-request-id",
    "arrival_s": "float: offset from the run start, non-decreasing",
    "prompt": "str|None: prompt text (None: synthesise from prompt_len at send time)",
    "prompt_len": "int >= 1: prompt tokens (exact for the built-in engine, a hint otherwise)",
    "output_len": "int >= 1: output tokens to generate (max_tokens, ignore-EOS)",
    "tier": "str: a tier name from Trace.tiers",
}


class TraceError(ValueError):
    """A trace that cannot be used; the message names the file/row/field where known."""


@dataclass
class Trace:
    """Requests in arrival order. Construct through :meth:`from_frame` to get validation."""

    df: pd.DataFrame
    tiers: list[Tier]
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_frame(
        cls, df: pd.DataFrame, tiers: list[Tier], meta: dict[str, Any] | None = None
    ) -> Trace:
        """Validate columns, types and order; fill missing ``prompt`` with None."""
        df = df.copy()
        if "prompt" not in df.columns:
            df["prompt"] = None
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise TraceError(f"trace is missing column(s): {', '.join(missing)}")
        if len(df) == 0:
            raise TraceError("trace is empty")
        for col in ("prompt_len", "output_len"):
            vals = pd.to_numeric(df[col], errors="coerce")
            bad = vals.isna() | (vals < 1) | (vals != np.floor(vals))
            if bad.any():
                row = int(np.flatnonzero(bad.to_numpy())[0])
                bad_val = df[col].iloc[row]
                bad_val = bad_val.item() if hasattr(bad_val, "item") else bad_val
                raise TraceError(f"row {row}: {col}={bad_val!r} is not an integer >= 1")
            df[col] = vals.astype(np.int64)
        arr = pd.to_numeric(df["arrival_s"], errors="coerce")
        if arr.isna().any() or (arr < 0).any():
            row = int(np.flatnonzero((arr.isna() | (arr < 0)).to_numpy())[0])
            raise TraceError(f"row {row}: arrival_s={df['arrival_s'].iloc[row]!r} is not >= 0")
        df["arrival_s"] = arr.astype(float)
        if (np.diff(df["arrival_s"].to_numpy()) < 0).any():
            df = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
        df["request_id"] = df["request_id"].astype(str)
        if df["request_id"].duplicated().any():
            dup = df["request_id"][df["request_id"].duplicated()].iloc[0]
            raise TraceError(f"duplicate request_id {dup!r}")
        names = {t.name for t in tiers}
        unknown = set(df["tier"].astype(str)) - names
        if unknown:
            raise TraceError(f"tier(s) {sorted(unknown)} not in the tier spec {sorted(names)}")
        df["tier"] = df["tier"].astype(str)
        return cls(df=df.reset_index(drop=True), tiers=list(tiers), meta=dict(meta or {}))

    def __len__(self) -> int:
        return len(self.df)

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def content_hash(self) -> str:
        """sha256 over the columns that define the replay (arrivals, lengths, tiers, prompts)."""
        h = hashlib.sha256()
        for col in ("request_id", "arrival_s", "prompt_len", "output_len", "tier", "prompt"):
            h.update(col.encode())
            values = self.df[col]
            if values.dtype == np.int64 or _all_none(values):
                h.update(_categorised_str_hash(values.to_numpy()))
                continue
            if values.dtype == np.float64:  # str() of each float, as astype(str)
                values = pd.Series(_float_strs(values.to_numpy()), dtype=object)
            else:
                values = values.astype(str)
            # the unique columns skip pandas' categorising pass (the same hashes, ~4x faster;
            # the same because every value is a string by now: ids are cast to str in
            # from_frame and a NaN arrival is refused there)
            unique = col in ("request_id", "arrival_s")
            h.update(pd.util.hash_pandas_object(values, index=False, categorize=not unique).values)
        return h.hexdigest()


# Where Arrow's float-to-string cast writes what Python's repr does: the shortest round-trip
# digits both, in fixed notation both, for non-integer magnitudes in [1e-4, 1e10) (below,
# Python writes an exponent and Arrow does not; from 1e10 the reverse; integers: "5" / "5.0").
_ARROW_REPR = (1e-4, 1e10)


def _float_strs(v: np.ndarray) -> np.ndarray:
    """``str`` of each float (an object array), as ``astype(str)`` writes them: Arrow's cast
    where it writes the same text (:data:`_ARROW_REPR`; ~5x faster than a Python call per
    value: 100k arrival times in 0.027 s instead of 0.125 here), Python's elsewhere, and
    Python's for all if a sample of Arrow's texts is not Python's (another Arrow release)."""
    lo, hi = _ARROW_REPR
    a = np.abs(v)
    arrow = (a >= lo) & (a < hi) & (v != np.floor(v))
    out = pc.cast(pa.array(v), pa.string()).to_numpy(zero_copy_only=False)
    check = np.flatnonzero(arrow)[::997]
    if out[check].tolist() != list(map(str, v[check].tolist())):
        out[:] = list(map(str, v.tolist()))
        return out
    rest = np.flatnonzero(~arrow)
    out[rest] = list(map(str, v[rest].tolist()))
    return out


def _all_none(values: pd.Series) -> bool:
    """An object column of None only (a trace without prompt text)."""
    if values.dtype != object or not len(values):
        return False
    first = values.iat[0]
    return first is None and bool((values.to_numpy() == first).all())


def _categorised_str_hash(values: np.ndarray) -> np.ndarray:
    """``hash_pandas_object(Series(values).astype(str), index=False)`` for int64 values or
    None only, without the strings of every row: pandas categorises the strings (factorise
    in order of first appearance, hash each category, take by code), and ``str`` is one to one
    on these values, so the factorised values give the same categories in the same order.
    ~3 ms instead of ~45 ms a 100k-row column here (the row strings, then their factorising)."""
    if values.dtype == object:  # None only (_all_none): one category
        codes, cats = np.zeros(len(values), dtype=np.intp), np.array(["None"], dtype=object)
    else:
        codes, uniques = pd.factorize(values, sort=False)
        cats = np.array([str(v) for v in uniques.tolist()], dtype=object)
    return pd.util.hash_array(cats, categorize=False).take(codes)
