"""Simulated sweep with and without Ray: same runs, wall time of each (issue 18).

Usage::

    python benchmarks/bench_ray_sweep.py [--requests 2000] [--num-cpus 2] [--repeats 3]

The sweep is issue 18's: policies vllm, sarathi, slai x rates 2, 4, 6, 8 req/s x seeds 0, 1, 2
(36 simulated runs of ``--requests`` synthetic requests each), one ``run_sweep`` per seed. It
runs serially in this process, then fanned out as Ray tasks on a local Ray instance started
with ``--num-cpus`` CPUs (the three sweeps driven from three threads, so all rate tasks are
queued at once). Ray's start-up is outside the timed part; its workers' first imports fall in
the first repeat (later repeats reuse the warm workers, as a long session of sweeps does).
Every Ray run's request and chunk tables are checked equal to the serial run's. Printed: wall
seconds per repeat, serial and Ray, and their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from harness.results.sweep import SweepConfig, run_sweep

POLICIES = ["vllm", "sarathi", "slai"]
RATES = [2.0, 4.0, 6.0, 8.0]
SEEDS = [0, 1, 2]


def sweep(root: Path, n: int, map_fn: Any = None) -> float:
    """The 36-run sweep under ``root``; wall seconds."""
    cfgs = [
        SweepConfig(
            rates=RATES,
            policies=POLICIES,
            base={"trace": "synthetic", "num_requests": n, "seed": seed},
            out_dir=root / f"s{seed}",
            report=False,
        )
        for seed in SEEDS
    ]
    t = time.perf_counter()
    if map_fn is None:
        for cfg in cfgs:
            run_sweep(cfg)
    else:
        with ThreadPoolExecutor(len(cfgs)) as ex:
            list(ex.map(lambda c: run_sweep(c, map_fn=map_fn), cfgs))
    return time.perf_counter() - t


def tables(root: Path) -> dict[tuple[int, str, float], tuple[Any, Any]]:
    """Every run's (requests, chunks) tables, keyed by (seed, policy, rate) from sweep.json."""
    out = {}
    for seed in SEEDS:
        data = json.loads((root / f"s{seed}" / "sweep.json").read_text())
        for p in data["runs"]:
            d = root / f"s{seed}" / p["run_dir"]
            out[(seed, p["policy"], p["rate"])] = (
                pq.read_table(d / "requests.parquet"),
                pq.read_table(d / "chunks.parquet"),
            )
    return out


def _same(a: dict[Any, tuple[Any, Any]], b: dict[Any, tuple[Any, Any]]) -> bool:
    return a.keys() == b.keys() and all(
        x.equals(y) for k in a for x, y in zip(a[k], b[k], strict=True)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per simulated run")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import ray

    from harness.distributed.pool import mapper

    print(
        f"36 runs x {a.requests} requests; load average {os.getloadavg()[0]:.2f}; "
        f"Ray local, {a.num_cpus} CPUs"
    )
    ray.init(address="local", num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
    serial: list[float] = []
    fanned: list[float] = []
    try:
        for i in range(a.repeats):
            with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
                s = sweep(Path(tmp) / "serial", a.requests)
                r = sweep(Path(tmp) / "ray", a.requests, mapper("auto"))
                same = _same(tables(Path(tmp) / "serial"), tables(Path(tmp) / "ray"))
            serial.append(s)
            fanned.append(r)
            print(f"repeat {i + 1}: serial {s:.2f} s, Ray {r:.2f} s, same runs: {same}")
            if not same:
                raise SystemExit("error: the Ray sweep's runs differ from the serial sweep's")
    finally:
        ray.shutdown()
    ms, mr = statistics.median(serial), statistics.median(fanned)
    print(f"median: serial {ms:.2f} s, Ray {mr:.2f} s, ratio {mr / ms:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
