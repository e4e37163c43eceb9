"""Cluster simulator speed: whole ``harness simulate --replicas N`` processes (issue 16).

Usage::

    python benchmarks/bench_cluster.py [--calls 100000] [--replicas 8] [--load 0.9]
        [--cases rr,lot,sa,pa,sessions] [--lot-calls N] [--session-calls 20000] [--json OUT]

Cases (LMSYS sample lengths, /work/shared/data/lmsys_sample_lengths.csv; Poisson arrivals at
``load`` x the cluster's capacity, capacity = replicas x one engine's saturated throughput,
benchmarks/bench_simulator.py's definition):

- ``rr``: ``--calls`` plain calls, round-robin. A load-blind router decomposes the cluster,
  so each engine runs alone on the vectorised kernel (harness/engine/cluster_split.py);
- ``lot``, ``sa``, ``pa``: ``--lot-calls`` plain calls (default ``--calls``) with
  least-outstanding-tokens, session-affinity, prefix-aware: load-aware routers, so the event
  loop runs, over array engines for a plain trace (harness/engine/cluster_fast.py);
- ``sessions``: multi-turn conversations (synthetic-conv, 4 turns on average, history in
  the prompt, think time exp:1 s) with session-affinity routing and prefix caching, at a
  session rate giving ``load`` x capacity in calls/s (prompts grow with history, so the
  token load is higher than the plain cases').

Per row: wall seconds of the whole child process (import, trace, simulate, run directory,
summary.json), calls/s = calls / wall, peak RSS (``wait4``), and the run's stability verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_simulator import HARNESS, LMSYS, capacity  # noqa: E402

from harness.engine.costmodel import DEFAULT_COST_MODEL  # noqa: E402


def child(args: list[str], timeout: float) -> dict[str, Any]:
    """``harness simulate ARGS --no-report`` in a child: wall s, peak RSS MiB, verdict."""
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as out:
        cmd = [HARNESS, "simulate", *args, "--no-report", "--out", out]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while True:
            pid, st, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                p.kill()
                os.wait4(p.pid, 0)
                return {"wall_s": None, "error": "timeout"}
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        row: dict[str, Any] = {"wall_s": wall, "rss_mib": ru.ru_maxrss / 1024}
        if os.waitstatus_to_exitcode(st) != 0:
            err = p.stderr.read().decode(errors="replace").splitlines() if p.stderr else []
            row["error"] = err[-1] if err else "failed"
            return row
        for s in Path(out).glob("*/summary.json"):
            summary = json.loads(s.read_text())
            row["verdict"] = (summary.get("stability") or {}).get("verdict")
            row["calls"] = int(summary.get("completed", 0)) + int(summary.get("failed", 0))
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--lot-calls", type=int, default=None, help="default: --calls")
    ap.add_argument("--session-calls", type=int, default=20_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--cases", default="rr,lot,sa,pa,sessions")
    ap.add_argument("--cost-model", default=DEFAULT_COST_MODEL)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    cap = capacity(LMSYS, "vllm", a.cost_model)
    rate = a.load * a.replicas * cap
    base = ["--cost-model", a.cost_model, "--replicas", str(a.replicas)]
    lot_calls = a.calls if a.lot_calls is None else a.lot_calls

    def plain(calls: int, router: str) -> tuple[int, list[str]]:
        args = ["--trace", LMSYS, "--rate", f"{rate:.3f}", "--num-requests", str(calls)]
        return calls, [*args, "--router", router]

    cases: dict[str, tuple[int, list[str]]] = {
        "rr": plain(a.calls, "round-robin"),
        "lot": plain(lot_calls, "least-outstanding-tokens"),
        "sa": plain(lot_calls, "session-affinity"),
        "pa": plain(lot_calls, "prefix-aware"),
        "sessions": (
            a.session_calls,
            [
                "--trace",
                "synthetic-conv",
                "--num-sessions",
                str(a.session_calls // 4),
                "--session-rate",
                f"{rate / 4:.3f}",
                "--think-time",
                "exp:1",
                "--router",
                "session-affinity",
            ],
        ),
    }
    print(
        f"one engine's capacity {cap:.1f} req/s; cluster rate {rate:.1f} calls/s "
        f"({a.load} x {a.replicas} x capacity); load average {os.getloadavg()[0]:.2f}"
    )
    rows = []
    for name in [c for c in a.cases.split(",") if c]:
        n, args = cases[name]
        r = child([*args, *base], a.timeout)
        r.update(case=name, planned_calls=n)
        calls = r.get("calls") or n
        r["calls_per_s"] = calls / r["wall_s"] if r.get("wall_s") else None
        rows.append(r)
        cps = "-" if r["calls_per_s"] is None else f"{r['calls_per_s']:,.0f}"
        print(
            f"{name:9s} calls={calls:>7} wall={r.get('wall_s') or 0:7.2f}s calls/s={cps:>7} "
            f"rss={r.get('rss_mib') or 0:6.0f}MiB verdict={r.get('verdict')} "
            f"{r.get('error', '')}"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
