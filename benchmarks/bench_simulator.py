"""Simulator speed: simulated requests/s and steps/s per policy, near the preset's capacity.

Usage::

    python benchmarks/bench_simulator.py [--num-requests 100000] [--load 0.9]
        [--policies vllm,sarathi] [--cost-model a100-llama2-7b] [--write] [--out DIR]

1. Capacity: simulate 5,000 lmsys requests all arriving at once (overload) and take the
   completion rate as the capacity C (req/s) of the preset's engine (KV from the preset's GPU).
2. Build ``--num-requests`` requests of /work/shared/data/lmsys_sample_lengths.csv (Poisson,
   rate = load x C) and simulate each policy, timing the simulation alone (wall and CPU time;
   CPU time is what the run costs when the machine is shared) and, with ``--write``, the full
   run-directory write (requests, per-token chunks, samples) plus summary.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import SimulateConfig, simulate, write_run
from harness.policies import make_policy
from harness.shared_data import shared_data_dir
from harness.workload import build_trace

DATA = str(shared_data_dir() / "lmsys_sample_lengths.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.9, help="rate as a fraction of capacity")
    ap.add_argument("--policies", default="vllm,sarathi")
    ap.add_argument("--cost-model", default="a100-llama2-7b")
    ap.add_argument("--trace", default=DATA)
    ap.add_argument("--write", action="store_true", help="also time writing the run dirs")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = SimulateConfig(trace=args.trace, cost_model=args.cost_model)
    econf = cfg.engine_config()
    cost = get_cost_model(args.cost_model)
    probe = build_trace(
        args.trace, num_requests=5000, rate=float("inf"), seed=args.seed, quiet=True
    )
    res = simulate(probe, make_policy("vllm"), cost, econf)
    capacity = len(probe) / res.end_s
    rate = args.load * capacity
    print(
        f"cost model {args.cost_model}: KV {econf.capacity_tokens} tokens, budget "
        f"{econf.token_budget}, max_num_seqs {econf.max_num_seqs}; capacity ~{capacity:.1f} req/s"
        f" (vllm, overload probe); rate = {args.load} x capacity = {rate:.1f} req/s"
    )
    t0 = time.perf_counter()
    trace = build_trace(
        args.trace, num_requests=args.num_requests, rate=rate, seed=args.seed, quiet=True
    )
    print(f"built {len(trace)} requests in {time.perf_counter() - t0:.1f} s")

    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        w0, c0 = time.perf_counter(), time.process_time()
        r = simulate(trace, make_policy(name), cost, econf)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        n = len(trace)
        print(
            f"{name:>18} simulate only : {n / wall:9,.0f} req/s wall ({n / cpu:9,.0f} req/s CPU)"
            f"  {r.num_steps / cpu:9,.0f} steps/s CPU  steps={r.num_steps:,} "
            f"policy calls={r.num_calls:,} wall={wall:.2f}s cpu={cpu:.2f}s "
            f"tokens={int(r.out_tokens.sum()):,} kernel={r.counters.get('kernel', 'reference')}"
            f" preemptions={r.counters['preemptions_total']}"
        )
        if args.write:
            from harness.results.summary import write_summary

            out = args.out or Path(tempfile.mkdtemp(prefix="bench-sim-"))
            w0, c0 = time.perf_counter(), time.process_time()
            run_dir, r = write_run(
                out / f"bench-{name}", trace, make_policy(name), cost, econf, {"rate": rate}
            )
            wall_w, cpu_w = time.perf_counter() - w0, time.process_time() - c0
            write_summary(run_dir)
            wall_s, cpu_s = time.perf_counter() - w0, time.process_time() - c0
            print(
                f"{name:>18} + run dir      : {n / wall_w:9,.0f} req/s wall ({n / cpu_w:9,.0f} "
                f"req/s CPU)  wall={wall_w:.2f}s cpu={cpu_w:.2f}s; + summary.json: "
                f"wall={wall_s:.2f}s cpu={cpu_s:.2f}s -> {run_dir}"
            )


if __name__ == "__main__":
    main()
