"""Benchmark the results path at simulator scale: write a run with N requests and N*K chunk
rows through RunWriter (bulk tables, as the simulator does), merge on close, read it back and
compute the full summary (vLLM metrics, per tier, token TBT, own-p99 SLO attainment).

    python benchmarks/bench_results.py --requests 100000 --chunks-per-request 300

Prints the wall time of each phase and the peak RSS. Not a test: run by hand.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from harness.results.rundir import RunWriter, read_run
from harness.results.summary import compute_summary

TIERS = [
    {"name": "paid", "share": 0.05, "ttft_slo_s": 2.0, "tbt_slo_s": 0.1, "priority": 0},
    {"name": "free", "share": 0.95, "ttft_slo_s": 10.0, "tbt_slo_s": 0.5, "priority": 1},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--chunks-per-request", type=int, default=300)
    ap.add_argument("--batch-requests", type=int, default=5_000, help="requests per bulk add")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    n, k = args.requests, args.chunks_per_request
    rng = np.random.default_rng(0)
    send = np.cumsum(rng.exponential(0.01, n))
    tiers = np.where(rng.random(n) < 0.05, "paid", "free")
    base = Path(args.dir or tempfile.mkdtemp(prefix="bench_results_"))
    run_dir = base / "run"

    t0 = time.perf_counter()
    with RunWriter(run_dir, {"tiers": TIERS}) as w:
        w.add_requests_table(
            pa.table(
                {
                    "req": np.arange(n),
                    "request_id": [f"r{i}" for i in range(n)],
                    "tier": tiers,
                    "prompt_len": rng.integers(10, 2000, n),
                    "output_len": np.full(n, k),
                    "prompt_tokens": rng.integers(10, 2000, n),
                    "output_tokens": np.full(n, k),
                    "target_s": send,
                    "arrival_s": send,
                    "send_s": send,
                    "success": np.ones(n, dtype=bool),
                }
            )
        )
        for lo in range(0, n, args.batch_requests):
            hi = min(n, lo + args.batch_requests)
            m = hi - lo
            gaps = rng.exponential(0.03, (m, k))
            gaps[:, 0] += 0.2  # TTFT
            t = send[lo:hi, None] + np.cumsum(gaps, axis=1)
            w.add_chunks_table(
                pa.table(
                    {
                        "req": np.repeat(np.arange(lo, hi), k),
                        "t_s": t.ravel(),
                        "tokens": np.ones(m * k, dtype=np.int32),
                    }
                )
            )
    t_write = time.perf_counter() - t0

    t0, c0 = time.perf_counter(), time.process_time()
    run = read_run(run_dir)
    t_read, c_read = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    s = compute_summary(run, {"ttft": 500, "tpot": 50}, stability=False)
    t_sum, c_sum = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = sum(p.stat().st_size for p in run_dir.iterdir()) / 2**20
    print(f"requests={n:,} chunks={len(run.chunks):,} dir={run_dir} ({size:,.0f} MiB)")
    print(f"write+merge {t_write:6.2f} s wall")
    print(f"read_run    {t_read:6.2f} s wall {c_read:6.2f} s cpu")
    print(
        f"summary     {t_sum:6.2f} s wall {c_sum:6.2f} s cpu (process time: robust to contention)"
    )
    print(f"peak RSS {rss:,.0f} MiB; p99_itl_ms={s['p99_itl_ms']:.2f} completed={s['completed']}")


if __name__ == "__main__":
    main()
