"""summary.json: the exact ``vllm bench serve`` keys, per-tier SLO blocks and send fidelity.

Top-level keys (anchors-harness.md §6.2): ``completed, failed, duration, total_input_tokens,
total_output_tokens, request_throughput, request_goodput, output_throughput,
total_token_throughput, {mean,median,std,p50,p90,p95,p99,p99.9}_{ttft,tpot,itl,e2el}_ms,
max_output_tokens_per_s, max_concurrent_requests`` and vLLM's config echo (``date, backend,
endpoint_type, label, model_id, tokenizer_id, num_prompts, request_rate, burstiness,
max_concurrency``). Extras under our own names (§6.4): ``tbt_token_*_ms``,
``peak_output_tokens_per_s`` (tokens, not chunks), ``max_concurrent_requests_1s`` (vLLM
0.32.0's per-second-bucket variant; ``max_concurrent_requests`` is the exact sweep line of
§6.2), ``send_lag_{p50,p99,max}_ms``,
``achieved_request_rate``, ``offered_request_rate``, ``schedule_kept``, ``valid``,
``errors`` (failed requests by error kind), ``slo_attainment``, ``tiers.<name>``,
``server`` / ``gpu`` (from samples.parquet, :func:`metrics.server_stats`) and
``stability`` (from :mod:`harness.results.stability` when present).

Decisions (where the specs leave room):
- ``duration``: run.json ``duration_s`` when the producer recorded it (the replay: dispatch
  start → all requests done; the simulator: its virtual end), else the latest request end
  seen in the data (last chunk / send / release time), t0 = 0 on the run clock (§6.2).
- Per-tier blocks use the SAME global duration as denominator (§6.4).
- A request attains its tier's SLO when it succeeded, its TTFT <= the tier's TTFT SLO, and
  its own p99 ITL (np.percentile, linear) <= the tier's TBT SLO (a missing SLO is not
  checked). The p99 rather than the max, so that one stall in a 1000-token answer does not
  fail it; it matches the papers' "P99 TBT" framing (seed-rad-slai.md §6.3). Failed
  requests never attain. ``slo_attainment`` = attained / all requests of the tier.
- Tier-level ``ttft_slo_met`` / ``p99_itl_slo_met`` compare the tier's pooled p99 TTFT / p99
  ITL with its SLOs (null when the tier has no such SLO); ``goodput`` = attaining requests /
  duration, ``request_goodput`` = vLLM goodput (CLI ``--goodput`` SLOs) restricted to the tier.
- ``goodput=None`` falls back to run.json ``goodput`` (dict of ms) when the run recorded one.
- ``--warmup`` (run.json ``warmup``, :mod:`harness.results.warmup`): the excluded requests
  are left out of every metric and the duration starts at the first measured request's
  scheduled arrival; ``warmup`` says how many and until when. Stability uses every request.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime as _dt
import gc
import inspect
import json
import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.results import metrics as M
from harness.results import schema
from harness.results.chunklog import (
    ChunkArrays,
    bin_token_sums,
    dense_ids,
    group_rows,
    is_grouped,
    per_bin_chunks,
    positions,
    read_chunk_arrays,
)
from harness.results.rundir import Run, json_safe, read_run, write_json

VLLM_REFERENCE = "vllm/benchmarks/serve.py@009e6d4a (anchors-harness.md §6)"

_ECHO = {
    # vLLM key: run.json keys to try, in order
    "backend": ("backend", "engine"),
    "endpoint_type": ("endpoint_type", "endpoint", "dialect"),
    "label": ("label", "run_id"),
    "model_id": ("model_id", "model"),
    "tokenizer_id": ("tokenizer_id", "tokenizer", "model"),
    "request_rate": ("request_rate", "rate"),
    "burstiness": ("burstiness",),
    "max_concurrency": ("max_concurrency",),
}


def _lookup(meta: Mapping[str, Any], key: str) -> Any:
    """A run.json key at top level or one level down (``config``, ``trace``, ...)."""
    if key in meta:
        return meta[key]
    for v in meta.values():
        if isinstance(v, Mapping) and key in v:
            return v[key]
    return None


def tiers_from_meta(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Tier name -> {share, ttft_slo_s, tbt_slo_s, priority}: run.json ``tiers`` as a list of
    Tier dicts, a {name: dict} mapping, or a ``--tiers`` spec string."""
    raw = _lookup(meta, "tiers")
    if raw is None:
        return {}
    if isinstance(raw, str):
        from harness.workload.tiers import parse_tiers

        return {t.name: t.to_dict() for t in parse_tiers(raw)}
    if isinstance(raw, Mapping):
        return {str(k): dict(v, name=str(k)) for k, v in raw.items()}
    return {str(d["name"]): dict(d) for d in raw}


def _duration(run: Run, rm: pd.DataFrame, cv: M.ChunkView) -> float:
    d = _lookup(run.meta, "duration_s")
    if isinstance(d, int | float) and math.isfinite(d) and d > 0:
        return float(d)
    ends = rm["end_s"].to_numpy(dtype=np.float64)
    cands = [float(np.nanmax(ends))] if np.isfinite(ends).any() else []
    if cv.t.size:
        cands.append(float(cv.t.max()))
    return max([c for c in cands if math.isfinite(c)] + [0.0])


def _block(
    rm: pd.DataFrame,
    cv: M.ChunkView,
    itl: tuple[dict[str, float], float | None],
    mask: np.ndarray,
    duration: float,
    good: np.ndarray | None,
    peaks: dict[str | None, float] | None = None,
    tier: str | None = None,
) -> dict[str, Any]:
    """The vLLM keys over the requests in ``mask`` (§6.2 formulas); ``itl``: their ITL
    samples' statistics and largest sample (None: none) from :func:`_itl_stats`.
    ``peaks``: the chunk peaks per tier (None: the whole run) from :func:`_chunk_peaks`,
    when one-token chunks let the chunk times go before the blocks."""
    succ = rm["success"].to_numpy(dtype=bool) & mask
    completed = int(succ.sum())
    total_in = int(rm["prompt_tokens"].to_numpy()[succ].sum())
    total_out = int(rm["output_tokens"].to_numpy()[succ].sum())

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    out: dict[str, Any] = {
        "completed": completed,
        "failed": int(mask.sum()) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(completed),
        "request_goodput": None if good is None else per_s(float((good & mask).sum())),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
    }
    tp = rm["tpot_s"].to_numpy()[succ]
    values = {
        "ttft": rm["ttft_s"].to_numpy()[succ],
        "tpot": tp[np.isfinite(tp)],
        "e2el": rm["e2el_s"].to_numpy()[succ],
    }
    for name in M.LATENCY_METRICS:
        # the per-block copies may be reordered in place (percentiles)
        out.update(itl[0] if name == "itl" else M.latency_stats(values[name], name, True))
    sub_rm = rm[mask] if not mask.all() else rm
    if peaks is not None or cv.single_token():
        # one chunk per token: chunk and token peaks agree, and the token-normalised TBT
        # samples ARE the ITL samples
        out["max_output_tokens_per_s"] = (
            peaks[tier] if peaks is not None else _chunk_peak(rm, cv, mask)
        )
        out["max_concurrent_requests"] = M.max_concurrent_requests(sub_rm)
        out["max_concurrent_requests_1s"] = M.max_concurrent_requests_1s(sub_rm)
        itl_max = itl[1]
        out.update(
            peak_output_tokens_per_s=out["max_output_tokens_per_s"],
            tbt_token_mean_ms=out["mean_itl_ms"],
            tbt_token_p50_ms=out["p50_itl_ms"],
            tbt_token_p90_ms=out["p90_itl_ms"],
            tbt_token_p99_ms=out["p99_itl_ms"],
            tbt_token_max_ms=float(itl_max * 1000.0) if itl_max is not None else 0.0,
        )
    else:
        sub = _subview(cv, mask)
        out["max_output_tokens_per_s"] = M.max_output_tokens_per_s(sub, sub_rm)
        out["max_concurrent_requests"] = M.max_concurrent_requests(sub_rm)
        out["max_concurrent_requests_1s"] = M.max_concurrent_requests_1s(sub_rm)
        out["peak_output_tokens_per_s"] = M.peak_tokens_per_s(sub, sub_rm)
        out.update(M.tbt_token_stats(sub))  # several tokens a chunk: not the ITL samples
    return out


def _itl_stats(
    itl: np.ndarray, itl_tier: np.ndarray, names: list[str], spare: np.ndarray | None = None
) -> dict[str | None, tuple[dict[str, float], float | None]]:
    """ITL statistics (:func:`metrics.latency_stats`) and largest sample of the whole run
    (key None) and of each tier (``itl_tier``: the index in ``names`` of each sample's tier).
    ``itl`` is the last reader's: it is reordered and overwritten.

    Each tier's samples are copied in the pooled order (its mean and std sum in it) and
    partitioned in place for its percentiles. A tier holding every sample shares the run's
    figures (the same samples, same order). Memory: one buffer beside ``itl`` holds, in turn,
    each tier's copy (:func:`metrics.mean_std` makes the deviations a cache-sized piece at a
    time, so the copy is read, not overwritten, and made once), partitioned; the largest
    tier last, its partition beside the pool's (on a thread: numpy sorts without the GIL).
    ``spare``: a float64 buffer the caller no longer reads (the chunk times), that buffer
    when it is long enough (no fresh pages to fault in)."""
    m_all = [itl_tier == code for code in range(len(names))]
    counts = [int(np.count_nonzero(m)) for m in m_all]
    whole_tiers = {names[j] for j, k in enumerate(counts) if itl.size and k == itl.size}
    split = [j for j in range(len(names)) if names[j] not in whole_tiers]
    big = None
    if split and itl.size:
        usable = (
            spare is not None
            and spare.dtype == np.float64
            and spare.size >= itl.size
            and spare.flags.writeable
        )
        big = spare if usable else np.empty(itl.size)
    del spare
    whole_mean_std = M.mean_std(itl) if itl.size else None
    top = itl.max() if itl.size else None

    def pooled() -> dict[str, float]:
        return M.latency_stats(itl, "itl", overwrite=True, moments=whole_mean_std)

    out: dict[str | None, tuple[dict[str, float], float | None]] = {}
    split.sort(key=lambda j: counts[j])  # the largest last (beside the pool's partition)
    whole = None
    for i, j in enumerate(split):
        mask, m_all[j] = m_all[j], None  # type: ignore[call-overload]
        last = i == len(split) - 1
        if big is None or not counts[j]:  # no samples: numpy's figures of none
            sub = itl[mask]
            if last:
                whole = pooled()
            stats = M.latency_stats(sub, "itl")
        else:
            sub = M.masked_into(itl, mask, big)
            moments = M.mean_std(sub)
            if not last:
                stats = M.latency_stats(sub, "itl", overwrite=True, moments=moments)
            else:  # the pool is read for the last time: its partition beside this one
                with ThreadPoolExecutor(1, thread_name_prefix="summary") as pool_side:
                    pooled_stats = pool_side.submit(pooled)
                    stats = M.latency_stats(sub, "itl", overwrite=True, moments=moments)
                    whole = pooled_stats.result()
        del mask
        out[names[j]] = (stats, sub.max() if sub.size else None)
    del m_all
    out[None] = (pooled() if whole is None else whole, top)
    for name in whole_tiers:
        out[name] = out[None]
    return out


def _chunk_peak(rm: pd.DataFrame, cv: M.ChunkView, mask: np.ndarray) -> float:
    """vLLM's max_output_tokens_per_s over the requests in ``mask`` (one-token chunks: the
    subset's chunk times are counted in place)."""
    all_ = bool(mask.all())
    return M.max_output_tokens_per_s(cv, rm if all_ else rm[mask], None if all_ else mask)


def _chunk_peaks(
    rm: pd.DataFrame, cv: M.ChunkView, tier_masks: Mapping[str, np.ndarray]
) -> dict[str | None, float] | None:
    """With one-token chunks, the only chunk-time figure of every block (the whole run: key
    None, and each tier): computed first, so the times can be dropped before the ITL
    statistics copy their samples. None with multi-token chunks (the blocks read the view).

    One pass over the chunk times less: when every request with chunks has a tier and the
    largest tier's bucket origin is the run's, its buckets are the run's minus the other
    tiers' counted from that origin (whole counts: exact), and the other tiers' times are
    taken out once for both their origins."""
    if not cv.single_token():
        return None
    t0_all, whole = M.output_buckets(cv, rm)
    peaks: dict[str | None, float] = {None: float(whole.max()) if whole.size else 0.0}
    names = list(tier_masks)
    with_chunks = cv.end > cv.start
    covered = bool(names) and bool(
        np.all(np.logical_or.reduce([tier_masks[x] for x in names]) | ~with_chunks)
    )
    big = max(names, key=lambda x: int(tier_masks[x].sum())) if covered else None
    rest = whole.copy() if big is not None else None
    for name in names:
        if name == big:
            continue
        m = tier_masks[name]
        if rest is None:
            peaks[name] = _chunk_peak(rm, cv, m)
            continue
        times = [M.stretch_times(cv, m)]  # cv: request_metrics' (group_chunks') view
        t0 = M.bucket_origin(cv, rm[m], m)
        own = np.zeros(0, dtype=np.int64) if t0 is None else M.bucket_counts(cv, t0, m, times)
        peaks[name] = float(own.max()) if own.size else 0.0
        if t0_all is not None:
            at_all = own if t0 == t0_all else M.bucket_counts(cv, t0_all, m, times)
            rest[: at_all.size] -= at_all
    if big is not None:
        m = tier_masks[big]
        t0_big = M.bucket_origin(cv, rm if m.all() else rm[m], m)
        if t0_big is not None and t0_big == t0_all:
            peaks[big] = float(rest.max()) if rest.size else 0.0
        else:  # another origin: its own pass
            peaks[big] = _chunk_peak(rm, cv, m)
    return {k: peaks[k] for k in [None, *names]}


def _subview(cv: M.ChunkView, mask: np.ndarray) -> M.ChunkView:
    """The chunks of the requests in ``mask`` (multi-token chunks; one-token ones are counted
    in place by ``_block``)."""
    if mask.all() or cv.t.size == 0:
        return cv
    keep = mask[cv.grp]
    return M.ChunkView(cv.t[keep], cv.tokens[keep], cv.grp[keep], cv.start, cv.end)


@dataclass
class SloMasks:
    """Per request (rows of ``request_metrics``): tier masks and whether each SLO was met."""

    names: list[str]
    masks: dict[str, np.ndarray]
    success: np.ndarray
    ttft_ok: np.ndarray
    tbt_ok: np.ndarray
    attained: np.ndarray  # success and both SLOs of its tier (module docstring)
    has_slo: np.ndarray  # its tier has at least one SLO


def tier_masks(
    rm: pd.DataFrame, tiers_meta: Mapping[str, Mapping[str, Any]]
) -> tuple[list[str], dict[str, np.ndarray]]:
    """The tiers (run.json's, then any other the requests name, sorted) and which requests
    (rows of ``rm``) each holds."""
    tier_col = rm["tier"].to_numpy(dtype=object)
    # the distinct values first (one hashing pass): a Python loop over 100k rows took 30 ms
    names = list(tiers_meta) + sorted(
        {str(t) for t in pd.unique(tier_col) if t is not None and str(t) not in tiers_meta}
    )
    return names, {name: tier_col == name for name in names}


def slo_masks(
    rm: pd.DataFrame,
    cv: M.ChunkView,
    tiers_meta: Mapping[str, Mapping[str, Any]],
    itl: tuple[np.ndarray, np.ndarray] | M.ItlRuns | None = None,
) -> SloMasks:
    """Which requests attained their tier's SLOs (the rule in the module docstring); shared
    by summary.json and the report's confidence intervals so both count the same way."""
    n = len(rm)
    names, masks = tier_masks(rm, tiers_meta)
    ttft_slo = np.full(n, np.nan)
    tbt_slo = np.full(n, np.nan)
    for name in names:
        m = masks[name]
        tm = tiers_meta.get(name, {})
        if tm.get("ttft_slo_s") is not None:
            ttft_slo[m] = float(tm["ttft_slo_s"])
        if tm.get("tbt_slo_s") is not None:
            tbt_slo[m] = float(tm["tbt_slo_s"])
    succ = rm["success"].to_numpy(dtype=bool)
    ttft_ok = ~np.isfinite(ttft_slo) | (
        np.nan_to_num(rm["ttft_s"].to_numpy(dtype=float), nan=np.inf) <= ttft_slo
    )
    tbt_ok = M.itl_p99_within(cv, n, tbt_slo, itl=itl)
    has_slo = np.isfinite(ttft_slo) | np.isfinite(tbt_slo)
    return SloMasks(names, masks, succ, ttft_ok, tbt_ok, succ & ttft_ok & tbt_ok, has_slo)


def compute_summary(
    run: Run,
    goodput: Mapping[str, float] | None = None,
    *,
    send_lag_threshold_ms: float | None = None,
    stability: bool = True,
    chunks: ChunkArrays | None = None,
) -> dict[str, Any]:
    """All summary keys for ``run`` (see the module docstring). ``goodput``: vLLM-style SLOs
    in ms, e.g. ``{"ttft": 200, "tpot": 50}`` (:func:`metrics.parse_goodput` parses the CLI
    form). ``chunks``: the run's chunk log as compact columns (:func:`write_summary` reads it
    so, instead of ``run.chunks``); it is reordered in place and may be dropped meanwhile."""
    meta = run.meta
    if goodput is None:
        g = _lookup(meta, "goodput")
        goodput = dict(g) if isinstance(g, Mapping) and g else None
    if goodput:
        bad = set(goodput) - set(M.GOODPUT_KEYS)
        if bad:
            raise ValueError(f"unknown goodput metric(s) {sorted(bad)}: use ttft, tpot, e2el")
    if send_lag_threshold_ms is None:
        t = _lookup(meta, "send_lag_threshold_ms")
        send_lag_threshold_ms = float(t) if t is not None else M.DEFAULT_SEND_LAG_THRESHOLD_MS

    from harness.results.warmup import without_warmup

    full_run = run
    if chunks is None:
        chunks = ChunkArrays.from_frame(run.chunks)
        run = dataclasses.replace(run, chunks=run.chunks.iloc[:0])  # the metrics read ``chunks``
    owned = chunks.owned  # ours to write over (read from the files), not views of run.chunks
    run, warm = without_warmup(run)  # --warmup: the first requests are not measured
    grid = _stability_grid(full_run) if stability else None
    # the stability's chunk tokens per bin, from the log's time-ordered stretches as written
    # (before the grouping below makes one stretch per request)
    bins = None if grid is None else bin_token_sums(chunks, grid)
    _group_for_both(full_run, run, chunks)
    stab = _stability(full_run, chunks, grid, bins) if stability else None
    rm, cv = M.request_metrics(run.requests, chunks)
    chunks.release()  # the view holds what the metrics need; the rest may go (memory, issue 13)
    duration = _duration(run, rm, cv)
    tiers_meta = tiers_from_meta(meta)
    peaks = _chunk_peaks(rm, cv, tier_masks(rm, tiers_meta)[1])
    runs = cv.itl_runs()  # the samples with their requests as runs (memory: its peak)
    spare = None
    if peaks is not None:  # every later read of the chunk times is done: let them go (memory)
        if owned:  # ... into the ITL statistics' scratch (more rows than samples)
            spare = cv.t
        cv = M.ChunkView(
            np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), cv.start, cv.end
        )
    sm = slo_masks(rm, cv, tiers_meta, itl=runs)
    # from here the ITL samples are only split by tier: one byte a sample (memory, issue 13)
    tier_code = np.full(len(rm), -1, dtype=np.int8 if len(sm.names) < 127 else np.int32)
    for code, name in enumerate(sm.names):
        tier_code[sm.masks[name]] = code
    itl, itl_tier = runs.gaps, runs.sample_values(tier_code)
    del runs
    if warm and warm["excluded"] and len(run.requests):
        # the measured window starts at the first measured request's scheduled arrival
        t_first = float(np.nanmin(run.requests["target_s"].to_numpy(dtype=float)))
        if math.isfinite(t_first) and duration > t_first:
            duration -= t_first
    good = M.good_mask(rm, goodput)
    n = len(rm)
    everyone = np.ones(n, dtype=bool)

    created = meta.get("created_unix")
    date = (
        _dt.datetime.fromtimestamp(created, _dt.UTC).strftime("%Y%m%d-%H%M%S")
        if isinstance(created, int | float)
        else None
    )
    out: dict[str, Any] = {"date": date}
    for key, cands in _ECHO.items():
        out[key] = next((v for c in cands if (v := _lookup(meta, c)) is not None), None)
    if out["request_rate"] is None:
        # vLLM echoes "inf" (everything at t=0); we never send that way: a missing rate means
        # the trace's own timestamps.
        out["request_rate"] = "trace" if _lookup(meta, "arrival") == "trace" else None
    num = _lookup(meta, "num_requests")
    out["num_prompts"] = int(num) if isinstance(num, int | float) else n
    out["run_id"] = meta.get("run_id", run.dir.name)
    out["status"] = run.status
    out["policy"] = _lookup(meta, "policy")
    out["duration"] = duration
    out["goodput_slos_ms"] = dict(goodput) if goodput else None
    out["warmup"] = warm
    itl_by = _itl_stats(itl, itl_tier, sm.names, spare)
    del itl, itl_tier, spare  # sorted or split by tier: only the statistics are read from here
    out.update(_block(rm, cv, itl_by[None], everyone, duration, good, peaks))

    # Failures by error kind.
    failed = ~rm["success"].to_numpy(dtype=bool)
    kinds = pd.Series(rm["error_kind"].to_numpy()[failed], dtype=object).fillna("unknown")
    out["errors"] = {str(k): int(v) for k, v in kinds.value_counts().sort_index().items()}

    # Send fidelity (§6.4) and validity.
    out.update(M.send_fidelity(run.requests, send_lag_threshold_ms))
    reasons = []
    if not out["schedule_kept"]:
        reasons.append(
            f"send lag p99 {out['send_lag_p99_ms']:.1f} ms > {send_lag_threshold_ms:g} ms: "
            "the load generator did not keep its schedule"
        )
    out["valid"] = not reasons
    out["invalid_reasons"] = reasons

    # Per tier.
    names, masks = sm.names, sm.masks
    succ, ttft_ok, tbt_ok = sm.success, sm.ttft_ok, sm.tbt_ok
    attained, has_slo = sm.attained, sm.has_slo
    # Requests cancelled by the run's end (Ctrl-C, SIGTERM, --duration's drain) never had the
    # chance to attain: counted apart (``cancelled``), not as SLO misses (issue 14, point 6).
    cancelled = rm["error_kind"].to_numpy(dtype=object) == schema.ERROR_CANCELLED
    out["cancelled"] = int(cancelled.sum())
    has_slo = has_slo & ~cancelled
    out["slo_attainment"] = float(attained[has_slo].mean()) if has_slo.any() else None

    tiers_out: dict[str, Any] = {}
    for name in names:
        m = masks[name]
        tm = tiers_meta.get(name, {})
        blk = _block(rm, cv, itl_by[name], m, duration, good, peaks, name)
        cnt = int(m.sum())
        t_slo, b_slo = tm.get("ttft_slo_s"), tm.get("tbt_slo_s")
        blk_head = {
            "num_requests": cnt,
            "share": tm.get("share"),
            "priority": tm.get("priority"),
            "ttft_slo_ms": None if t_slo is None else float(t_slo) * 1000.0,
            "tbt_slo_ms": None if b_slo is None else float(b_slo) * 1000.0,
        }
        judged = m & ~cancelled
        if judged.any() and (t_slo is not None or b_slo is not None):
            blk_head["slo_attainment"] = float(attained[judged].mean())
            blk_head["goodput"] = float(attained[m].sum()) / duration if duration > 0 else 0.0
        else:
            blk_head["slo_attainment"] = None
            blk_head["goodput"] = None
        blk_head["ttft_slo_attainment"] = (
            float((succ & ttft_ok)[m].mean()) if cnt and t_slo is not None else None
        )
        blk_head["tbt_slo_attainment"] = (
            float((succ & tbt_ok)[m].mean()) if cnt and b_slo is not None else None
        )
        has_done = blk["completed"] > 0
        blk_head["ttft_slo_met"] = (
            None
            if t_slo is None or not cnt
            else bool(has_done and blk["p99_ttft_ms"] <= float(t_slo) * 1000.0)
        )
        blk_head["p99_itl_slo_met"] = (
            None
            if b_slo is None or not cnt
            else bool(has_done and blk["p99_itl_ms"] <= float(b_slo) * 1000.0)
        )
        tiers_out[name] = {**blk_head, **blk}
    out["tiers"] = tiers_out

    out.update(M.server_stats(run.samples))
    energy = _energy(run, rm, sm, duration)
    if energy is not None:  # only with NVML energy readings (a GPU): absent otherwise
        out["energy"] = energy
    if stability:
        out["stability"] = stab  # its own MSER warm-up cut, every request
    out["metrics_reference"] = VLLM_REFERENCE
    return json_safe(out)


def _energy(run: Run, rm: pd.DataFrame, sm: SloMasks, duration: float) -> dict | None:
    """Energy over the measured window and per token, overall and per tier
    (:mod:`harness.results.energy`)."""
    from harness.results.energy import per_token, run_energy

    t0 = 0.0
    from harness.results.warmup import spec_of

    if len(run.requests) and spec_of(run.meta):
        t0 = float(np.nanmin(run.requests["target_s"].to_numpy(dtype=float)))
    e = run_energy(run.samples, t0, t0 + duration if duration > 0 else math.inf)
    if e is None:
        return None
    e.update(
        per_token(
            e,
            sm.masks,
            sm.success,
            sm.attained,
            rm["prompt_tokens"].to_numpy(),
            rm["output_tokens"].to_numpy(),
        )
    )
    return e


def _group_for_both(full: Run, measured: Run, chunks: ChunkArrays) -> None:
    """Group ``chunks`` by request in place, once, for both readers: the metrics (rows of the
    measured requests that succeeded) and the stability token backlog (every row).

    The metrics' :func:`metrics.group_chunks` then finds its rows grouped and keeps them as
    they are, the same order it would have made (a stable sort by (request, time) of a subset
    is that subset of the sorted whole), so every pooled statistic sums in the same order.
    Except when only rows the metrics drop break the grouping (a failed request's chunks
    split around others'): group_chunks would keep the file order there, so the log stays.
    """
    ids = full.requests["req"].to_numpy(dtype=np.int64)
    # ids 0..n-1 in order (a simulation: the trace rows) and every chunk's id among them:
    # each id is its own position, so the ids serve as positions as they are (no 15M-row
    # table look-up; the same values as :func:`chunklog.positions`)
    dense = chunks.req.size > 0 and dense_ids(ids, chunks.req)
    pos = chunks.req if dense else positions(chunks.req, ids)
    if is_grouped(pos, chunks.t):
        chunks.grouped = True
        return
    measured_at = positions(measured.requests["req"].to_numpy(dtype=np.int64), ids)
    keep = np.zeros(ids.size, dtype=bool)
    known = measured_at >= 0
    keep[measured_at[known]] = M.success_flag(measured.requests)[known]
    if not (dense and keep.all()):  # else every row is kept: ``sel`` would be all True
        sel = pos >= 0
        sel &= keep[np.where(sel, pos, 0)]
        if not sel.all() and is_grouped(pos[sel], chunks.t[sel]):
            return
        del sel
    if pos.min() >= 0 and bool(np.all(ids[1:] > ids[:-1])):
        # every row's request known and the requests in id order (a simulation): the ids sort
        # like the positions, so sort by them (the sorted ids are rebuilt from the counts)
        del pos
        group_rows(chunks)
    else:
        group_rows(chunks, pos)


def _stability_grid(run: Run) -> np.ndarray | None:
    """The grid the stability analysis samples its backlogs on (None: no analysis module,
    or no requests)."""
    try:
        from harness.results.stability import analyze_stability, backlog_series
    except ImportError:
        return None
    if not len(run.requests):
        return None
    grid_points = inspect.signature(analyze_stability).parameters["grid_points"].default
    return backlog_series(run.requests, grid_points).t


def _stability(
    run: Run, chunks: ChunkArrays, grid: np.ndarray | None, bins: np.ndarray | None
) -> dict[str, Any] | None:
    """The stability verdict from engineer G's module when it is installed (design.md).

    Its token backlog reads the chunk log only through per-request and per-grid-bin token
    sums, so it gets them (:class:`stability.ChunkTotals`, ``bins`` from
    :func:`chunklog.bin_token_sums` on its ``grid``), else :func:`chunklog.per_bin_chunks`
    (the same numbers from ~1M rows instead of one per token)."""
    try:
        from harness.results.stability import analyze_stability
    except ImportError:
        return None
    try:
        if grid is not None:
            totals = _chunk_totals(run, chunks, bins)
            small = per_bin_chunks(chunks, grid) if totals is None else totals
            run = dataclasses.replace(run, chunks=small)
        return dict(analyze_stability(run))
    except Exception as e:  # a stability bug must not lose the vLLM metrics; say so in-band
        return {"verdict": "error", "error": f"{type(e).__name__}: {e}"[:300]}


def _chunk_totals(run: Run, chunks: ChunkArrays, bins: np.ndarray | None) -> Any:
    """The stability's :class:`ChunkTotals` from the grouped log and its per-bin sums, when
    they are the numbers its token backlog would sum from the rows: every row's request in
    the frame with a known arrival. None otherwise (or without ``bins``)."""
    from harness.results.stability import ChunkTotals, numeric_column

    req = run.requests
    if bins is None or np.isnan(numeric_column(req, "target_s")).any():
        return None
    n = len(req)
    ids = req["req"].to_numpy(dtype=np.int64)
    counts = chunks.id_counts  # rows per id 0..max id (the grouping's counting sort)
    if chunks.tokens is None and counts is not None and counts.size <= n and dense_ids(ids):
        per_request = np.zeros(n)
        per_request[: counts.size] = counts  # ids are positions; rows are tokens
    else:
        pos = positions(chunks.req, ids)
        if pos.size and int(pos.min()) < 0:
            return None
        per_request = np.bincount(pos, weights=chunks.tokens, minlength=n).astype(np.float64)
    return ChunkTotals(per_request, bins.astype(np.float64), len(chunks))


def release_freed_memory() -> None:
    """Give back to the OS what the run's producer freed before the summary reads the run
    (the summary's peak adds to what the process still holds): Arrow's pooled pages (the run
    writer's), reference cycles, and the C heap's free pages (glibc keeps them otherwise; a
    100k-request simulation on Azure-conversation lengths: ~170 MB of peak RSS)."""
    pa.default_memory_pool().release_unused()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# The samples' columns the summary reads (metrics.server_stats, the stability's engine queue,
# energy.run_energy): a simulation's table has one row a step (1.1M for RAD on 100k Azure
# conversations), and its other columns cost ~90 MB of the summary's peak as a frame; the
# GPU columns (all null in a simulation) only when the run has NVML rows.
_SERVER_COLUMNS = (
    "t_s",
    "source",
    "kv_usage",
    "num_waiting",
    "num_running",
    "preemptions_total",
)
_GPU_COLUMNS = (
    "gpu_index",
    "gpu_mem_used_mib",
    "gpu_mem_total_mib",
    "gpu_util_perc",
    "gpu_energy_j",
)


def write_summary(
    run_dir: Path | str,
    goodput: Mapping[str, float] | None = None,
    *,
    send_lag_threshold_ms: float | None = None,
) -> dict[str, Any]:
    """Read the run, compute its summary and write ``summary.json`` atomically. The chunk log
    is read as compact columns (:mod:`harness.results.chunklog`), not as a frame: a 100k-request
    simulation has ~15-20M chunk rows."""
    release_freed_memory()
    run = read_run(run_dir, chunks=False, samples=_SERVER_COLUMNS)
    if (run.samples["source"] == "gpu").any():  # NVML's rows: their columns too
        gpu = read_run(run_dir, requests=False, chunks=False, samples=_GPU_COLUMNS).samples
        run = dataclasses.replace(run, samples=pd.concat([run.samples, gpu], axis=1))
    summary = compute_summary(
        run,
        goodput,
        send_lag_threshold_ms=send_lag_threshold_ms,
        chunks=read_chunk_arrays(run_dir),
    )
    write_json(Path(run_dir) / schema.SUMMARY_JSON, summary)
    return summary


def apply_warmup(run_dir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Record ``spec`` in run.json and rewrite summary.json with it applied."""
    path = Path(run_dir) / schema.RUN_JSON
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["warmup"] = dict(spec)
    write_json(path, meta)
    return write_summary(run_dir)
