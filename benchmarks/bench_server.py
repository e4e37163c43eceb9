"""How many tokens/s can the built-in server stream while staying on the modeled schedule?

Starts ``harness serve`` in a subprocess (so client and server do not share one event loop),
with a constant step time (a cost model with only ``base_s``), and opens C concurrent
streaming requests that all decode together: the offered token rate is C / step_time. For
each C it reports

- server emission lateness: chunk write time minus the step's modeled end
  (``/harness/stats`` ``emit_lateness``), and the step-end lateness of the loop itself;
- client receive lateness: receipt time minus the modeled end carried in each chunk
  (``"harness": {"debug_timing": true}``); both processes read CLOCK_MONOTONIC
  (``time.perf_counter``), so the difference is meaningful on one machine;

and the highest rate whose p99 emission lateness stays within the budget (default 2 ms).

    python benchmarks/bench_server.py                       # default sweep
    python benchmarks/bench_server.py --step-ms 2,5 --conc 10,20,40,80 --seconds 3
    python benchmarks/bench_server.py --fidelity --requests 400 --rate 40   # must-show (a)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time

import aiohttp
import numpy as np

T_RE = re.compile(rb'"harness_t_sched":([0-9.e+-]+)')


async def _one(session, url: str, max_tokens: int, late: list[float], counts: list[int]) -> None:
    body = {
        "prompt": "x",
        "max_tokens": max_tokens,
        "stream": True,
        "harness": {"debug_timing": True},
    }
    n = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for data in r.content.iter_any():
            t = time.perf_counter()
            for m in T_RE.finditer(data):
                late.append(t - float(m.group(1)))
                n += 1
    counts.append(n)


async def run_level(url: str, conc: int, steps: int, warm_steps: int) -> dict:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), read_bufsize=2**20
    ) as s:
        async with s.post(url + "/harness/stats/reset") as r:
            await r.read()
        async with s.get(url + "/harness/stats") as r:
            cpu0 = (await r.json())["cpu_s"]
        late: list[float] = []
        counts: list[int] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(s, url, steps, late, counts) for _ in range(conc)))
        wall = time.perf_counter() - t0
        async with s.get(url + "/harness/stats") as r:
            stats = await r.json()
    lat = np.array(late)
    # Skip the ramp (requests arriving over the first steps) for the client percentiles.
    lat = lat[conc * warm_steps :] if len(lat) > conc * warm_steps else lat
    return {
        "conc": conc,
        "tokens": int(sum(counts)),
        "tok_per_s": sum(counts) / wall,
        "server_emit_p50_ms": stats["emit_lateness"].get("p50_ms", float("nan")),
        "server_emit_p99_ms": stats["emit_lateness"].get("p99_ms", float("nan")),
        "server_emit_max_ms": stats["emit_lateness"].get("max_ms", float("nan")),
        "step_late_p99_ms": stats["step_lateness"].get("p99_ms", float("nan")),
        "client_recv_p50_ms": float(np.percentile(lat, 50) * 1e3),
        "client_recv_p99_ms": float(np.percentile(lat, 99) * 1e3),
        "resyncs": stats["resyncs"],
        "server_cpu_us_per_token": (stats["cpu_s"] - cpu0) / max(sum(counts), 1) * 1e6,
    }


def _start_server(step: float) -> tuple[subprocess.Popen, str]:
    cost = f"a100-llama2-7b:base_s={step},per_token_s=0,floor_s=0,per_kv_s=0"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "harness.cli.main", "serve", "--port", "0",
            "--cost-model", cost, "--policy", "vllm",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    m = re.search(r"(http://\S+)", line)
    if not m:
        proc.terminate()
        sys.exit(f"server did not start: {line!r}")
    return proc, m.group(1)


def machine_floor(seconds: float = 2.0, period: float = 0.005) -> dict[str, float]:
    """Lateness of a bare asyncio loop waking every ``period`` with the server's own
    sleep-then-yield method, and nothing else to do: the scheduling noise of this machine.
    No server can emit more punctually than this floor."""

    async def run() -> list[float]:
        now = time.perf_counter
        t = now()
        late = []
        for _ in range(int(seconds / period)):
            t += period
            d = t - now() - 1e-3
            if d > 0:
                await asyncio.sleep(d)
            while now() < t:
                await asyncio.sleep(0)
            late.append(now() - t)
        return late

    a = np.array(asyncio.run(run())) * 1e3
    return {
        "floor_p50_ms": float(np.percentile(a, 50)),
        "floor_p99_ms": float(np.percentile(a, 99)),
    }


def rate_sweep(args: argparse.Namespace) -> None:
    floor = machine_floor()
    print(
        f"machine floor (bare asyncio loop waking every 5 ms): p50 {floor['floor_p50_ms']:.2f} ms,"
        f" p99 {floor['floor_p99_ms']:.2f} ms",
        flush=True,
    )
    rows = []
    for step_ms in (float(x) for x in args.step_ms.split(",")):
        step = step_ms / 1000.0
        proc, url = _start_server(step)
        try:
            steps = max(10, int(args.seconds / step))
            for c in (int(x) for x in args.conc.split(",")):
                row = asyncio.run(run_level(url, c, steps, warm_steps=5))
                row["step_ms"] = step_ms
                row["offered_tok_per_s"] = c / step
                rows.append(row)
                print(
                    json.dumps(
                        {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                    ),
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    ok = [r for r in rows if r["server_emit_p99_ms"] <= args.budget_ms]
    best = max(ok, key=lambda r: r["tok_per_s"]) if ok else None
    if best is None:
        print(f"no level kept server emit p99 <= {args.budget_ms} ms", flush=True)
        return
    print(
        f"highest streamed rate with server emit p99 <= {args.budget_ms} ms: "
        f"{best['tok_per_s']:.0f} tokens/s (step {best['step_ms']} ms, C={best['conc']}; "
        f"server emit p99 {best['server_emit_p99_ms']:.2f} ms, "
        f"client recv p99 {best['client_recv_p99_ms']:.2f} ms)",
        flush=True,
    )


def fidelity(args: argparse.Namespace) -> None:
    """Same trace through the simulator and a replay against the server (server.fidelity)."""
    import tempfile
    from pathlib import Path

    from harness.server.fidelity import compare
    from harness.workload import build_trace

    trace = build_trace(
        args.trace, num_requests=args.requests, rate=args.rate, seed=args.seed,
        **({"input_len": 200, "output_len": 40, "range_ratio": 0.5}
           if args.trace == "synthetic" else {}),
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        res = asyncio.run(
            compare(
                trace, Path(tmp), policy=args.policy, cost_model=args.cost_model,
                kv_tokens=args.kv_tokens, speed=args.speed, separate_process=True,
            )
        )  # fmt: skip
    print(
        f"{'metric':<16}{'sim(nominal)':>13}{'sim(sent)':>11}{'sim(recv)':>11}{'replay':>9}"
        f"{'err(sent)':>11}{'err(recv)':>11}"
    )
    for k, ref in res["sim_realised"].items():
        if not k.endswith("_ms"):
            continue
        got = res["replay"][k]
        at = res["sim_server_arrivals"][k]
        print(
            f"{k:<16}{res['sim_nominal'][k]:>13.2f}{ref:>11.2f}{at:>11.2f}{got:>9.2f}"
            f"{100 * (got - ref) / ref:>10.1f}%{100 * (got - at) / at:>10.1f}%"
        )
    em = res["engine_match"]
    print(
        f"engine host alone (sim at the server's arrival stamps): {em['identical_share']:.1%} of "
        f"{em['requests']:.0f} requests identical, max |diff| {em['max_abs_diff_ms']:.3g} ms"
    )
    srv = res["server"]
    print(
        f"server step lateness p50/p99 {srv['step_lateness']['p50_ms']:.2f}/"
        f"{srv['step_lateness']['p99_ms']:.2f} ms, resyncs {srv['resyncs']}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", default="2,5", help="constant modeled step time(s), ms")
    ap.add_argument("--conc", default="10,20,40,60", help="concurrency levels")
    ap.add_argument("--seconds", type=float, default=3.0, help="stream length per level")
    ap.add_argument("--budget-ms", type=float, default=2.0, help="p99 lateness budget")
    ap.add_argument("--fidelity", action="store_true", help="run the sim-vs-replay comparison")
    ap.add_argument("--trace", default="synthetic", help="fidelity: trace source")
    ap.add_argument("--requests", type=int, default=400, help="fidelity: number of requests")
    ap.add_argument("--rate", type=float, default=40.0, help="fidelity: req/s (model time)")
    ap.add_argument("--seed", type=int, default=11, help="fidelity: trace seed")
    ap.add_argument("--policy", default="vllm", help="fidelity: policy")
    ap.add_argument("--cost-model", default="a100-llama2-7b", help="fidelity: cost model")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="fidelity: KV tokens")
    ap.add_argument("--speed", type=float, default=1.0, help="fidelity: server speed")
    args = ap.parse_args()
    if args.fidelity:
        fidelity(args)
    else:
        rate_sweep(args)


if __name__ == "__main__":
    main()
