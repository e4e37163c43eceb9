"""``build_trace``: one call from a source name or file to a validated :class:`Trace`.

Order of operations (each on its own RNG stream, ``np.random.default_rng([seed, k])``:
arrivals k=1, row sampling k=2, tiers k=3, prompts k=4), so changing one axis never
reshuffles another: a new rate keeps the same requests and tiers; a new tier spec keeps
the same arrivals and lengths.

1. Load the source rows (a named source, or a file: see ``harness.workload.sources``).
2. Arrivals: the trace's own timestamps x ``time_scale`` when ``rate`` and ``rate_schedule``
   are None and the source has timestamps (or ``arrival="trace"``); otherwise the chosen
   process at ``rate`` / ``rate_schedule`` (arrivals.py).
3. Rows, the documented sampling rule:
   - own timestamps: the first N rows in time order (a contiguous slice of the trace); N
     above the row count tiles the trace (copy k shifted by k x (span + mean gap)),
     announced;
   - generated arrivals: ``sample="shuffle"`` (default, like vLLM's seeded shuffle of
     ShareGPT) or ``sample="head"`` (file order); N above the row count keeps every row
     once and draws the rest with replacement (vLLM's oversampling), announced.
4. Tiers from ``tiers`` (a spec or list; default SLAI paper's), optionally varying over time
   (``tier_mix``); a frozen project-format trace keeps its own tags unless told otherwise.
5. Prompts kept from the source when it has text; ``prompts="words"`` (or a tokenizer)
   synthesises them for length-only rows (prompts.py); otherwise left None (synthesised at
   send time).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from harness.workload.arrivals import (
    PROCESSES,
    RateSchedule,
    arrival_times,
    parse_rate_schedule,
    schedule_arrivals,
    trace_arrivals,
)
from harness.workload.sources import load_source
from harness.workload.sources.base import SourceData, announce
from harness.workload.sources.files import MAX_TOKENS
from harness.workload.tiers import (
    Tier,
    TierMix,
    assign_tiers_at,
    default_tiers,
    parse_tier_mix,
    parse_tiers,
)
from harness.workload.trace import Trace, TraceError


def sampling_rng(seed: int | None) -> np.random.Generator:
    """Row-sampling stream ``[seed, 2]``."""
    return np.random.default_rng(None if seed is None else [seed, 2])


DEFAULT_NUM_REQUESTS = 1000
"""Requests drawn from a generated source when neither a count nor a duration is given
(``vllm bench serve --num-prompts`` defaults to the same)."""


def _sequential_ids(n: int) -> np.ndarray:
    """``"req-%06d" % i`` for i in 0 .. n-1 (Python strings), in Arrow's string kernels: a
    third of the Python loop's time at 100k rows."""
    digits = pc.utf8_lpad(pa.array(np.arange(n)).cast(pa.string()), width=6, padding="0")
    return pc.binary_join_element_wise("req-", digits, "").to_numpy(zero_copy_only=False)


def build_trace(
    source: str,
    *,
    num_requests: int | None = None,
    rate: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    time_scale: float = 1.0,
    duration_s: float | None = None,
    tiers: list[Tier] | str | None = None,
    seed: int = 0,
    rate_schedule: RateSchedule | str | None = None,
    tier_mix: TierMix | str | None = None,
    rescale: bool = False,
    sample: str = "shuffle",
    prompts: str | None = None,
    quiet: bool = False,
    **source_options: Any,
) -> Trace:
    """Build a replayable trace (see the module docstring for the rules).

    ``source``: ``lmsys``, ``sharegpt``, ``azure-conv``, ``synthetic`` or a file path
    (.parquet/.jsonl project format, .csv Vidur/Azure/BurstGPT, .jsonl Mooncake).
    ``rate``: req/s (``inf`` = all at t=0). ``arrival``: poisson, gamma, constant, trace;
    ``burstiness`` != 1 with poisson means gamma (vLLM semantics). ``time_scale`` multiplies
    the trace's own timestamps. ``duration_s``: keep arrivals in (0, duration]. ``rescale``:
    vLLM's pin-the-last-arrival-at-N/rate. ``source_options`` go to the source (e.g.
    ``path=``, ``tokenizer=``, ``filter=``).
    """
    if num_requests is not None and num_requests < 1:
        raise TraceError(f"num_requests must be >= 1, got {num_requests}")
    if duration_s is not None and not duration_s > 0:
        raise TraceError(f"duration must be > 0 s, got {duration_s}")
    if arrival not in PROCESSES:
        raise TraceError(f"unknown arrival process {arrival!r} (use {', '.join(PROCESSES)})")
    if not burstiness > 0:
        raise TraceError(f"burstiness must be > 0, got {burstiness}")
    if sample not in ("shuffle", "head"):
        raise TraceError(f"sample must be 'shuffle' or 'head', got {sample!r}")
    if rate is not None and not rate > 0:
        raise TraceError(f"rate must be > 0 req/s, got {rate}")
    if rate is not None and rate_schedule is not None:
        raise TraceError("give either a rate or a rate schedule, not both")

    src = load_source(source, source_options, seed=seed)
    notes = list(src.notes)
    if num_requests is None and duration_s is None and src.sampler is not None:
        # A generated source (length profile, synthetic) has no natural size: use vLLM bench
        # serve's --num-prompts default so `harness replay --trace lmsys --rate 50` just works.
        num_requests = DEFAULT_NUM_REQUESTS
        notes.append(
            f"{source}: {DEFAULT_NUM_REQUESTS} requests (the default; set num_requests or a "
            "duration to change it)"
        )
    if isinstance(tiers, str):
        tier_list = parse_tiers(tiers)
    elif tiers is not None:
        tier_list = list(tiers)
    else:
        tier_list = src.tiers or default_tiers()
    sched = parse_rate_schedule(rate_schedule) if isinstance(rate_schedule, str) else rate_schedule
    mix = parse_tier_mix(tier_mix, tier_list) if isinstance(tier_mix, str) else tier_mix

    if arrival == "trace" and (rate is not None or sched is not None):
        raise TraceError("arrival=trace replays the trace's own timestamps; drop the rate")
    own_time = arrival == "trace" or (rate is None and sched is None and src.has_timestamps)
    if own_time:
        if not src.has_timestamps:
            raise TraceError(f"{source}: the source has no timestamps; give a rate")
        rows, arr, more = _own_timestamps(src, num_requests, duration_s, time_scale, seed)
        arrival_desc = {"process": "trace", "time_scale": time_scale}
    else:
        if rate is None and sched is None:
            raise TraceError(
                f"{source}: the source has no timestamps; give a rate (req/s) or a rate schedule"
            )
        if time_scale != 1.0:
            raise TraceError(
                "time_scale applies to a trace's own timestamps; with a rate, "
                "change the rate instead"
            )
        process = "gamma" if (arrival == "poisson" and burstiness != 1.0) else arrival
        arr = _generated_arrivals(
            src, process, rate, sched, burstiness, num_requests, duration_s, seed, rescale
        )
        rows, more = _sample_rows(src, len(arr), sample, seed)
        arrival_desc = {
            "process": process,
            "rate": rate,
            "burstiness": burstiness,
            "rescale": rescale,
        }
        if sched is not None:
            arrival_desc["rate_schedule"] = sched.spec
        if src.has_timestamps:
            notes.append(f"{source}: the trace's own timestamps are replaced by {process} arrivals")
    notes.extend(more)
    if len(rows) == 0:
        raise TraceError(f"{source}: no requests left (check duration / num_requests)")

    df = pd.DataFrame(
        {
            "arrival_s": np.asarray(arr, dtype=float),
            "prompt_len": rows["prompt_len"].to_numpy(dtype=np.int64),
            "output_len": rows["output_len"].to_numpy(dtype=np.int64),
        }
    )
    for col in ("prompt_len", "output_len"):  # every source, not only files (issue 14)
        big = np.flatnonzero(df[col].to_numpy() > MAX_TOKENS)
        if big.size:
            raise TraceError(
                f"{source}: row {int(big[0])}: {col}={int(df[col].iloc[big[0]])} is above the "
                f"maximum of {MAX_TOKENS} tokens"
            )
    ids_kept = "request_id" in rows.columns and not rows["request_id"].duplicated().any()
    df["request_id"] = (
        rows["request_id"].astype(str).to_numpy() if ids_kept else _sequential_ids(len(df))
    )
    keep_tags = (
        "tier" in rows.columns
        and tiers is None
        and mix is None
        and set(rows["tier"]) <= {t.name for t in tier_list}
    )
    if keep_tags:
        df["tier"] = rows["tier"].astype(str).to_numpy()
    else:
        df["tier"] = assign_tiers_at(df["arrival_s"].to_numpy(), tier_list, mix, seed)
    df["prompt"] = rows["prompt"].to_numpy(dtype=object) if "prompt" in rows.columns else None
    if "hash_ids" in rows.columns:
        df["hash_ids"] = rows["hash_ids"].to_numpy(dtype=object)
    if prompts is not None:
        from harness.workload.prompts import fill_prompts

        df["prompt"] = fill_prompts(df, prompts, seed, block_tokens=src.meta.get("block_tokens"))

    meta: dict[str, Any] = {
        "source": source,
        **{k: v for k, v in src.meta.items() if k != "source"},
        "source_detail": src.meta.get("source"),
        "seed": seed,
        "num_requests": int(len(df)),
        "duration_s": duration_s,
        "arrival": arrival_desc,
        "sample": "time-order head" if own_time else sample,
        "tiers_spec": ",".join(_tier_str(t) for t in tier_list),
        "tier_mix": mix.spec if mix is not None else None,
        "prompts": prompts,
        "notes": notes,
    }
    meta.setdefault("fallback", False)
    if not quiet:
        for n in notes:
            announce(n)
    trace = Trace.from_frame(df, tier_list, meta)
    trace.meta["content_hash"] = trace.content_hash()
    return trace


def _tier_str(t: Tier) -> str:
    s = f"{t.name}:{t.share:g}"
    if t.ttft_slo_s is not None:
        s += f":ttft={t.ttft_slo_s:g}s"
    if t.tbt_slo_s is not None:
        s += f":tbt={t.tbt_slo_s:g}s"
    return s + f":priority={t.priority}"


def _own_timestamps(
    src: SourceData,
    n: int | None,
    duration_s: float | None,
    time_scale: float,
    seed: int | None,
) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    notes: list[str] = []
    if src.sampler is not None:
        # A generative source with timing (a profile with inter-arrival gaps).
        if n is not None:
            rows = src.sampler(n, sampling_rng(seed))
        elif duration_s is None:
            raise TraceError("a generated source needs num_requests or a duration")
        else:
            m = 256
            while True:  # draw more until the generated timing covers the duration
                rows = src.sampler(m, sampling_rng(seed))
                if float(rows["timestamp_s"].max() - rows["timestamp_s"].min()) > duration_s:
                    break
                if m > 50_000_000:
                    raise TraceError("duration too long for the generated source")
                m *= 2
        ts = rows["timestamp_s"].to_numpy(dtype=float)
        order = np.argsort(ts, kind="stable")
    else:
        rows = src.df
        ts = rows["timestamp_s"].to_numpy(dtype=float)
        order = np.argsort(ts, kind="stable")
    rows = rows.iloc[order].reset_index(drop=True)
    ts = ts[order]
    frozen = "arrival_s" in rows.columns  # project format: offsets already, never shifted
    if not time_scale > 0 or math.isinf(time_scale):
        raise TraceError(f"time_scale must be a finite number > 0, got {time_scale}")
    arr = ts * time_scale if frozen else trace_arrivals(ts, time_scale)
    if n is not None and n > len(rows):
        reps = math.ceil(n / len(rows))
        span = float(arr[-1] - arr[0]) if len(arr) else 0.0
        gap = span / (len(arr) - 1) if len(arr) > 1 else 1.0
        period = span + gap
        arr = np.concatenate([arr + k * period for k in range(reps)])[:n]
        rows = pd.concat([rows] * reps, ignore_index=True).iloc[:n]
        rows = rows.drop(columns=[c for c in ("request_id",) if c in rows.columns])
        notes.append(
            f"asked for {n} requests but the trace has {len(src.df)}: the trace is repeated "
            f"{reps} time(s), each copy shifted by {period:.3f} s"
        )
    elif n is not None:
        rows, arr = rows.iloc[:n], arr[:n]
    if duration_s is not None:
        keep = arr <= duration_s
        rows, arr = rows.loc[keep], arr[keep]
    return rows.reset_index(drop=True), arr, notes


def _generated_arrivals(
    src: SourceData,
    process: str,
    rate: float | None,
    sched: RateSchedule | None,
    burstiness: float,
    n: int | None,
    duration_s: float | None,
    seed: int | None,
    rescale: bool,
) -> np.ndarray:
    if n is None and duration_s is None:
        if src.sampler is not None:
            raise TraceError(
                f"source {src.meta.get('source')!r} is generated: give num_requests or a duration"
            )
        n = len(src.df)
    if sched is None:
        assert rate is not None
        if math.isinf(rate):
            if n is None:
                raise TraceError("rate=inf needs num_requests (a duration bound is meaningless)")
            return np.zeros(n)
        sched = RateSchedule.constant(rate)
        if n is not None and duration_s is None:
            return arrival_times(n, rate, process, burstiness, seed=seed, rescale=rescale)
    if rescale and (len(sched.rates) > 1 or sched.kind != "pwl" or duration_s is not None):
        raise TraceError("rescale applies to a constant rate with a request count only")
    if duration_s is None:
        return schedule_arrivals(sched, process, burstiness, seed=seed, n=n)
    arr = schedule_arrivals(sched, process, burstiness, seed=seed, duration_s=duration_s, limit=n)
    return arr


def _sample_rows(
    src: SourceData, n: int, sample: str, seed: int | None
) -> tuple[pd.DataFrame, list[str]]:
    rng = sampling_rng(seed)
    if src.sampler is not None:
        return src.sampler(n, rng).reset_index(drop=True), []
    total = len(src.df)
    base = rng.permutation(total) if sample == "shuffle" else np.arange(total)
    notes: list[str] = []
    if n <= total:
        idx = base[:n]
    else:
        extra = rng.choice(total, size=n - total, replace=True)
        idx = np.concatenate([base, extra])
        notes.append(
            f"asked for {n} requests but the source has {total} rows: every row is used once "
            f"and {n - total} more are drawn with replacement (oversampling)"
        )
    rows = src.df.iloc[idx].reset_index(drop=True)
    if n > total and "request_id" in rows.columns:
        rows = rows.drop(columns="request_id")
    return rows, notes


def save_trace(trace: Trace, path: Path | str) -> Path:
    """Freeze a trace as Parquet (arrivals, prompts, lengths, tiers; tiers + meta + content
    hash in the file metadata), so it replays identically against any target."""
    from harness.workload.frozen import write_parquet

    return write_parquet(trace, Path(path))
