"""Synthetic run directories with a known answer, for report tests, demos and benchmarks.

Why: the report, the stability analysis and the sweep must be checked on runs whose truth is
known in closed form, and on runs far larger than a test can simulate (100k requests, 30M
chunks). The model is a FCFS queue with ``slots`` servers (a batch of fixed width): request i
waits for a free slot, prefills in ``prefill_s_per_token · prompt_len``, then emits one token
every ``decode_s_per_token``. Its capacity is ``slots / E[service]`` requests per second
(:func:`synthetic_capacity_rps`), so runs below/above it are stable/unstable by construction.
Everything is vectorised except the slot assignment (a heap: O(n log slots)).
"""

from __future__ import annotations

import hashlib
import heapq
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from harness.results.rundir import RunWriter


def synthetic_capacity_rps(
    slots: int, mean_prompt: float, mean_output: float, prefill_s: float, decode_s: float
) -> float:
    """Requests/s the synthetic queue can serve: slots / (E[prefill] + E[decode])."""
    return slots / (mean_prompt * prefill_s + max(mean_output - 1.0, 0.0) * decode_s)


def write_synthetic_run(
    run_dir: Path | str,
    *,
    num_requests: int = 500,
    rate: float = 5.0,
    slots: int = 8,
    mean_prompt: float = 200.0,
    mean_output: float = 100.0,
    prefill_s_per_token: float = 2e-4,
    decode_s_per_token: float = 0.02,
    tokens_per_chunk: int = 1,
    fail_fraction: float = 0.0,
    error_text: str = "upstream error",
    model: str = "synthetic-model",
    policy: str = "fcfs",
    tiers: tuple[tuple[str, float, float, float], ...] = (
        ("paid", 0.1, 2.0, 0.1),
        ("free", 0.9, 10.0, 0.5),
    ),
    sample_interval_s: float = 0.25,
    seed: int = 0,
    extra_meta: dict[str, Any] | None = None,
    gpu_power_w: float | None = None,
) -> Path:
    """Write one synthetic run directory (all schema tables + run.json) and return its path.

    ``tiers``: (name, share, ttft_slo_s, tbt_slo_s). The same ``seed`` and ``num_requests``
    give the same request set at every ``rate`` (arrival gaps are scaled, not redrawn), so
    runs at several rates share a trace content hash only when the rate is also equal.
    """
    rng = np.random.default_rng(seed)
    n = int(num_requests)
    gaps = rng.exponential(1.0, n)
    target = np.cumsum(gaps) / rate
    target -= target[0]
    prompt = np.maximum(1, rng.lognormal(np.log(mean_prompt) - 0.125, 0.5, n).astype(np.int64))
    output = np.maximum(2, rng.geometric(1.0 / mean_output, n).astype(np.int64))
    names = np.array([t[0] for t in tiers], dtype=object)
    shares = np.array([t[1] for t in tiers], dtype=float)
    tier = names[rng.choice(len(tiers), size=n, p=shares / shares.sum())]
    lag = rng.exponential(2e-4, n)
    send = target + lag
    prefill = prompt * prefill_s_per_token
    decode = (output - 1) * decode_s_per_token

    start = np.empty(n)
    free_at = [0.0] * slots
    heapq.heapify(free_at)
    for i in range(n):  # FCFS: the next request takes the slot that frees first
        f = heapq.heappop(free_at)
        start[i] = max(send[i], f)
        heapq.heappush(free_at, start[i] + prefill[i] + decode[i])
    first = start + prefill
    last = first + decode

    failed = rng.random(n) < fail_fraction
    ok = ~failed
    n_chunks = np.where(ok, np.ceil(output / tokens_per_chunk).astype(np.int64), 0)
    chunk_first = first.copy()
    chunk_last = np.where(ok, last, np.nan)
    first_out = np.where(ok, chunk_first, np.nan)

    rid = [f"syn-{i}" for i in range(n)]
    req_tbl = pa.table(
        {
            "req": np.arange(n, dtype=np.int64),
            "request_id": rid,
            "tier": tier.astype(str),
            "prompt_len": prompt,
            "output_len": output,
            "prompt_tokens": prompt,
            "output_tokens": np.where(ok, output, 0),
            "target_s": target,
            "arrival_s": target + lag / 2,
            "send_s": send,
            "first_chunk_s": first_out,
            "last_chunk_s": chunk_last,
            "num_chunks": n_chunks,
            "success": ok,
            "error_kind": pa.array([None if o else "http_status" for o in ok], pa.string()),
            "error": pa.array([None if o else error_text for o in ok], pa.string()),
            "http_status": pa.array([200 if o else 500 for o in ok], pa.int64()),
        }
    )

    trace_hash = hashlib.sha256(
        np.concatenate([target, prompt.astype(float), output.astype(float)]).tobytes()
        + "".join(tier.astype(str)).encode()
    ).hexdigest()
    meta: dict[str, Any] = {
        "kind": "synthetic",
        "policy": policy,
        "model": model,
        "target": "synthetic",
        "cost_model": f"fcfs slots={slots} prefill={prefill_s_per_token}s/tok "
        f"decode={decode_s_per_token}s/tok",
        "seed": seed,
        "request_rate": rate,
        "num_requests": n,
        "t0_unix": 0.0,
        "trace": {"source": "synthetic", "content_hash": trace_hash, "num_requests": n},
        "tiers": [
            {"name": t[0], "share": t[1], "ttft_slo_s": t[2], "tbt_slo_s": t[3], "priority": k}
            for k, t in enumerate(tiers)
        ],
        "synthetic": {
            "slots": slots,
            "capacity_rps": synthetic_capacity_rps(
                slots,
                float(prompt.mean()),
                float(output.mean()),
                prefill_s_per_token,
                decode_s_per_token,
            ),
        },
    }
    meta.update(extra_meta or {})
    run_dir = Path(run_dir)
    with RunWriter(run_dir, meta, flush_rows=4_000_000, flush_interval_s=1e9) as w:
        w.add_requests_table(req_tbl)
        # chunks: request i emits n_chunks[i] chunks, the k-th at first + k·tpc·decode_s
        block = 2_000_000
        idx = np.flatnonzero(n_chunks)
        lo = 0
        while lo < len(idx):
            cum = np.cumsum(n_chunks[idx[lo:]])
            hi = lo + max(1, int(np.searchsorted(cum, block, side="right")))
            sel = idx[lo:hi]
            counts = n_chunks[sel]
            reqs = np.repeat(sel, counts)
            k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            t = np.minimum(
                chunk_first[reqs] + k * tokens_per_chunk * decode_s_per_token, chunk_last[reqs]
            )
            # jitter every chunk but the first and last, inside its own slot (order kept)
            inner = (k > 0) & (k < counts.repeat(counts) - 1)
            t[inner] -= rng.uniform(0, 0.4 * decode_s_per_token, int(inner.sum()))
            toks = np.minimum(tokens_per_chunk, output[reqs] - k * tokens_per_chunk)
            w.add_chunks_table(
                pa.table(
                    {
                        "req": reqs.astype(np.int64),
                        "t_s": t,
                        "tokens": toks.astype(np.int32),
                    }
                )
            )
            lo = hi
        # samples: engine gauges on a regular grid, plus one GPU
        grid = np.arange(0.0, float(np.nanmax(last)) + sample_interval_s, sample_interval_s)
        s_sorted, t_sorted, l_sorted = np.sort(send), np.sort(start), np.sort(last)
        waiting = np.searchsorted(s_sorted, grid, "right") - np.searchsorted(
            t_sorted, grid, "right"
        )
        running = np.searchsorted(t_sorted, grid, "right") - np.searchsorted(
            l_sorted, grid, "right"
        )
        kv = np.clip(running / slots, 0, 1)
        w.add_samples_table(
            pa.table(
                {
                    "t_s": grid,
                    "source": ["engine"] * len(grid),
                    "kv_usage": kv,
                    "kv_used_tokens": (kv * slots * (mean_prompt + mean_output)).astype(np.int64),
                    "num_waiting": waiting.astype(np.int64),
                    "num_running": running.astype(np.int64),
                    "preemptions_total": np.zeros(len(grid), dtype=np.int64),
                }
            )
        )
        w.add_samples_table(
            pa.table(
                {
                    "t_s": grid,
                    "source": ["gpu"] * len(grid),
                    "gpu_index": np.zeros(len(grid), dtype=np.int64),
                    "gpu_mem_used_mib": 20000.0 + 50000.0 * kv,
                    "gpu_mem_total_mib": np.full(len(grid), 81559.0),
                    "gpu_util_perc": 100.0 * (running > 0),
                    # NVML's counter: J since driver load; a constant draw when asked for
                    "gpu_energy_j": (
                        np.full(len(grid), np.nan)
                        if gpu_power_w is None
                        else 1.0e6 + gpu_power_w * grid
                    ),
                }
            )
        )
    return run_dir
