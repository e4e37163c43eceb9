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
    python benchmarks/bench_server.py --step-ms 5 --conc 20,40,80,120 --seconds 3
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
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", type=float, default=5.0, help="constant modeled step time")
    ap.add_argument("--conc", default="10,20,40,60,80,100,120,160", help="concurrency levels")
    ap.add_argument("--seconds", type=float, default=3.0, help="stream length per level")
    ap.add_argument("--budget-ms", type=float, default=2.0, help="p99 lateness budget")
    args = ap.parse_args()
    step = args.step_ms / 1000.0
    cost = f"a100-llama2-7b:base_s={step},per_token_s=0,floor_s=0,per_kv_s=0"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli.main",
            "serve",
            "--port",
            "0",
            "--cost-model",
            cost,
            "--policy",
            "vllm",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        m = re.search(r"(http://\S+)", line)
        if not m:
            sys.exit(f"server did not start: {line!r}")
        url = m.group(1)
        steps = max(10, int(args.seconds / step))
        rows = []
        for c in (int(x) for x in args.conc.split(",")):
            row = asyncio.run(run_level(url, c, steps, warm_steps=5))
            row["offered_tok_per_s"] = c / step
            rows.append(row)
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
        ok = [r for r in rows if r["server_emit_p99_ms"] <= args.budget_ms]
        best = max(ok, key=lambda r: r["tok_per_s"]) if ok else None
        print(
            f"highest streamed rate with server emit p99 <= {args.budget_ms} ms: "
            + (
                f"{best['tok_per_s']:.0f} tokens/s (C={best['conc']}, "
                f"client recv p99 {best['client_recv_p99_ms']:.2f} ms)"
                if best
                else "none"
            ),
            flush=True,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
