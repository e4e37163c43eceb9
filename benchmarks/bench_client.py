"""Benchmark the load generator against a fast local SSE server in a separate process.

    python benchmarks/bench_client.py [--rates 100,400,1000,2000] [--duration 5]
        [--output-len 100] [--no-accuracy] [--workers 1,2,auto] [--loop uvloop|asyncio]
        [--accuracy-rate 400]
        [--vllm-python .venv-vllm/bin/python --tokenizer .cache/tiny-llama]

Same as ``harness bench-client``; the work lives in :mod:`harness.loadgen.bench`. Set
``HARNESS_HTTP_CLIENT=aiohttp`` to measure the aiohttp path instead of the lean HTTP client.
"""

from __future__ import annotations

import argparse

from harness.loadgen.bench import main, parse_workers

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,400,1000,2000")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm installed")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer dir for vllm bench")
    ap.add_argument("--workers", default="1", help="worker settings, e.g. 1,2,auto")
    ap.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"],
                    help="event loop of the in-process (workers=1) client")  # fmt: skip
    ap.add_argument("--accuracy-rate", type=float, default=100.0)
    a = ap.parse_args()
    main(
        [float(x) for x in a.rates.split(",")],
        a.duration,
        a.output_len,
        not a.no_accuracy,
        a.vllm_python,
        a.tokenizer,
        parse_workers(a.workers),
        a.loop,
        a.accuracy_rate,
    )
